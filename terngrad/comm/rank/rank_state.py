"""One rank's exchange state, as the DDP reducer (:class:`~terngrad.comm.rank.reducer.Reducer`) and
FSDP's reduce-scatter (:class:`terngrad.fsdp.State`) both keep it: the options made concrete
(quantizer, kernels), the counted link, error-feedback residuals by parameter name, step and
byte counters, the configuration every rank agreed on (:mod:`terngrad.comm.rank.agreement`), the
random streams of its draws, and the part of a ``state_dict`` they share — format,
configuration, rank, residuals — with the checks a saved state passes before it loads.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from terngrad.comm.exchanges.link import Link
from terngrad.comm.rank import saved_state
from terngrad.comm.rank.agreement import check_same_config, check_saved_config, exchange_config
from terngrad.comm.rank.memory import ErrorFeedback
from terngrad.comm.rank.stats import Counters, Stats, Timing
from terngrad.comm.spec.options import MAX_TIMEOUT, Options
from terngrad.kernels import Streams, resolve, stream_seed


def group_timeout(group: dist.ProcessGroup | None = None) -> float | None:
    """The seconds ``group``'s collectives wait (default: the default group's, as
    ``init_process_group(timeout=...)`` set it), read from its backends' options (kept current
    by ``set_timeout``), at most :data:`~terngrad.comm.spec.options.MAX_TIMEOUT`; where torch
    does not say, its default for the group's backend; ``None`` where even that cannot be read."""
    with contextlib.suppress(Exception):
        group = group or dist.distributed_c10d._get_default_group()
        for device in group._device_types:
            with contextlib.suppress(Exception):
                seconds = group._get_backend(device).options._timeout.total_seconds()
                if seconds > 0:
                    return min(seconds, MAX_TIMEOUT)
    with contextlib.suppress(Exception):
        default = dist.distributed_c10d._get_default_timeout(dist.get_backend(group))
        return min(default.total_seconds(), MAX_TIMEOUT)
    return None


def resolve_timeout(options: Options, group: dist.ProcessGroup | None = None) -> Options:
    """``options`` with its ``timeout`` made concrete: unset, the default group's; with a
    ``group`` given, that group's own (its collectives wait that long whatever was asked)."""
    timeout = group_timeout(group) if group is not None else options.timeout or group_timeout()
    return options if timeout == options.timeout else options.replace(timeout=timeout)


def twin_group(group: dist.ProcessGroup, timeout: float | None) -> dist.ProcessGroup:
    """A new process group of ``group``'s ranks and backend, whose collectives wait ``timeout``
    seconds (give it resolved: :func:`resolve_timeout`; ``None`` would be torch's default, 30
    minutes for gloo, not the default group's) — a collective on ``group``'s ranks alone (other
    groups' ranks may make their own twins meanwhile: the nodes' exchanges across nodes)."""
    return dist.new_group(
        ranks=dist.get_process_group_ranks(group),
        backend=dist.get_backend(group),
        timeout=None if timeout is None else datetime.timedelta(seconds=timeout),
        use_local_synchronization=True,
    )


def check_saved_rank_state(
    state: Any,
    kind: str,
    state_format: int,
    sizes: Mapping[str, int],
    config: dict[str, Any],
    rank: int,
    check_own: Callable[[dict[str, Any]], None],
) -> None:
    """The one check of a saved :class:`RankState` (any subclass: ``kind``, ``state_format``,
    its own entries checked by ``check_own``) against the rank that would load it: its
    configuration ``config``, its ``rank``, its residuals' ``sizes``. Refuses, in one
    ``ValueError`` line naming what is wrong, before anything is taken; run by
    :meth:`RankState.check_state` and, on a checkpoint before any worker starts, by the
    trainer's launcher."""
    saved_state.rank_state(state, kind, state_format, sizes)
    check_own(state)
    check_saved_config(config, state["config"])
    if state["rank"] != rank:
        raise ValueError(
            f"this {kind} belongs to rank {state['rank']}, not rank {rank}: load each rank's own"
        )


class RankState:
    """The exchange state of one rank on ``link``, configured by ``options``: ``params`` (name,
    parameter) those exchanged, on ``device``; ``excluded`` the names kept in full precision;
    ``config``, entries added to the configuration the ranks compare and a saved state must
    match. Checks that every rank configured it alike (a collective).

    A subclass saves its own part of the state in :meth:`_own_state` and loads it in
    :meth:`_load_own`; :attr:`kind` names its saved states in errors."""

    #: what a saved state of this class is called where one is refused
    kind = "terngrad hook state"
    #: the version of this class's saved states: one of another version is refused
    state_format = 1

    def __init__(
        self,
        options: Options,
        link: Link,
        device: torch.device,
        params: Sequence[tuple[str, torch.Tensor]],
        excluded: set[str],
        **config: Any,
    ) -> None:
        self.options = options
        self.quantizer = options.make_quantizer()
        self.kernels = resolve(options.kernels, device)
        self.link = link
        #: the parameters whose gradients travel in full precision
        self.excluded = excluded
        self.memory = ErrorFeedback() if options.error_feedback else None
        self.counters = Counters(link.counter)
        self._sizes = {name: p.numel() for name, p in params if name not in excluded}
        self.config = {
            **exchange_config(options, self.quantizer, self.kernels, excluded, link.size, params),
            **config,
        }
        check_same_config(link, self.config)

    @property
    def stats(self) -> Stats:
        """Bytes this rank handed to the collectives, steps and skipped steps."""
        return self.counters.stats()

    @property
    def timing(self) -> Timing:
        """Seconds spent in the exchanges, and how much of it in collectives."""
        return self.counters.timing()

    def draws(self, *key: int, parts: Iterable[int]) -> Streams | None:
        """The random streams of one exchange: part ``p`` (a parameter, a segment) of this rank
        draws from ``stream_seed(seed, rank, *key, p)``; ``None`` for a deterministic
        quantizer."""
        if not self.quantizer.stochastic:
            return None
        rank, seed = self.link.rank, self.options.seed
        return Streams(tuple(stream_seed(seed, rank, *key, p) for p in parts))

    # --- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: its configuration, error-feedback residuals and what
        :meth:`_own_state` adds (save one per rank)."""
        return {
            "format": self.state_format,
            "config": self.config,
            "rank": self.link.rank,
            "residuals": self.memory.state_dict() if self.memory else {},
            **self._own_state(),
        }

    def residual_sizes(self) -> dict[str, int]:
        """The error-feedback residuals a state of this rank may hold: their names, and the
        elements of each (flat float32)."""
        return dict(self._sizes)

    def check_state(self, state: dict[str, Any]) -> None:
        """Refuse, in one ``ValueError`` line naming what is wrong, a ``state`` this rank cannot
        load: its entries, their types, its tensors' shapes and dtypes, its configuration, its
        rank."""
        check_saved_rank_state(state, self.kind, self.state_format, self.residual_sizes(),
                               self.config, self.link.rank, self._check_own)  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of the same rank and configuration. Everything is checked
        before anything is taken (:meth:`check_state`)."""
        self.check_state(state)
        if self.memory is not None:
            self.memory.load_state_dict(state["residuals"])
        self._load_own(state)

    def _own_state(self) -> dict[str, Any]:
        """The subclass's entries of :meth:`state_dict`."""
        raise NotImplementedError

    def _check_own(self, state: dict[str, Any]) -> None:
        """Refuse, in one ``ValueError`` line, a ``state`` whose subclass's entries are missing
        or malformed (:mod:`terngrad.comm.rank.saved_state`)."""
        raise NotImplementedError

    def _load_own(self, state: dict[str, Any]) -> None:
        """Load the subclass's entries of a checked ``state``."""
        raise NotImplementedError
