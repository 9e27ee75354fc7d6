"""One rank's exchange of a model's gradients, bucket by bucket: the quantized parameters
through :mod:`terngrad.comm.exchanges.exchange` (with worker-side error feedback), the
full-precision ones by all-reduce; skipped steps, the generator, and its part of the state a
checkpoint keeps (the rest, shared with FSDP's reduce-scatter:
:mod:`terngrad.comm.rank.rank_state`).

The DDP hook (:mod:`terngrad.comm.front.hook`) and the custom-loop
:class:`~terngrad.comm.Synchronizer` both run on a :class:`Reducer`. Full precision keeps the
parameters' dtype (:mod:`terngrad.comm.rank.full_precision`).
"""

from __future__ import annotations

import contextlib
import datetime
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from terngrad.comm.exchanges.link import Link
from terngrad.comm.exchanges.topologies import make_exchange
from terngrad.comm.rank import full_precision, saved_state
from terngrad.comm.rank.full_precision import Deferred
from terngrad.comm.rank.momentum import check_local_variance_entry
from terngrad.comm.rank.plans import BucketPlan, Planner, full_precision_names, gather, scatter
from terngrad.comm.rank.policy import AutoPolicy, Estimate
from terngrad.comm.rank.rank_state import (
    RankState,
    check_saved_rank_state,
    resolve_timeout,
    twin_group,
)
from terngrad.comm.spec.options import Options


def _timeout(seconds: float | None) -> datetime.timedelta | None:
    return None if seconds is None else datetime.timedelta(seconds=seconds)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s generator: ``seed * 1_000_003 + rank`` (mod 2**63)."""
    return (seed * 1_000_003 + rank) % 2**63


def check_own(state: dict[str, Any], kind: str, generator: torch.Tensor | None) -> None:
    """Refuse a saved state whose :class:`Reducer` entries are missing or malformed: the
    generator's (of the form of ``generator``, this rank's, where known), the server's
    residuals, the counters."""
    if generator is not None:
        saved_state.generator(state, kind, generator)
    found = saved_state.entry(state, "server_residuals", dict, "a dict of tensors", kind)
    saved_state.tensors(found, "server_residuals", kind)
    saved_state.counters(state, kind)


def check_hook_state(
    state: Any,
    config: dict[str, Any],
    rank: int,
    sizes: Mapping[str, int],
    excluded: set[str],
    variance: bool,
) -> None:
    """The one check of a saved hook state (:meth:`State.state_dict`) against the hook that
    would load it — its ``config``, ``rank``, the ``sizes`` of the parameters it exchanges
    (residuals only of those not ``excluded``, kept in full precision), whether its optimizer
    measures a ``variance`` on each rank — without the hook: what
    :meth:`State.load_state_dict` checks, in its words; the trainer's launcher runs it on a
    checkpoint before any worker starts."""
    residuals = {name: n for name, n in sizes.items() if name not in excluded}
    check_saved_rank_state(
        state, Reducer.kind, Reducer.state_format, residuals, config, rank,
        lambda s: check_own(s, Reducer.kind, torch.Generator().get_state()),
    )  # fmt: skip
    check_local_variance_entry(state, variance, sizes)


class Reducer(RankState):
    """The exchange of ``params`` (name, parameter; those that require gradients) of one rank,
    configured by ``options``; ``last_layer``: the names ``quantize_last=False`` keeps in full
    precision. Needs ``torch.distributed`` initialised: it makes its own process group
    (``group``: use this one instead) and checks that every rank configured it alike (a
    collective). ``estimate``: the link and codec speeds ``policy="auto"`` decides from,
    instead of measuring them."""

    def __init__(
        self,
        options: Options,
        params: Sequence[tuple[str, torch.Tensor]],
        last_layer: set[str],
        *,
        estimate: Estimate | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "terngrad needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) first (torchrun sets its environment)"
            )
        params = [(name, p) for name, p in params if p.requires_grad]
        if not params:
            raise ValueError("the model has no parameters that require gradients")
        device = params[0][1].device
        # unset: the default group's timeout (torch's new_group would take its own default, 30
        # minutes for gloo); a given group keeps its own. Either way state.options says which.
        options = resolve_timeout(options, group)
        self.timeout = options.timeout
        if group is None:
            group = dist.new_group(backend=dist.get_backend(), timeout=_timeout(options.timeout))
        excluded = full_precision_names(params, last_layer, options)
        super().__init__(options, Link(group), device, params, excluded)
        #: a second group, counted with the first, for the full-precision tensors' all-reduce
        #: that runs while the last bucket's quantized exchange does
        self.side = Link(twin_group(group, self.timeout), counter=self.link.counter)
        self.exchange = make_exchange(
            options.topology, self.quantizer, self.link, options.exchange_settings, self.kernels
        )
        self.generator = torch.Generator(device=device).manual_seed(
            rank_seed(options.seed, self.link.rank)
        )
        #: ``policy="auto"``: the agreed measurements and the choice per bucket (else None)
        self.auto = (
            AutoPolicy.agreed(group, self.kernels, self.quantizer, device, options.topology,
                              estimate)
            if options.policy == "auto"
            else None
        )  # fmt: skip
        keep = self.auto.keep_full_precision if self.auto else None
        self.planner = Planner(params, excluded, self.quantizer.bucket_size, keep)
        self._step_skipped = False
        #: float32 room for a bucket's quantized elements where they are not the whole float32
        #: buffer: gathered here, decoded here, scattered back (no allocation per bucket)
        self._scratch = torch.empty(0)
        #: ``fuse_buckets``: the step's buckets held until its last, and per dtype the room
        #: they are exchanged in together
        self._held: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []
        self._fused: dict[torch.dtype, torch.Tensor] = {}
        #: whether the last finished step had a non-finite gradient on some rank (then it
        #: was zeroed on every rank: skip ``optimizer.step()``)
        self.last_step_skipped = False

    @property
    def step_skipped(self) -> bool:
        """Some bucket of the step in progress found a non-finite gradient."""
        return self._step_skipped

    # --- a step

    def reduce_bucket(
        self,
        buffer: torch.Tensor,
        params: Sequence[torch.Tensor],
        deferred: Deferred | None = None,
        last: bool = False,
    ) -> bool:
        """Average ``buffer`` (the flat gradients of ``params``, in order) over all ranks, in
        place: its quantized parameters now; its full-precision ones now too, or, given a
        ``deferred`` list, appended to it — and with the step's ``last`` bucket, all the
        deferred ones in one all-reduce
        (:func:`~terngrad.comm.rank.full_precision.start_deferred`) while this bucket's
        quantized exchange runs. Returns True if some rank's gradient was not finite: then the
        buffer is zeroed (the deferred ones are the caller's to zero)."""
        with self.counters.timed():
            if self.counters.steps < self.options.full_precision_steps:
                return self._reduce_full_precision(buffer)
            if self.options.fuse_buckets and deferred is not None:
                return self._reduce_fused(buffer, params, deferred, last)
            return self._reduce_bucket(buffer, self.planner.plan(params), deferred, last)

    def _reduce_fused(self, buffer: torch.Tensor, params, deferred: Deferred, last: bool) -> bool:
        """``fuse_buckets``: hold the step's buckets until its last, then exchange them as one
        bucket per dtype, in the order DDP handed them over, and write the means back."""
        self._held.append((buffer, tuple(params)))
        if not last:
            return False
        held, self._held = self._held, []
        by_dtype: dict[torch.dtype, list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]] = {}
        for buf, ps in held:
            by_dtype.setdefault(buf.dtype, []).append((buf, ps))
        fused, skipped = [], False
        for k, members in enumerate(by_dtype.values()):
            buffers = [buf for buf, _ in members]
            flat = buffers[0] if len(buffers) == 1 else self._fused_room(buffers)
            plan = self.planner.plan([p for _, ps in members for p in ps])
            skipped |= self._reduce_bucket(flat, plan, deferred, k == len(by_dtype) - 1)
            fused.append((flat, buffers))
        for flat, buffers in fused:  # after the last: the deferred means are written then
            if len(buffers) > 1:
                for buf, part in zip(buffers, flat.split([b.numel() for b in buffers]),
                                     strict=True):  # fmt: skip
                    buf.copy_(part)
        return skipped

    def _fused_room(self, buffers: list[torch.Tensor]) -> torch.Tensor:
        """``buffers`` (one dtype) concatenated into this dtype's fused scratch (grown to the
        largest step seen)."""
        numel, first = sum(b.numel() for b in buffers), buffers[0]
        room = self._fused.get(first.dtype)
        if room is None or room.numel() < numel or room.device != first.device:
            room = self._fused[first.dtype] = torch.empty(numel, dtype=first.dtype,
                                                          device=first.device)  # fmt: skip
        flat = room[:numel]
        torch.cat(buffers, out=flat)
        return flat

    def _reduce_bucket(self, buffer: torch.Tensor, plan: BucketPlan, deferred, last) -> bool:
        skipped = False
        now = bool(plan.excluded) and (deferred is None or plan.full_precision)
        if plan.excluded and not now:
            deferred.append((buffer, plan))
        pending = full_precision.start_deferred(self.side, deferred) if last and deferred else None
        try:
            skipped = self._reduce_now(buffer, plan, now)
        except BaseException:
            if pending is not None:  # its own failure, if any, is the same one: keep the first
                with contextlib.suppress(Exception):
                    pending.finish()
            raise
        if pending is not None:
            skipped |= pending.finish()
        self._step_skipped |= skipped
        return skipped

    def _reduce_now(self, buffer: torch.Tensor, plan: BucketPlan, now: bool) -> bool:
        """The bucket's quantized parameters, and its full-precision ones if ``now``."""
        skipped = False
        if now:
            exact = full_precision.mean(self.link, gather(buffer, plan.excluded))
            skipped = not bool(torch.isfinite(exact).all())
        if plan.layout.numel and not skipped:
            direct = plan.whole and buffer.dtype == torch.float32  # in place in the bucket
            flat = buffer if direct else gather(buffer, plan.quantized, self._room(plan, buffer))
            if self.memory is not None:
                flat = self.memory.compensate(plan.names, plan.sizes, flat)
            result = self.exchange.reduce(
                flat,
                plan.layout,
                self.draws(self.counters.steps, parts=plan.indices),
                self.generator,
                key=plan.names,
                out=buffer if direct else flat if self.memory is None else None,
                own=self.memory is not None,
            )
            if result.mean is None:
                skipped = True
            else:
                if self.memory is not None:
                    self.memory.update(plan.names, plan.sizes, flat, result.own)
                if not direct:
                    scatter(buffer, plan.quantized, result.mean)
        if skipped:
            buffer.zero_()
        elif now:
            scatter(buffer, plan.excluded, exact)
        return skipped

    def _reduce_full_precision(self, buffer: torch.Tensor) -> bool:
        """A step of the full-precision warm-up (``options.full_precision_steps``): the whole
        bucket averaged by all-reduce in its dtype; error-feedback residuals are left as they
        are. True (and the buffer zeroed) if some rank's gradient was not finite."""
        averaged = full_precision.mean(self.link, buffer)
        skipped = not bool(torch.isfinite(averaged).all())
        if skipped:
            buffer.zero_()
        else:
            buffer.copy_(averaged)
        self._step_skipped |= skipped
        return skipped

    def _room(self, plan: BucketPlan, buffer: torch.Tensor) -> torch.Tensor:
        """The scratch for ``plan``'s quantized elements, on ``buffer``'s device (grown to the
        largest bucket seen)."""
        numel = plan.layout.numel
        if self._scratch.numel() < numel or self._scratch.device != buffer.device:
            self._scratch = torch.empty(numel, device=buffer.device)
        return self._scratch[:numel]

    def finish_step(self, warn: bool = True) -> None:
        """Close the step: counters, error feedback (kept, or dropped for a skipped step);
        a skipped step is warned of unless ``warn`` is False (a caller that says it itself)."""
        skipped, self._step_skipped = self._step_skipped, False
        self.counters.close_step(skipped)
        self.last_step_skipped = skipped
        if self.memory is not None and skipped:
            self.memory.discard()  # a skipped step leaves the residuals as they were
        elif self.memory is not None:
            self.memory.commit()
        if skipped and warn:
            warnings.warn(
                f"terngrad: step {self.counters.steps} had a NaN or Inf gradient on some rank; "
                "its gradient was zeroed on every rank (check state.last_step_skipped before "
                "optimizer.step())",
                RuntimeWarning,
                stacklevel=3,
            )

    def abandon_step(self) -> None:
        """A step failed part way (a collective failed): forget what it staged."""
        self._step_skipped = False
        self._held = []
        if self.memory is not None:
            self.memory.discard()

    # --- checkpoints: the generator, the server's residuals, the counters

    def _own_state(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "server_residuals": {k: v.clone() for k, v in self.exchange.server_residuals.items()},
            "counters": self.counters.state_dict(),
        }

    def _check_own(self, state: dict[str, Any]) -> None:
        check_own(state, self.kind, self.generator.get_state())

    def _load_own(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.exchange.server_residuals = {
            k: v.clone() for k, v in state["server_residuals"].items()
        }
        self.counters.load_state_dict(state["counters"])
