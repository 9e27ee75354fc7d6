"""An analytical model of one data-parallel training step, calibrated and checked on the testbed.

A step of N workers, each with compute time ``C`` (forward ``F = f C``, backward ``C - F``):

* **Gradients** become ready during the backward pass, last layer first. Parameter ``p`` is ready
  at ``F + r_p (C - F)``, with ``r_p`` the share of backward work (2 x forward FLOPs of each
  convolution and linear layer) done by then (:class:`Profile`). DDP groups parameters into
  buckets in that order (the first capped at 1 MiB, the others at 25 MiB); a bucket is ready
  when its last parameter is.
* **Each bucket** is then encoded, sent and decoded, one bucket after the other (DDP's and our
  hook's communication runs in order): ``start_b = max(ready_b, end_{b-1})``,
  ``end_b = start_b + x_b + w_b``, with codec time ``x_b = κ n_b`` (``κ`` seconds per element
  of the method, calibrated) and wire time ``w_b = bytes_b / min(B, H) + messages_b α``:
  ``bytes_b`` the most on any rank's critical path for the bucket (per phase of the exchange
  the larger of what it sends and receives, as links are full duplex; the parameter server's
  gather and broadcast add up), ``B`` the link's bytes/s, ``H`` what a worker's
  network stack moves per second, ``α`` the latency of one message. This is wait-free
  back-propagation: communication overlaps the rest of the backward pass.
* **Where compute and codec share the same cores** (the testbed's CPU workers), they share
  them whenever both run, each at half speed (processor sharing, :func:`_timeline`): codec
  work during the backward pass delays both. The step also cannot be shorter than
  ``C + Σ x_b + bytes / H`` (compute, codec and the network stack on the same cores).

``T = max(end of the last transfer, end of compute, C + Σ x_b + bytes / H)``.

Traffic per bucket, per method (``n`` elements, ``N`` workers, ring all-reduce
``2 (N-1)/N x bytes`` in ``2 (N-1)`` messages): fp32 ``4n`` and fp16 ``2n`` bytes ring
all-reduced; PowerSGD (rank r) ring all-reduces the uncompressed tensors, then P (``Σ rows r``)
and Q (``Σ cols r``) in fp32, three all-reduces; TernGrad and QSGD move exactly the frames of
:func:`terngrad.comm.exchange.grid_traffic` for the hook's topology; the parameters the hook keeps
in fp32 (the last layer, tensors under 1024 elements) go in one fp32 all-reduce at the end of the
backward pass.

Calibration (:func:`calibrate`): from a testbed run with unshaped links, ``H`` is the rate that
makes the model reproduce fp32's step, and each method's ``κ`` the one that reproduces its step.
Validation (:func:`validate`): with those, predict the steps measured on shaped links, given
each run's compute time and its link probe (an fp32 all-reduce alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from terngrad.comm import Options
from terngrad.comm.plans import last_layer_names
from terngrad.comm.traffic import grid_traffic, ring_bytes
from terngrad.quantize import Layout, SymmetricGrid
from terngrad.train import methods
from terngrad.train.baselines import POWERSGD_RANK

FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket
BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default
FORWARD_SHARE = 1 / 3  # backward costs about twice the forward pass


@dataclass(frozen=True)
class Param:
    """One parameter tensor: its shape, when its gradient is ready (share of the backward pass
    done), and whether it is in the model's last layer."""

    name: str
    shape: tuple[int, ...]
    ready: float
    last_layer: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Profile:
    """A model as the step model needs it: parameters in the order their gradients become
    ready, and the forward FLOPs of one sample."""

    model: str
    params: tuple[Param, ...]
    forward_flops: float

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    def buckets(
        self, cap_bytes: int = BUCKET_BYTES, first_cap_bytes: int = FIRST_BUCKET_BYTES
    ) -> list[tuple[Param, ...]]:
        """DDP's buckets of fp32 gradients: parameters in ready order, a bucket closed once it
        holds at least its cap (the first bucket's cap is ``first_cap_bytes``)."""
        buckets, current, size, cap = [], [], 0, first_cap_bytes
        for p in self.params:
            current.append(p)
            size += 4 * p.numel
            if size >= cap:
                buckets.append(tuple(current))
                current, size, cap = [], 0, cap_bytes
        if current:
            buckets.append(tuple(current))
        return buckets


def profile(module: nn.Module, input_shape: Sequence[int], name: str = "model") -> Profile:
    """The :class:`Profile` of ``module`` for inputs of ``input_shape`` (one sample is run
    forward to count the FLOPs of its convolutions and linear layers, 2 per multiply-add)."""
    flops: list[tuple[nn.Module, float]] = []

    def count(m: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(m, nn.Conv2d):
            per_output = m.in_channels // m.groups * math.prod(m.kernel_size)
            flops.append((m, 2.0 * output.numel() * per_output))
        elif isinstance(m, nn.Linear):
            flops.append((m, 2.0 * output.numel() * m.in_features))
        elif next(m.parameters(recurse=False), None) is not None:
            flops.append((m, 0.0))  # normalisation layers: parameters, negligible work

    handles = [m.register_forward_hook(count) for m in module.modules()]
    try:
        with torch.no_grad():
            was_training = module.training
            module.eval()
            module(torch.zeros(1, *input_shape))
            module.train(was_training)
    finally:
        for h in handles:
            h.remove()
    total = sum(f for _, f in flops) or 1.0
    ready: dict[int, float] = {}
    done = 0.0
    for m, f in reversed(flops):  # backward: last module first
        done += f
        for p in m.parameters(recurse=False):
            ready.setdefault(id(p), done / total)
    last = last_layer_names(module)
    params = [
        Param(n, tuple(p.shape), ready.get(id(p), 1.0), n in last)
        for n, p in module.named_parameters()
        if p.requires_grad
    ]
    order = sorted(range(len(params)), key=lambda i: (params[i].ready, -i))
    return Profile(name, tuple(params[i] for i in order), sum(f for _, f in flops))


def profile_model(
    name: str, input_shape: Sequence[int] | None = None, num_classes: int = 10
) -> Profile:
    """The :class:`Profile` of one of :mod:`terngrad.train.models`, as the testbed builds it."""
    from terngrad.train import models

    shape = tuple(input_shape) if input_shape else models.default_input_shape(name)
    torch.manual_seed(0)
    return profile(models.build(name, shape, num_classes), shape, name)


# --------------------------------------------------------------------------- methods


@dataclass(frozen=True)
class Wire:
    """One bucket's traffic: the most bytes on any rank's critical path (see
    :class:`~terngrad.comm.exchange.Traffic`), the bytes every rank sends on average, messages
    on the critical path, and the elements the codec touches."""

    busiest: int
    mean_sent: float
    messages: int
    codec_elements: int


def _ring(nbytes: int, world: int) -> Wire:
    b = ring_bytes(nbytes, world)
    return Wire(b, b, 2 * (world - 1), 0)


def _plus(a: Wire, b: Wire) -> Wire:
    return Wire(
        a.busiest + b.busiest,
        a.mean_sent + b.mean_sent,
        a.messages + b.messages,
        a.codec_elements + b.codec_elements,
    )


def _fp32(bucket: Sequence[Param], world: int) -> Wire:
    return _ring(4 * sum(p.numel for p in bucket), world)


def _fp16(bucket: Sequence[Param], world: int) -> Wire:
    n = sum(p.numel for p in bucket)
    return replace(_ring(2 * n, world), codec_elements=n)


def _powersgd(bucket: Sequence[Param], world: int, rank: int = POWERSGD_RANK) -> Wire:
    """PyTorch's powerSGD_hook: a matrix ``n x m`` (a tensor reshaped to its first dimension)
    is compressed when ``2 (n + m) r < n m``; the rest is all-reduced as is."""
    plain = p_side = q_side = 0
    for p in bucket:
        rows, cols = p.shape[0], p.numel // p.shape[0]
        if len(p.shape) > 1 and 2 * (rows + cols) * rank < rows * cols:
            p_side, q_side = p_side + rows * rank, q_side + cols * rank
        else:
            plain += p.numel
    n = sum(p.numel for p in bucket)
    wire = _plus(_plus(_ring(4 * plain, world), _ring(4 * p_side, world)), _ring(4 * q_side, world))
    return replace(wire, codec_elements=n)


def _kept(x: Options) -> Callable[[Param], bool]:
    """Whether the hook with options ``x`` keeps a parameter in fp32 (by default: the last
    layer, and tensors under 1024 elements)."""
    return lambda p: (p.last_layer and not x.quantize_last) or p.numel < x.min_numel


def _hook(q: SymmetricGrid, topology: str) -> Callable[[Sequence[Param], int], Wire]:
    def traffic(bucket: Sequence[Param], world: int) -> Wire:
        sizes = [p.numel for p in bucket]
        n = sum(sizes)
        if not n:
            return Wire(0, 0, 0, 0)
        n_scales = Layout.of(n, sizes, q.bucket_size).n_buckets
        ranks = grid_traffic(topology, n, n_scales, world, q.m)
        return Wire(max(t.path for t in ranks), sum(t.sent for t in ranks) / world,
                    ranks[0].messages, n)  # fmt: skip

    return traffic


@dataclass(frozen=True)
class Method:
    """A way to average gradients, as the testbed names it. ``deferred``: the parameters that
    go in one fp32 all-reduce at the end of the backward pass instead of with their bucket."""

    name: str
    traffic: Callable[[Sequence[Param], int], Wire]
    one_bucket: bool = False  # PowerSGD runs in one DDP bucket (it hangs on gloo with more)
    deferred: Callable[[Param], bool] | None = None


_BUILTIN_TRAFFIC = {"fp32": _fp32, "fp16": _fp16, "powersgd": _powersgd}


def _modelled(spec: methods.Method) -> Method | None:
    """The model of a method of the table, or ``None`` where the formulas do not cover it: a
    quantizer off the shared grid (its levels are searched per bucket), the auto policy, or a
    full-precision warm-up (the step changes during the run)."""
    if spec.baseline is not None:
        return Method(spec.name, _BUILTIN_TRAFFIC[spec.baseline], one_bucket=spec.one_bucket)
    x = spec.exchange
    q = x.make_quantizer()
    if not isinstance(q, SymmetricGrid) or x.policy != "quantize" or spec.full_precision_share:
        return None
    return Method(spec.name, _hook(q, x.topology), deferred=_kept(x))


#: the methods of :data:`terngrad.train.methods.METHODS` the model can predict
METHODS: dict[str, Method] = {
    m.name: m for m in map(_modelled, methods.METHODS.values()) if m is not None
}


def method(name: str) -> Method:
    """The model of the method ``name`` (or an older name of it)."""
    name = methods.ALIASES.get(name, name)
    if name not in METHODS:
        raise ValueError(f"the model knows no method {name!r}; choose one of: {', '.join(METHODS)}")
    return METHODS[name]


# --------------------------------------------------------------------------- the step


@dataclass(frozen=True)
class Cluster:
    """N workers and their network: link ``bytes_per_s`` each way (``inf``: unshaped),
    ``host_bytes_per_s`` a worker's network stack moves (``inf``: not a limit),
    ``latency_s`` per message, and whether compute, codec and network stack share the
    workers' cores (``True`` for CPU workers)."""

    workers: int
    bytes_per_s: float = math.inf
    host_bytes_per_s: float = math.inf
    latency_s: float = 0.0
    shared_cores: bool = True

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if not (self.bytes_per_s > 0 and self.host_bytes_per_s > 0 and self.latency_s >= 0):
            raise ValueError("rates must be positive and the latency non-negative")


@dataclass(frozen=True)
class Step:
    """A predicted step: its time and what bounds it."""

    seconds: float
    compute_seconds: float
    codec_seconds: float
    wire_seconds: float
    pipeline_seconds: float
    busy_seconds: float
    bytes_per_rank: float
    busiest_bytes: float


def predict(
    prof: Profile,
    method_name: str,
    cluster: Cluster,
    compute_seconds: float,
    codec_seconds_per_element: float = 0.0,
    forward_share: float = FORWARD_SHARE,
) -> Step:
    """The step time of ``method_name`` (see the module docstring for the formulas)."""
    m = method(method_name)
    forward = forward_share * compute_seconds
    backward = compute_seconds - forward
    buckets = [prof.params] if m.one_bucket else prof.buckets()
    transfers = []  # (ready seconds, traffic), in the order they go out
    for bucket in buckets:
        ready = forward + max(p.ready for p in bucket) * backward
        sent_now = [p for p in bucket if not (m.deferred and m.deferred(p))]
        transfers.append((ready, m.traffic(sent_now, cluster.workers)))
    if m.deferred:  # one fp32 all-reduce with the last bucket
        kept = [p for p in prof.params if m.deferred(p)]
        transfers.append((compute_seconds, _fp32(kept, cluster.workers)))
    rate = min(cluster.bytes_per_s, cluster.host_bytes_per_s)
    jobs, codec, wire_total, sent, busiest = [], 0.0, 0.0, 0.0, 0.0
    for ready, wire in transfers:
        if cluster.workers == 1:
            continue
        x = codec_seconds_per_element * wire.codec_elements
        w = wire.busiest / rate + wire.messages * cluster.latency_s
        jobs.append((ready, x, w))
        codec, wire_total = codec + x, wire_total + w
        sent, busiest = sent + wire.mean_sent, busiest + wire.busiest
    end = _timeline(jobs, compute_seconds, cluster.shared_cores)
    busy = compute_seconds
    if cluster.shared_cores:
        busy += codec + busiest / cluster.host_bytes_per_s
    return Step(
        max(end, busy, compute_seconds), compute_seconds, codec, wire_total, end, busy, sent,
        busiest,
    )  # fmt: skip


def _timeline(jobs: list[tuple[float, float, float]], compute: float, shared: bool) -> float:
    """When the step's last communication ends. ``jobs``: per transfer, in order, the compute
    work done when it is ready, its codec work and its wire seconds. The hook thread takes
    them one after the other: codec (CPU), then wire (no CPU). With ``shared`` cores the rank's
    CPU is shared between the backward pass and the hook's codec whenever both run (each at
    half speed: processor sharing), which delays both; otherwise both run at full speed."""
    eps = 1e-12
    t = done = 0.0  # wall clock; compute work done
    i, phase, left = 0, "", 0.0  # current job; "" (waiting), "codec" or "wire"; work left
    while i < len(jobs) or done < compute - eps:
        if not phase and i < len(jobs) and done >= jobs[i][0] - eps:
            phase, left = "codec", jobs[i][1]
        if phase == "codec" and left <= eps:
            phase, left = "wire", jobs[i][2]
        if phase == "wire" and left <= eps:
            i, phase = i + 1, ""
            continue
        computing = done < compute - eps
        both = shared and computing and phase == "codec"
        speed = 0.5 if both else 1.0
        steps = []
        if computing:
            steps.append((compute - done) / speed)
            if not phase and i < len(jobs):
                steps.append((jobs[i][0] - done) / speed)
        if phase:
            steps.append(left / speed if phase == "codec" else left)
        dt = max(min(steps), 0.0)
        t += dt
        if computing:
            done = min(compute, done + speed * dt)
        if phase == "codec":
            left -= speed * dt
        elif phase == "wire":
            left -= dt
    return t
