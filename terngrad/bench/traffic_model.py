"""What every method of the table sends at every rank in a step of DDP training: the bytes and
messages of each collective, per DDP bucket, exactly as the hook's counters and PyTorch's
collectives count them (``tests/distributed/test_traffic_model.py`` checks every method of
:data:`terngrad.comm.spec.methods.METHODS` against a real 2- and 4-rank run, step by step).

Per bucket of ``n`` elements (DDP's buckets: :meth:`Profile.buckets`, all in one in a run's
first step), N ranks:

* ``fp32``: a ring all-reduce of ``4 n`` bytes; ``fp16`` (``fp16_compress_hook``): of ``2 n``;
* ``powersgd`` (rank r, one bucket): a plain all-reduce for its first
  :data:`~terngrad.train.baselines.POWERSGD_START` steps, then three all-reduces: the tensors
  it does not compress (PyTorch's rule: a ``rows x cols`` view is compressed when
  ``2 (rows + cols) min(rows, cols, r) < rows cols``), their P factors (``rows r``) and their Q
  factors (``cols r``), all fp32;
* terngrad's hook: the quantized parameters through the topology
  (:func:`~terngrad.comm.exchanges.traffic.exchange_traffic`: frames, scales, flags), the
  parameters it keeps in fp32 (the last layer, small tensors) in one all-reduce with the last
  bucket;
  ``fused``: one exchange of every bucket at the last; a ``warmup``: every bucket in a plain
  all-reduce for the run's first ``full_precision_steps`` steps; a ``localvar`` recipe: at
  the steps its optimizer averages the variances (1, 2, 4, ... below N, then every N-th), one
  bf16 all-reduce of each bucket's variance and momentum (``4 n`` bytes).

A :class:`Transfer` is one of those exchanges with when it can start (the share of the
backward pass done) and the elements the codec touches: the performance model
(:mod:`terngrad.bench.perf_model`) times them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from terngrad.bench.profile import Param, Profile
from terngrad.comm.exchanges.traffic import NONE, Traffic, all_reduce, exchange_traffic, plus
from terngrad.comm.rank.plans import kept_in_full_precision
from terngrad.comm.spec.methods import LocalVariance, Method, get
from terngrad.comm.spec.options import Options
from terngrad.quantize import Layout
from terngrad.train.baselines import POWERSGD_START

#: the Synchronizer's buckets (its ``bucket_cap_mb`` default), in which local steps exchange
OUTER_BUCKET_BYTES = 25 * 2**20
#: the rate PyTorch's PowerSGD compresses by at least (its ``min_compression_rate`` default)
POWERSGD_MIN_RATE = 2


@dataclass(frozen=True)
class Transfer:
    """One exchange of a step: ``ready``, the share of the backward pass done when it can
    start; ``ranks``, what each rank moves; ``codec_elements``, the elements it encodes;
    ``weight``, the share of steps it happens in."""

    ready: float
    ranks: list[Traffic]
    codec_elements: int = 0
    #: the share of steps it happens in: 1, or 1/H for the outer step of local steps
    weight: float = 1.0


def transfers(
    prof: Profile,
    method: str | Method,
    world: int,
    step: int | None = None,
    full_precision_steps: int = 0,
) -> list[Transfer]:
    """The exchanges of ``method`` at ``step`` (counted from 1) of a run of ``prof`` on
    ``world`` ranks whose warm-up (a method with one) lasts ``full_precision_steps``;
    ``step=None``: a steady step (after any warm-up, no variances averaged; with local steps,
    the outer step, weighted 1/H). ``ValueError`` for what is not modelled."""
    m = get(method)
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    if m.local_steps == "auto":
        raise ValueError(f"{m.name}: its H is chosen at run time, from the measured rates")
    buckets = prof.buckets(first_step=step == 1)
    if m.baseline == "fp32":
        return [_plain(b, world, 4) for b in buckets]
    if m.baseline == "fp16":
        return [_plain(b, world, 2, codec=True) for b in buckets]
    if m.baseline == "powersgd":
        return [_powersgd(prof.params, world, step, m.powersgd_rank)]
    if m.local_steps != 1:  # (overlap moves the same bytes, later)
        if step is not None and step % m.local_steps:
            return []  # an inner step: nothing crosses the network
        weight = 1.0 if step is not None else 1 / m.local_steps
        return [replace(t, weight=weight) for t in _outer(prof, m.exchange, world)]
    if step is not None and m.warmup and not full_precision_steps:
        raise ValueError(f"{m.name}: give the run's full_precision_steps (its warm-up share)")
    if m.warmup and step is not None and step <= full_precision_steps:
        return [_plain(b, world, 4) for b in buckets]
    out = _hook(prof, buckets, m.exchange, world)
    if isinstance(m.recipe, LocalVariance) and step is not None and _syncs_at(m.recipe, step):
        out = [_plain(b, world, 4) for b in buckets] + out  # bf16 v and m: 4 bytes each
    return out


def step_traffic(
    prof: Profile,
    method: str | Method,
    world: int,
    step: int | None = None,
    full_precision_steps: int = 0,
) -> list[Traffic]:
    """Per rank, the sum of :func:`transfers` at ``step``."""
    found = transfers(prof, method, world, step, full_precision_steps)
    return plus(*(t.ranks for t in found)) if found else [NONE] * world


def _syncs_at(recipe: LocalVariance, step: int) -> bool:
    """:meth:`terngrad.optim.LocalVarianceAdamW.syncs_at`."""
    return step & (step - 1) == 0 if step < recipe.every else step % recipe.every == 0


def _ready(bucket: Sequence[Param]) -> float:
    return max(p.ready for p in bucket)


def _plain(bucket: Sequence[Param], world: int, element_bytes: int, codec=False) -> Transfer:
    n = sum(p.numel for p in bucket)
    return Transfer(_ready(bucket), all_reduce(element_bytes * n, world), n if codec else 0)


def _powersgd(params: Sequence[Param], world: int, step: int | None, rank: int) -> Transfer:
    """PyTorch's ``powerSGD_hook`` of ``rank`` on one bucket of ``params`` (see the module
    docstring)."""
    n = sum(p.numel for p in params)
    if step is not None and step <= POWERSGD_START:
        return Transfer(1.0, all_reduce(4 * n, world))
    plain = p_side = q_side = 0
    for p in params:
        rows = p.shape[0] if p.shape else 1
        cols = p.numel // rows
        r = min(rows, cols, rank)
        if (rows + cols) * r * POWERSGD_MIN_RATE < rows * cols:
            p_side, q_side = p_side + rows * r, q_side + cols * r
        else:
            plain += p.numel
    ranks = plus(*(all_reduce(4 * k, world) for k in (plain, p_side, q_side)))
    return Transfer(1.0, ranks, n)


def _outer(prof: Profile, x: Options, world: int) -> list[Transfer]:
    """The outer step of local steps (:class:`terngrad.diloco.DiLoCo`): the pseudo-gradients
    through the exchange in the :class:`~terngrad.comm.Synchronizer`'s buckets (parameters in
    the model's order, 25 MiB each), each bucket's kept parameters in one fp32 all-reduce
    before its quantized ones, then the floating-point buffers in one fp32 all-reduce."""
    q = x.make_quantizer()
    buckets: list[list[Param]] = []
    size = math.inf
    for p in sorted(prof.params, key=lambda p: p.index):
        if size + 4 * p.numel > OUTER_BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += 4 * p.numel
    out = []
    for bucket in buckets:
        kept = [p for p in bucket if _kept(p, x)]
        if kept:
            out.append(Transfer(1.0, all_reduce(4 * sum(p.numel for p in kept), world)))
        sizes = [p.numel for p in bucket if not _kept(p, x)]
        if sum(sizes):
            layout = Layout.of(sum(sizes), sizes, q.bucket_size)
            ranks = exchange_traffic(q, x.topology, layout, world, x.exchange_settings)
            out.append(Transfer(1.0, ranks, layout.numel))
    if prof.buffers:
        out.append(Transfer(1.0, all_reduce(4 * prof.buffers, world)))
    return out


def _kept(p: Param, x: Options) -> bool:
    """Whether the hook keeps ``p`` in full precision (:func:`kept_in_full_precision`)."""
    return kept_in_full_precision(p.name, p.numel, {p.name} if p.last_layer else (), x)


def _hook(
    prof: Profile, buckets: list[tuple[Param, ...]], x: Options, world: int
) -> list[Transfer]:
    """terngrad's hook with options ``x``: each bucket's quantized parameters through the
    exchange (a step's buckets as one with ``fuse_buckets``), the kept ones in one fp32
    all-reduce with the last."""
    q = x.make_quantizer()
    if x.policy != "quantize":
        raise ValueError(f"policy {x.policy!r} chooses per bucket at run time: not modelled")
    kept = [p for p in prof.params if _kept(p, x)]
    if x.fuse_buckets:
        buckets = [tuple(p for b in buckets for p in b)]
    out = []
    for bucket in buckets:
        sizes = [p.numel for p in bucket if p not in kept]
        if sum(sizes):
            layout = Layout.of(sum(sizes), sizes, q.bucket_size)
            ranks = exchange_traffic(q, x.topology, layout, world, x.exchange_settings)
            out.append(Transfer(_ready(bucket), ranks, layout.numel))
    if kept:
        out.append(Transfer(1.0, all_reduce(4 * sum(p.numel for p in kept), world)))
    return out
