"""An analytical model of one data-parallel training step, calibrated and checked on the testbed.

A step of N workers, each with compute time ``C`` (forward ``F = f C``, backward ``C - F``):

* **Gradients** become ready during the backward pass, last layer first. Parameter ``p`` is ready
  at ``F + r_p (C - F)``, with ``r_p`` the share of backward work (2 x forward FLOPs of each
  convolution and linear layer) done by then (:class:`~terngrad.bench.profile.Profile`). DDP
  groups parameters into buckets in that order (the first capped at 1 MiB, the others at
  25 MiB); a bucket is ready when its last parameter is.
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

What each bucket moves, per method (every method of the table: the bytes and messages of each
collective, exactly as counted in a run), is :mod:`terngrad.bench.traffic_model`; ``bytes_b``
is the most on any rank's critical path, ``messages_b`` the most any rank sends. The model of a
model is :mod:`terngrad.bench.profile`.

Calibration (:func:`calibrate`): from a testbed run with unshaped links, ``H`` is the rate that
makes the model reproduce fp32's step, and each method's ``κ`` the one that reproduces its step.
Validation (:func:`validate`): with those, predict the steps measured on shaped links, given
each run's compute time and its link probe (an fp32 all-reduce alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from terngrad.bench import traffic_model
from terngrad.bench.profile import Param, Profile, profile, profile_model
from terngrad.comm import Options
from terngrad.comm.spec import methods

__all__ = [
    "Cluster", "Param", "Profile", "Step", "method", "modelled", "predict", "profile",
    "profile_model",
]  # fmt: skip

FORWARD_SHARE = 1 / 3  # backward costs about twice the forward pass


# --------------------------------------------------------------------------- methods


def _not_modelled(x: Options) -> str | None:
    if x.policy != "quantize":
        return f"policy {x.policy!r} chooses per bucket at run time"
    if x.aggregate == "coherent":
        return "the agreement of coherent levels is not modelled"
    return None


def method(name: str | methods.Method) -> methods.Method:
    """The method ``name`` (any name of the rule, or an older one), if the model covers it:
    every method of the table does; ``ValueError`` with one line otherwise."""
    return methods.get(name).require(
        "the performance model", recipe=True, warmup=True, local=True, exchange=_not_modelled
    )


def modelled(name: str | methods.Method) -> bool:
    """Whether the model covers the method ``name`` (:func:`method` would not refuse it)."""
    try:
        method(name)
    except ValueError:
        return False
    return True


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
    """The step time of ``method_name`` in a steady step (after any warm-up, no variances
    averaged; see the module docstring for the formulas)."""
    forward = forward_share * compute_seconds
    backward = compute_seconds - forward
    rate = min(cluster.bytes_per_s, cluster.host_bytes_per_s)
    jobs, codec, wire_total, sent, busiest = [], 0.0, 0.0, 0.0, 0.0
    for t in traffic_model.transfers(prof, method(method_name), cluster.workers):
        if cluster.workers == 1:
            continue
        x = t.weight * codec_seconds_per_element * t.codec_elements
        path = t.weight * max(r.path for r in t.ranks)
        w = path / rate + t.weight * max(r.messages for r in t.ranks) * cluster.latency_s
        jobs.append((forward + t.ready * backward, x, w))
        codec, wire_total = codec + x, wire_total + w
        sent += t.weight * sum(r.sent for r in t.ranks) / cluster.workers
        busiest += path
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
