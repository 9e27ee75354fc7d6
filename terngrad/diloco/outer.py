"""The :class:`DiLoCo` class: an outer step every ``H`` inner steps (the algorithm, and the
two ways past the plain form: :mod:`terngrad.diloco`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad.comm.errors import CollectiveFailed
from terngrad.comm.rank.agreement import differing_ranks
from terngrad.comm.spec.options import Options
from terngrad.diloco.auto import AutoLocalSteps
from terngrad.diloco.model import check_owner, outer_exchange, plain_module
from terngrad.diloco.overlap import InFlight
from terngrad.diloco.state import KIND, STATE_FORMAT, check_state
from terngrad.diloco.stats import DiLoCoStats
from terngrad.local_steps import (
    LOCAL_STEPS,
    LocalSteps,
    auto_h_choices,
    local_of,
    outer_sgd,
    replicas_apart,
)
from terngrad.quantize import Quantizer
from terngrad.util.state_kinds import check_optimizer, on_meta

__all__ = ["DiLoCo", "DiLoCoStats"]


class DiLoCo:
    """Local steps on ``model`` (a module, or a DDP model whose every-step all-reduce is then
    replaced by a no-op hook) with ``inner_optimizer`` (owning every trainable parameter of
    the model, and no other), an outer step every ``local_steps`` calls of :meth:`step`.

    ``method``: a method (a name, ``"terngrad-local16"``, or a
    :class:`~terngrad.comm.spec.methods.Method`), whose local steps and exchange this runs;
    the keywords below are put over it by the one rule (:mod:`terngrad.comm.spec.over`): one
    the method leaves at its default may be given, one it sets otherwise is refused in one
    line (a method without local steps gives the exchange, ``local_steps`` the ``H``).
    ``local``: a ready :class:`~terngrad.comm.spec.local.LocalSteps`, in place of its keywords.
    A keyword left out (``None``) is the method's, else :class:`LocalSteps`' default.
    ``local_steps``: ``H`` (by default :data:`~terngrad.local_steps.LOCAL_STEPS`), or
    ``"auto"`` (chosen at the :data:`AUTO_PROBE_STEPS`-th inner
    step so that the exchange takes at most ``max_comm_share`` of the time, from
    ``auto_choices``, by default 1 to :data:`AUTO_MAX_LOCAL_STEPS`);
    ``overlap``: the outer exchange in the background, its update one outer step late;
    ``across_nodes``: ``model`` is DDP over the ranks of one node, each node one replica, the
    outer exchange across nodes (:mod:`terngrad.comm.front.nodes`);
    ``quantizer``, ``topology`` and any other keyword: the exchange of the pseudo-gradients,
    as for :func:`terngrad.ddp.register` (no error feedback by default, as there), or
    ``options``, a ready :class:`~terngrad.comm.Options`;
    ``outer_lr``, ``outer_momentum``, ``nesterov``: the outer SGD
    (:func:`~terngrad.local_steps.outer_sgd`: Nesterov's by default, plain SGD at
    ``outer_momentum=0``). Every rank must make it
    alike (checked, in one line naming the ranks, before any exchange). Rank 0's parameters
    and buffers are every replica's start (broadcast here, as DDP does).
    """

    def __init__(
        self,
        model: nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        local_steps: int | str | None = None,
        quantizer: str | Quantizer = "terngrad",
        topology: str = "sharded",
        *,
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        nesterov: bool | None = None,
        overlap: bool | None = None,
        max_comm_share: float | None = None,
        across_nodes: bool | None = None,
        auto_choices: Sequence[int] | None = None,
        options: Options | None = None,
        local: LocalSteps | None = None,
        **settings: Any,
    ) -> None:
        module = plain_module(model)
        keywords = dict(local_steps=local_steps, outer_lr=outer_lr, overlap=overlap,
                        outer_momentum=outer_momentum, nesterov=nesterov,
                        max_comm_share=max_comm_share, across_nodes=across_nodes)  # fmt: skip
        if local is not None:
            if any(v is not None for v in keywords.values()):
                raise ValueError("give DiLoCo local=LocalSteps(...) or its keywords, not both")
            keywords = local.keywords()
        #: the settings of the local steps (``local.every``: ``H`` as given; ``"auto"`` stays)
        self.local = local = local_of(settings, LOCAL_STEPS, **keywords)
        choices = auto_h_choices(auto_choices)
        check_owner(module, inner_optimizer)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "terngrad.diloco needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) first (torchrun sets its environment)"
            )
        mine = {**local.keywords(), "auto_choices": choices}
        problems = differing_ranks(mine)
        if problems:
            raise ValueError(
                "terngrad.diloco: the ranks made DiLoCo with different settings (compared with "
                "rank 0) — " + " | ".join(problems)
            )
        self.model, self.module, self.inner_optimizer = model, module, inner_optimizer
        #: ``H``: an integer, or ``"auto"`` until the :data:`AUTO_PROBE_STEPS`-th inner step
        self.local_steps: int | str = local.every
        self.auto_choices = choices
        #: the exchange of the pseudo-gradients (rank 0's parameters broadcast when made)
        self.exchange = outer_exchange(model, module, local.across_nodes, quantizer, topology,
                                       options=options, **settings)  # fmt: skip
        self.params = self.exchange.params
        self._buffers = [b for b in module.buffers() if b.is_floating_point()]
        self.exchange.from_first(module.buffers())
        #: the outer model: where every replica restarts from
        self.anchor = [p.detach().clone() for p in self.params]
        for a in self.anchor:
            a.requires_grad_(True)
        self.outer_optimizer = outer_sgd(self.anchor, local)
        self.inner_steps = self.outer_steps = self.skipped_outer_steps = 0
        #: ``local_steps="auto"``: what it measured (seconds of an inner step and of an outer
        #: exchange, agreed over the ranks) and chose
        self.auto: dict[str, float] | None = None
        self._chooser = (
            AutoLocalSteps(self.exchange, local.max_comm_share, choices)
            if local.every == "auto"
            else None
        )
        self._in_flight = InFlight(self.exchange) if local.overlap else None
        #: overlap: where each replica restarted (the anchor moved by its own Δ in flight)
        self._starts: list[torch.Tensor] | None = None

    @property
    def stats(self) -> DiLoCoStats:
        flight = self._in_flight
        flying = flight is not None and flight.pending
        s = flight.stats_before if flying else self.exchange.stats
        node = flight.node_bytes_before if flying else self.exchange.node_bytes_sent
        return DiLoCoStats(
            self.inner_steps, self.outer_steps, self.skipped_outer_steps, s.bytes_sent,
            s.bytes_received, s.messages_sent, self.local_steps, node,
        )  # fmt: skip

    @property
    def in_sync(self) -> bool:
        """Whether every replica is the anchor now: before the first inner step, and just
        after an outer step (with ``overlap``, only after :meth:`finish`: between, each
        replica also holds its own last ``H`` steps)."""
        return self.inner_steps == 0 or (
            self._starts is None
            and self.local_steps != "auto"
            and self.inner_steps % self.local_steps == 0
        )

    @contextlib.contextmanager
    def consensus(self) -> Iterator[None]:
        """The anchor in the model's parameters for the block (an evaluation), the replicas'
        own put back after it: the one model every rank agrees on. A no-op when
        :attr:`in_sync`; with ``overlap``, the anchor lacks the update in flight."""
        if self.in_sync:
            yield
            return
        with torch.no_grad():
            own = [p.detach().clone() for p in self.params]
            for p, a in zip(self.params, self.anchor, strict=True):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, mine in zip(self.params, own, strict=True):
                    p.copy_(mine)

    #: an inner step is never skipped (a non-finite replica is caught at the outer step)
    last_step_skipped = False

    @torch.no_grad()
    def step(self) -> bool:
        """Count an inner step (call it after ``inner_optimizer.step()``); every
        ``local_steps``-th, the outer step. Returns whether this was an outer step."""
        self.inner_steps += 1
        if self.local_steps == "auto":
            assert self._chooser is not None
            if not self._chooser.tick(self.inner_steps):
                return False
            self.auto = self._chooser.choose()
            self.local_steps = int(self.auto["local_steps"])
        if self.inner_steps % self.local_steps:
            return False
        starts = self.anchor if self._starts is None else self._starts
        deltas = [s - p.detach() for s, p in zip(starts, self.params, strict=True)]
        self.outer_steps += 1
        if not self.local.overlap:
            with self._named_outer_step():
                skipped = self.exchange.average(deltas, warn=False)
            self._outer_update(deltas, skipped, self.inner_steps)
            for p, a in zip(self.params, self.anchor, strict=True):
                p.copy_(a)
            self._average_buffers()
            return True
        assert self._in_flight is not None
        if self._in_flight.pending:  # Δ_{k-1}, averaged while the last H steps ran
            with self._named_outer_step():
                landed, skipped = self._in_flight.land()
            self._outer_update(landed, skipped, self.inner_steps - int(self.local_steps))
            if skipped:  # a rank's Δ_{k-1} was not finite, and this window started from it
                self._restart_from_anchor()
                return True
        sent = [d.clone() for d in deltas]
        self._restart_with_own(sent)
        self._average_buffers()
        self._in_flight.launch(deltas, sent)
        return True

    def finish(self) -> None:
        """Call it after the last :meth:`step`. With ``overlap``: wait for the exchange in
        flight and apply its update, so that the model holds every outer step (the replicas
        then restart from the anchor, bitwise equal, or, between outer steps, keep the steps
        since on it). A ``RuntimeWarning`` if training ended between two outer steps (or before
        ``"auto"`` chose ``H``): the replicas then differ by their own last steps."""
        if self._in_flight is not None and self._in_flight.pending:
            self._land_last()
        if not self.in_sync:
            warnings.warn(replicas_apart(self.inner_steps, self.local_steps), RuntimeWarning,
                          stacklevel=2)  # fmt: skip

    def _land_last(self) -> None:
        """Overlap: the exchange in flight lands and its update is applied (:meth:`finish`)."""
        assert self._in_flight is not None
        with self._named_outer_step():
            landed, skipped = self._in_flight.land()
        with torch.no_grad():
            h = int(self.local_steps)  # (an exchange in flight: H was chosen)
            self._outer_update(landed, skipped, self.inner_steps // h * h)
            starts = self._starts or self.anchor
            self._starts = None
            for p, a, s in zip(self.params, self.anchor, starts, strict=True):
                if self.in_sync:
                    p.copy_(a)
                else:  # the inner steps since the last outer step kept, on the new anchor
                    p.add_(a - s)

    def wait(self) -> None:
        """With ``overlap``: wait until the exchange in flight has arrived, without applying it
        (that stays for the next outer step): call it before a collective of one's own on the
        exchange's process group, which the exchange's thread would otherwise race."""
        if self._in_flight is not None:
            self._in_flight.wait()

    def _outer_update(self, deltas: list[torch.Tensor], skipped: bool, taken_at: int) -> None:
        """The outer SGD steps the anchor along the averaged ``deltas`` (or, when a rank's
        were not finite, stays: counted, and warned of naming ``taken_at``, the inner step the
        pseudo-gradients were taken at)."""
        if skipped:
            self.skipped_outer_steps += 1
            warnings.warn(
                f"terngrad: the outer step of inner step {taken_at} was skipped: a rank's "
                "pseudo-gradient was NaN or Inf; the anchor stays and every replica restarts "
                f"from it ({self.skipped_outer_steps} skipped so far)",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        for a, d in zip(self.anchor, deltas, strict=True):
            a.grad = d
        self.outer_optimizer.step()

    def _probe(self) -> dict[str, list[float]]:
        """``"auto"`` before it chose: the steps timed so far, for a saved state."""
        assert self._chooser is not None
        return {"probe_gaps": list(self._chooser.gaps)}

    @contextlib.contextmanager
    def _named_outer_step(self) -> Iterator[None]:
        """A failed collective (:class:`~terngrad.comm.errors.CollectiveFailed`) names the
        outer step it failed in."""
        try:
            yield
        except CollectiveFailed as exc:
            raise CollectiveFailed(f"{exc} (outer step {self.outer_steps})") from exc

    def _restart_from_anchor(self) -> None:
        """Overlap, after a skipped outer step: each replica restarted from ``anchor − Δ_r``
        with its own ``Δ_r`` of the skipped step, which is not finite on some rank, and so is
        every pseudo-gradient taken from there. Every replica restarts from the anchor instead
        (this window's steps dropped, nothing sent this outer step): the next window is clean
        on every rank."""
        for p, a in zip(self.params, self.anchor, strict=True):
            p.copy_(a)
        self._starts = None
        self._average_buffers()

    def _restart_with_own(self, sent: list[torch.Tensor]) -> None:
        """Overlap: each replica restarts from the anchor moved by its own pseudo-gradient in
        flight, ``θ_r = anchor − Δ_r`` (its last ``H`` steps kept until their average lands:
        restarting from the bare anchor would have every rank redo them, and the average
        count them twice); the next pseudo-gradient is taken from there. A ``Δ_r`` that is not
        finite (the exchange will skip this outer step on every rank) is not kept: this replica
        restarts from the bare anchor, so that no NaN reaches its next steps."""
        finite = bool(torch.stack([torch.isfinite(d).all() for d in sent]).all())  # one sync
        for p, a, d in zip(self.params, self.anchor, sent, strict=True):
            p.copy_(a - d if finite else a)
        self._starts = [p.detach().clone() for p in self.params]

    def _check_parts(self, state: dict[str, Any]) -> None:
        """The parts of ``state`` their owners load: the exchange's state, and each optimizer's
        loaded as torch loads it into a twin on the meta device (each buffer of its
        parameter's shape, each hyperparameter of this one's kind); one ``ValueError`` line."""
        self.exchange.reducer.check_state(state["exchange"])
        for key, optimizer in (("outer_optimizer", self.outer_optimizer),
                               ("inner_optimizer", self.inner_optimizer)):  # fmt: skip
            try:
                check_optimizer(key.replace("_", " "), state[key], on_meta(optimizer),
                                any_device=True)  # fmt: skip
            except ValueError as exc:
                raise ValueError(f"this {KIND}: {exc}") from None

    def _average_buffers(self) -> None:
        """Every floating-point buffer replaced by its mean over the replicas (an fp32
        all-reduce, counted with the exchange's bytes); integer buffers (batch counts) are left
        as they are."""
        self.exchange.average_floats(self._buffers)

    # --- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: the anchor, the outer optimizer, the step counts, the
        exchange's (generator, error-feedback residuals, counters) and this rank's inner
        optimizer (each rank's own moments: a checkpoint that keeps rank 0's optimizer alone
        would give every rank rank 0's). Save one per rank. With ``overlap``, an exchange in
        flight is not waited for: its input (this rank's pseudo-gradient) and the exchange's
        state before it are saved, and :meth:`load_state_dict` sends it again."""
        flight = self._in_flight
        pending = flight is not None and flight.pending
        return {
            "format": STATE_FORMAT,
            "local_steps": self.local_steps,
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "skipped_outer_steps": self.skipped_outer_steps,
            "anchor": [a.detach().clone() for a in self.anchor],
            "outer_optimizer": self.outer_optimizer.state_dict(),
            "exchange": flight.exchange_state if pending else self.exchange.state_dict(),
            "inner_optimizer": self.inner_optimizer.state_dict(),
            "overlap": self.local.overlap,
            "pending": [d.clone() for d in flight.sent] if pending else None,
            "auto": self.auto if self.local_steps != "auto" else self._probe(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of the same rank and settings (on every rank at once: an
        exchange that was in flight is sent again); ``ValueError`` with one line naming what
        does not fit."""
        group = self.outer_optimizer.param_groups[0]
        check_state(state, [tuple(a.shape) for a in self.anchor], self.local_steps,
                    self.local.overlap, self.auto_choices,
                    {k: group[k] for k in ("lr", "momentum", "nesterov")})  # fmt: skip
        self._check_parts(state)  # everything checked before anything is replaced
        saved_h = state["local_steps"]
        if self._in_flight is not None and self._in_flight.pending:
            self._in_flight.land()  # (the replaced run's exchange lands before it is dropped)
        self.exchange.load_state_dict(state["exchange"])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
        with torch.no_grad():
            for a, saved in zip(self.anchor, state["anchor"], strict=True):
                a.copy_(saved)
        self.inner_steps = int(state["inner_steps"])
        self.outer_steps = int(state["outer_steps"])
        self.skipped_outer_steps = int(state["skipped_outer_steps"])
        self.local_steps, self.auto = saved_h, state.get("auto")
        if saved_h == "auto":  # (the steps timed before the save count: H chosen at the
            assert self._chooser is not None  # same inner step as in a straight run)
            self._chooser.restore((self.auto or {}).get("probe_gaps", []))
            self.auto = None
        self._starts = None
        if state["pending"] is not None:
            sent = [t.clone() for t in state["pending"]]
            with torch.no_grad():
                if self.local_steps != "auto" and self.inner_steps % self.local_steps == 0:
                    self._restart_with_own(sent)  # (a replica saved just after its outer step)
                else:
                    self._starts = [a.detach() - d for a, d in zip(self.anchor, sent, strict=True)]
            assert self._in_flight is not None
            self._in_flight.launch([d.clone() for d in sent], sent)
