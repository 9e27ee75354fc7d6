"""The DDP communication hook and its state.

``register(ddp_model, quantizer="terngrad", topology="sharded", **options)`` installs a standard
``register_comm_hook`` hook. For each DDP bucket it

1. averages the quantized parameters through :mod:`terngrad.comm.exchange`, with one scale
   group per parameter (layer-wise scales, from the bucket's parameter boundaries), adding the
   worker-side error-feedback residual first when ``error_feedback=True``, and writes the mean
   into the bucket buffer in place (no second buffer of the bucket's size);
2. keeps the excluded parameters (the last layer and tensors under ``min_numel`` elements, by
   default) for the step's end: with the last bucket, one fp32 all-reduce of all of them in the
   model's parameter order (sums independent of DDP's bucket layout, so resumed runs are
   bitwise identical), after which every bucket's future completes.

The exchanges run on one worker thread per process, bucket after bucket in the order DDP hands
them over, which is the same on every rank, so the collectives line up across ranks however many
buckets there are; the hook returns a future at once and DDP's backward pass goes on meanwhile.
They use a process group of their own, so they never interleave with DDP's own collectives.
"""

from __future__ import annotations

import datetime
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from terngrad import quantize
from terngrad.comm.exchange import AGGREGATES, TOPOLOGIES, make_exchange
from terngrad.comm.link import Link
from terngrad.comm.memory import ErrorFeedback
from terngrad.comm.policy import Decision, Estimate, agree, decide, measure
from terngrad.kernels import KERNELS, Streams, resolve, stream_seed
from terngrad.quantize import Layout, Quantizer, SymmetricGrid

STATE_FORMAT = 1
POLICIES = ("quantize", "auto")


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s generator: ``seed * 1_000_003 + rank`` (mod 2**63)."""
    return (seed * 1_000_003 + rank) % 2**63


def last_layer_names(module: nn.Module) -> set[str]:
    """Names of the parameters of the last submodule (in definition order) that owns any:
    the classifier of the usual model."""
    owners = [
        (prefix, m)
        for prefix, m in module.named_modules()
        if next(m.parameters(recurse=False), None) is not None
    ]
    if not owners:
        return set()
    prefix, owner = owners[-1]
    return {f"{prefix}.{n}" if prefix else n for n, _ in owner.named_parameters(recurse=False)}


class CollectiveFailed(RuntimeError):
    """A collective of the exchange timed out or lost a peer: another rank died or hangs."""


@dataclass(frozen=True)
class Stats:
    """What one rank's exchanges did: bytes as handed to the collectives (see
    :mod:`terngrad.comm.link` for how each collective is counted), steps, skipped steps."""

    steps: int
    skipped_steps: int
    bytes_sent: int
    bytes_received: int
    last_step_bytes_sent: int
    last_step_bytes_received: int

    @property
    def bytes_sent_per_step(self) -> float:
        return self.bytes_sent / self.steps if self.steps else 0.0

    @property
    def bytes_received_per_step(self) -> float:
        return self.bytes_received / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class Timing:
    """Where one rank's exchange time went (wall clock, all steps so far): ``exchange_seconds``
    in the hook's work on buckets, ``collective_seconds`` of it inside collectives (waiting for
    the network and the other ranks), the rest — ``codec_seconds`` — encoding and decoding."""

    exchange_seconds: float
    collective_seconds: float

    @property
    def codec_seconds(self) -> float:
        return max(self.exchange_seconds - self.collective_seconds, 0.0)


@dataclass(frozen=True)
class _Plan:
    """How one bucket's flat buffer splits into quantized and fp32 parameters."""

    names: tuple[str, ...]  # quantized parameters, in buffer order
    indices: tuple[int, ...]  # their positions in the model's parameter list
    sizes: tuple[int, ...]
    quantized: tuple[tuple[int, int], ...]  # (offset, numel) in the buffer
    excluded: tuple[tuple[int, int], ...]
    excluded_indices: tuple[int, ...]  # the excluded parameters' positions in the model
    layout: Layout
    #: a bucket the auto policy keeps in fp32: all-reduced at once, never deferred
    fp32_bucket: bool = False

    @property
    def whole(self) -> bool:
        """The quantized parameters are the whole buffer."""
        return not self.excluded


def _gather(buffer: torch.Tensor, spans: tuple[tuple[int, int], ...]) -> torch.Tensor:
    return torch.cat([buffer[o : o + n] for o, n in spans]).to(torch.float32)


def _scatter(buffer: torch.Tensor, spans: tuple[tuple[int, int], ...], values: torch.Tensor):
    start = 0
    for o, n in spans:
        buffer[o : o + n].copy_(values[start : start + n])
        start += n


class HookState:
    """State of the terngrad exchange of one rank: quantizer, topology, error feedback,
    random generator, counters. Made by :func:`register` (DDP) or
    :class:`~terngrad.comm.Synchronizer` (custom loops).

    Options: ``error_feedback`` (worker-side residuals, default False), ``exclude_last`` (keep
    the last layer in fp32, default True), ``min_numel`` (tensors with fewer elements stay fp32,
    default 1024), ``aggregate`` ("requantize" or "fp16": how non-grid aggregates travel),
    ``seed`` (the random draws of rank r at step t for parameter p come from the stream
    ``stream_seed(seed, r, t, p)``, see :mod:`terngrad.kernels.random`; re-quantized
    aggregates draw from a generator seeded ``rank_seed(seed, r)``), ``kernels`` ("auto":
    the fused CPU kernels where numba is installed, else the torch reference; "numba";
    "torch"), ``policy`` ("quantize": every parameter not excluded is quantized; "auto":
    per DDP bucket, only where the measured link and codec speeds predict a faster exchange,
    see :mod:`terngrad.comm.policy`; ``estimate`` gives those speeds instead of measuring),
    ``group`` (the process group; default: a new group of all ranks), ``timeout`` (seconds a
    collective of that new group waits before failing with :class:`CollectiveFailed`;
    default: the default group's). Other keyword options go to ``quantize.get(quantizer, ...)``.
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, nn.Parameter]],
        last_layer: set[str],
        quantizer: str | Quantizer = "terngrad",
        topology: str = "sharded",
        *,
        error_feedback: bool = False,
        exclude_last: bool = True,
        min_numel: int = 1024,
        aggregate: str = "requantize",
        seed: int = 0,
        kernels: str = "auto",
        policy: str = "quantize",
        estimate: Estimate | None = None,
        group: dist.ProcessGroup | None = None,
        timeout: float | None = None,
        **quantizer_options: Any,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "terngrad needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) first (torchrun sets its environment)"
            )
        if isinstance(quantizer, Quantizer):
            if quantizer_options:
                raise ValueError("pass quantizer options to quantize.get, not with an instance")
            self.quantizer = quantizer
        else:
            self.quantizer = quantize.get(quantizer, **quantizer_options)
        if topology not in TOPOLOGIES:
            raise ValueError(
                f"unknown topology {topology!r}; choose one of: {', '.join(TOPOLOGIES)}"
            )
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        if isinstance(min_numel, bool) or not isinstance(min_numel, int) or min_numel < 0:
            raise ValueError(f"min_numel must be a non-negative integer, got {min_numel!r}")
        params = [(name, p) for name, p in named_parameters if p.requires_grad]
        if not params:
            raise ValueError("the model has no parameters that require gradients")
        if kernels not in KERNELS:
            raise ValueError(
                f"kernels must be one of {', '.join(map(repr, KERNELS))}, got {kernels!r}"
            )
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if policy == "auto" and not isinstance(self.quantizer, SymmetricGrid):
            raise ValueError(
                "policy='auto' predicts the exchange of the shared-grid quantizers (terngrad, "
                f"qsgd); {self.quantizer.name} has no such model: use policy='quantize'"
            )
        device = params[0][1].device
        self.kernels = resolve(kernels, device)
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if group is None:
            wait = None if timeout is None else datetime.timedelta(seconds=timeout)
            group = dist.new_group(backend=dist.get_backend(), timeout=wait)
        else:
            timeout = None  # a given group keeps its own timeout
        self.link = Link(group)
        self.timeout = timeout
        self.exchange = make_exchange(topology, self.quantizer, self.link, aggregate, self.kernels)
        self.topology, self.policy = topology, policy
        self.memory = ErrorFeedback() if error_feedback else None
        self._names = {id(p): name for name, p in params}
        self._index = {id(p): i for i, (_, p) in enumerate(params)}
        self.seed = seed
        self.excluded = {
            name
            for name, p in params
            if (exclude_last and name in last_layer) or p.numel() < min_numel
        }
        self.generator = torch.Generator(device=device).manual_seed(rank_seed(seed, self.link.rank))
        self.config = {
            "quantizer": self.quantizer.name,
            "quantizer_options": self.quantizer.options,
            "topology": topology,
            "error_feedback": bool(error_feedback),
            "aggregate": aggregate,
            "excluded": sorted(self.excluded),
            "seed": seed,
            "kernels": self.kernels.name,
            "policy": policy,
            "world_size": self.link.size,
            "parameters": [(name, tuple(p.shape), str(p.dtype)) for name, p in params],
        }
        self._check_same_config()
        #: auto policy: the measurements every rank agreed on, and the choice per bucket
        self.estimate: Estimate | None = None
        self.decisions: dict[tuple[str, ...], Decision] = {}
        if policy == "auto":
            self.estimate = (
                agree(estimate, self.link.group, device)
                if estimate is not None
                else measure(self.link.group, self.kernels, self.quantizer, device)
            )
        self._plans: dict[tuple[int, ...], _Plan] = {}
        self._steps = self._skipped_steps = 0
        self._exchange_seconds = 0.0
        self._step_skipped = False
        self.last_step_skipped = False
        self._step_start = (0, 0)
        self._last_step = (0, 0)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terngrad")
        # the DDP path's step in progress: buckets waiting for the step's end, fp32 tensors
        self._waiting: list[tuple[torch.Tensor, torch.futures.Future]] = []
        self._deferred: list[tuple[torch.Tensor, _Plan]] = []
        self._failed: BaseException | None = None

    # --- what users read

    @property
    def timing(self) -> Timing:
        """Seconds spent in the exchanges, and how much of it in collectives."""
        return Timing(self._exchange_seconds, self.link.counter.seconds)

    @property
    def stats(self) -> Stats:
        c = self.link.counter
        return Stats(
            steps=self._steps,
            skipped_steps=self._skipped_steps,
            bytes_sent=c.sent,
            bytes_received=c.received,
            last_step_bytes_sent=self._last_step[0],
            last_step_bytes_received=self._last_step[1],
        )

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: RNG, error-feedback residuals, counters (save one per rank)."""
        return {
            "format": STATE_FORMAT,
            "config": self.config,
            "rank": self.link.rank,
            "generator": self.generator.get_state(),
            "residuals": self.memory.state_dict() if self.memory else {},
            "server_residuals": {k: v.clone() for k, v in self.exchange.server_residuals.items()},
            "counters": {
                "steps": self._steps,
                "skipped_steps": self._skipped_steps,
                "bytes_sent": self.link.counter.sent,
                "bytes_received": self.link.counter.received,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of the same rank and configuration."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError("not a terngrad hook state (or one of another format version)")
        saved = {"policy": "quantize", **state["config"]}  # states saved before the option
        differences = _differences(self.config, saved)
        if differences:
            raise ValueError(
                "this hook state was saved with another configuration (saved value instead of "
                "this hook's): " + "; ".join(differences)
            )
        if state["rank"] != self.link.rank:
            raise ValueError(
                f"this hook state belongs to rank {state['rank']}, not rank {self.link.rank}"
            )
        self.generator.set_state(state["generator"])
        if self.memory is not None:
            self.memory.load_state_dict(state["residuals"])
        self.exchange.server_residuals = {
            k: v.clone() for k, v in state["server_residuals"].items()
        }
        counters = state["counters"]
        self._steps, self._skipped_steps = counters["steps"], counters["skipped_steps"]
        self.link.counter.sent = counters["bytes_sent"]
        self.link.counter.received = counters["bytes_received"]
        self._step_start = (self.link.counter.sent, self.link.counter.received)

    # --- the work

    def reduce_bucket(self, buffer: torch.Tensor, params: list[torch.Tensor]) -> bool:
        """Average ``buffer`` (the flat gradients of ``params``, in order) over all ranks, in
        place, fp32 parameters included (the path of :class:`~terngrad.comm.Synchronizer`,
        whose buckets never change). Returns True if some rank's gradient was not finite: then
        the buffer is zeroed on every rank."""
        start = time.perf_counter()
        try:
            return self._reduce_bucket(buffer, params)
        finally:
            self._exchange_seconds += time.perf_counter() - start

    def _reduce_bucket(
        self,
        buffer: torch.Tensor,
        params: list[torch.Tensor],
        deferred: list[tuple[torch.Tensor, _Plan]] | None = None,
    ) -> bool:
        """The quantized parameters of the bucket now; the fp32 ones now too, or, given a
        ``deferred`` list, appended to it for :meth:`_reduce_deferred` at the step's end."""
        plan = self._plan(params)
        skipped = False
        now = bool(plan.excluded) and (deferred is None or plan.fp32_bucket)
        if now:
            exact = self.link.all_reduce(_gather(buffer, plan.excluded)) / self.link.size
            skipped = not bool(torch.isfinite(exact).all())
        if plan.layout.numel and not skipped:
            flat = buffer.to(torch.float32) if plan.whole else _gather(buffer, plan.quantized)
            if self.memory is not None:
                flat = self.memory.compensate(plan.names, plan.sizes, flat)
            direct = plan.whole and buffer.dtype == torch.float32  # decode into the bucket
            result = self.exchange.reduce(
                flat,
                plan.layout,
                self._draws(plan),
                self.generator,
                key=plan.names,
                out=buffer if direct else None,
                own=self.memory is not None,
            )
            if result.mean is None:
                skipped = True
            else:
                if self.memory is not None:
                    self.memory.update(plan.names, plan.sizes, flat, result.own)
                if plan.whole and not direct:
                    buffer.copy_(result.mean)
                elif not plan.whole:
                    _scatter(buffer, plan.quantized, result.mean)
        if skipped:
            buffer.zero_()
        elif now:
            _scatter(buffer, plan.excluded, exact)
        elif plan.excluded:
            deferred.append((buffer, plan))
        self._step_skipped |= skipped
        return skipped

    def _reduce_deferred(self, deferred: list[tuple[torch.Tensor, _Plan]]) -> bool:
        """One fp32 all-reduce of every deferred tensor of the step, in the model's parameter
        order: a ring all-reduce adds in an order set by where an element sits in the tensor,
        so this way the sums do not depend on how DDP grouped the parameters into buckets
        (which differs in a resumed process's first step), and a resumed run stays bitwise
        identical to an uninterrupted one. Returns True if some rank's values were not finite."""
        pieces = sorted(
            (index, k, offset, n)
            for k, (_, plan) in enumerate(deferred)
            for index, (offset, n) in zip(plan.excluded_indices, plan.excluded, strict=True)
        )
        if not pieces:
            return False
        flat = torch.cat([deferred[k][0][o : o + n] for _, k, o, n in pieces]).to(torch.float32)
        mean = self.link.all_reduce(flat) / self.link.size
        if not bool(torch.isfinite(mean).all()):
            return True
        start = 0
        for _, k, o, n in pieces:
            deferred[k][0][o : o + n].copy_(mean[start : start + n])
            start += n
        return False

    def finish_step(self) -> None:
        """Close the step's counters (the DDP hook calls this after the last bucket)."""
        c = self.link.counter
        self._last_step = (c.sent - self._step_start[0], c.received - self._step_start[1])
        self._step_start = (c.sent, c.received)
        self._steps += 1
        self.last_step_skipped = self._step_skipped
        if self.memory is not None and self._step_skipped:
            self.memory.discard()  # a skipped step leaves the residuals as they were
        elif self.memory is not None:
            self.memory.commit()
        if self._step_skipped:
            self._skipped_steps += 1
            warnings.warn(
                f"terngrad: step {self._steps} had a NaN or Inf gradient on some rank; its "
                "gradient was zeroed on every rank (check state.last_step_skipped before "
                "optimizer.step())",
                RuntimeWarning,
                stacklevel=2,
            )
        self._step_skipped = False

    def _draws(self, plan: _Plan) -> Streams | None:
        """This step's random streams for the quantized parameters of ``plan``, one per
        parameter (see the class doc); ``None`` for deterministic quantizers."""
        if not self.quantizer.stochastic:
            return None
        rank, step = self.link.rank, self._steps
        return Streams(tuple(stream_seed(self.seed, rank, step, i) for i in plan.indices))

    def _plan(self, params: list[torch.Tensor]) -> _Plan:
        key = tuple(id(p) for p in params)
        plan = self._plans.get(key)
        if plan is None:
            quantized, excluded, names, indices, offset = [], [], [], [], 0
            excluded_indices: list[int] = []
            for p in params:
                name = self._names.get(id(p))
                if name is None:
                    raise RuntimeError(
                        "a DDP bucket holds a parameter the terngrad hook was not registered "
                        "for; register the hook on the same model DDP wraps"
                    )
                span = (offset, p.numel())
                if name in self.excluded:
                    excluded.append(span)
                    excluded_indices.append(self._index[id(p)])
                else:
                    quantized.append(span)
                    names.append(name)
                    indices.append(self._index[id(p)])
                offset += p.numel()
            sizes, fp32_bucket = tuple(n for _, n in quantized), False
            if self.policy == "auto":
                layout = Layout.of(sum(sizes), sizes, self.quantizer.bucket_size)
                decision = decide(
                    self.estimate, self.topology, layout, self.link.size, self.quantizer.m
                )
                self.decisions[tuple(names)] = decision
                fp32_bucket = layout.numel > 0 and not decision.quantize
                if fp32_bucket:  # the whole bucket goes fp32, in one all-reduce
                    spans, where = excluded + quantized, excluded_indices + indices
                    pairs = sorted(zip(spans, where, strict=True))
                    excluded, excluded_indices = [a for a, _ in pairs], [i for _, i in pairs]
                    quantized, names, indices, sizes = [], [], [], ()
            plan = _Plan(
                names=tuple(names),
                indices=tuple(indices),
                sizes=sizes,
                quantized=tuple(quantized),
                excluded=tuple(excluded),
                excluded_indices=tuple(excluded_indices),
                layout=Layout.of(sum(sizes), sizes, self.quantizer.bucket_size),
                fp32_bucket=fp32_bucket,
            )
            self._plans[key] = plan
        return plan

    def _check_same_config(self) -> None:
        """Fail on every rank, naming the difference, unless all ranks registered alike."""
        configs: list[Any] = [None] * self.link.size
        dist.all_gather_object(configs, self.config, group=self.link.group)
        problems = [
            f"rank {r}: " + "; ".join(diff)
            for r, cfg in enumerate(configs)
            if (diff := _differences(configs[0], cfg))
        ]
        if problems:
            raise ValueError(
                "terngrad: the ranks registered different exchange configurations (compared "
                "with rank 0) — " + " | ".join(problems)
            )

    def _run_bucket(self, buffer, params, last: bool, future: torch.futures.Future) -> None:
        """The DDP path: the bucket's quantized parameters now, its fp32 ones with the step's
        last bucket (:meth:`_reduce_deferred`); the futures complete when the step is done.
        Once a bucket fails, the step's later buckets fail at once, without collectives (a
        dead peer would make each wait the full timeout), and the next step starts clean."""
        self._waiting.append((buffer, future))
        try:
            if self._failed is not None:
                raise self._failed
            start = time.perf_counter()
            try:
                self._reduce_bucket(buffer, params, self._deferred)
                if last:
                    self._step_skipped |= self._reduce_deferred(self._deferred)
            finally:
                self._exchange_seconds += time.perf_counter() - start
            if not last:
                return
            waiting, self._waiting, self._deferred = self._waiting, [], []
            if self._step_skipped:
                for buf, _ in waiting:
                    buf.zero_()
            self.finish_step()
            for buf, fut in waiting:
                fut.set_result(buf)
        except BaseException as exc:  # handed to DDP, which raises it in backward()
            self._failed = self._failed or self._explain(exc)
            waiting, self._waiting = self._waiting, []
            for _, fut in waiting:
                fut.set_exception(self._failed)
            if last:  # the step is over: the next one starts clean
                self._failed, self._deferred, self._step_skipped = None, [], False
                if self.memory is not None:
                    self.memory.discard()

    def _explain(self, exc: BaseException) -> BaseException:
        """A collective that timed out or lost its peer, said plainly (the cause kept)."""
        text = str(exc)
        lost = ("timed out", "Timed out", "Connection closed", "Connection reset", "Broken pipe")
        if not isinstance(exc, RuntimeError) or not any(s in text for s in lost):
            return exc
        limit = f"{self.timeout:g} s" if self.timeout else "the process group's timeout"
        first = text.strip().splitlines()[0][:200]
        err = CollectiveFailed(
            f"terngrad: rank {self.link.rank}: the gradient exchange failed ({first}): another "
            f"rank has died or is stuck; every collective waits at most {limit}"
        )
        err.__cause__ = exc
        return err


#: configuration entries that may differ between ranks and between a state and its hook: kernel
#: backends round to the same bytes given the same scales, and every rank decodes the same
#: all-reduced scales and summed digits, so replicas stay identical whichever runs where
INTERCHANGEABLE = frozenset({"kernels"})


def _differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Human-readable differences between two configurations."""
    out = []
    for key in (reference.keys() | other.keys()) - INTERCHANGEABLE:
        a, b = reference.get(key), other.get(key)
        if a == b:
            continue
        if key == "parameters" and isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append(f"{len(b)} parameters instead of {len(a)}")
            else:
                first = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
                out.append(f"parameter {b[first]} instead of {a[first]}")
        elif key == "quantizer_options" and isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"quantizer option {k}={b.get(k)!r} instead of {a.get(k)!r}"
                for k in sorted(a.keys() | b.keys())
                if a.get(k) != b.get(k)
            ]
        else:
            out.append(f"{key}={b!r} instead of {a!r}")
    return sorted(out)


def _ddp_hook(state, bucket):  # no annotations: DDP checks them, and here they are strings
    """Queue ``bucket`` on the state's worker thread; the future completes when it is done.
    DDP reads the returned future's value in C++, where an exception stored by Python's
    ``set_exception`` arrives as an object it cannot cast ("Unable to cast ... to Tensor");
    ``then(wait)`` re-raises it in a callback, which marks the returned future failed with the
    exception's own message."""
    future = torch.futures.Future()
    state._executor.submit(
        state._run_bucket, bucket.buffer(), bucket.parameters(), bucket.is_last(), future
    )
    return future.then(_unwrap)


def _unwrap(future: torch.futures.Future) -> torch.Tensor:
    return future.wait()


def register(
    ddp_model: nn.parallel.DistributedDataParallel,
    quantizer: str | Quantizer = "terngrad",
    topology: str = "sharded",
    **options: Any,
) -> HookState:
    """Install the terngrad communication hook on ``ddp_model``; returns its state.

    ``quantizer``: a name from ``quantize.names()`` (options such as ``clip`` or ``levels``
    pass through) or a quantizer; ``topology``: ``sharded`` (default), ``ps`` or ``allgather``;
    other options: see :class:`HookState`. Call on every rank with the same settings; a rank
    that differs makes every rank fail here with a message naming the difference.
    """
    if not isinstance(ddp_model, nn.parallel.DistributedDataParallel):
        raise TypeError(
            "register takes a torch.nn.parallel.DistributedDataParallel model, got "
            f"{type(ddp_model).__name__}: wrap it first, ddp = DistributedDataParallel(model)"
        )
    module = ddp_model.module
    state = HookState(
        module.named_parameters(), last_layer_names(module), quantizer, topology, **options
    )
    ddp_model.register_comm_hook(state, _ddp_hook)
    return state
