"""``terngrad bench overhead``: where the hook's own seconds go, step by step, beside PyTorch's
fp32 all-reduce and fp16 hook — the hook's cost on fast links, where only it can lose.

``workers`` ranks on this machine (gloo over loopback: no link limit, no root needed), one
thread each, train ``model`` on a fixed synthetic batch. For each method, after ``warmup``
steps, ``steps`` steps are timed (the slowest rank's, median over steps), and the compute alone
(the same steps without DDP). For terngrad's hook every rank also records, on the hook's worker
thread, what each part of the exchange took (instrumented by wrapping the parts; their seconds
are wall clock inside the call, waiting included):

* **codec passes**, one row per operation of the kernel backend: statistics (``grid_prepare``),
  rounding and packing (``grid_pack``), the shard owner's sum (``sum_packed``), decoding into
  the bucket (``decode_into``) — the level quantizers' fit, pack and decode likewise;
* **frames and checksums**: building and sealing frames (CRC-32), reading and checking them;
* **collectives**, by kind: calls per step (rounds), bytes sent, seconds inside (waiting
  included);
* **glue**: the rest of the hook's time on its thread (Python, copies, allocation);
* **hand-off**: from DDP calling the hook to the worker thread starting the bucket;
* **exposed**: from the backward pass's last hook call (its gradients all computed) to the
  step's exchange done — the hook time the backward pass did not hide. The rest of the hook's
  time overlapped the backward pass (on shared CPU cores, taking cycles from it).

The same per-step clock is kept for the fp16 hook (its cast and all-reduce), so the two hooks'
own costs are set side by side. Seconds are per step and per rank (mean over ranks).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from terngrad.comm.spec.methods import Method, get, select

CODEC = ("grid_prepare", "grid_pack", "sum_packed", "decode_into", "level_fit", "level_pack",
         "level_decode")  # fmt: skip
FRAMES = ("new_frame", "seal_frame", "read_frame")
COLLECTIVES = ("all_reduce", "all_to_all", "all_gather", "gather", "broadcast")
DEFAULT_METHODS = ("fp32", "fp16", "terngrad")
#: per-rank input sizes small enough for 4 ranks on a laptop's cores
BATCH = {"lenet": 64, "cifarnet": 64, "alexnet": 8}


class Clock:
    """Seconds and calls per part, by part name, from every thread of this process."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.marks: dict[str, float] = {}
        #: when DDP handed each bucket to the hook, the oldest first
        self.handed: deque[float] = deque()
        self._lock = threading.Lock()

    def add(self, part: str, seconds: float, nbytes: int = 0) -> None:
        with self._lock:
            self.seconds[part] += seconds
            self.calls[part] += 1
            self.bytes[part] += nbytes

    def timed(self, part: str, fn: Callable) -> Callable:
        """``fn``, its calls timed as ``part``."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(part, time.perf_counter() - start)

        return wrapper

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.bytes.clear()
        self.marks.clear()
        self.handed.clear()


def instrument(state, clock: Clock) -> None:
    """Time the parts of ``state``'s exchange (a built :class:`terngrad.ddp.State`) into
    ``clock``: its backend's operations, the frame functions its grid steps call, its link's
    collectives (with the bytes each sent), and its worker thread's whole bucket."""
    from terngrad.comm.exchanges import grid_step

    reducer = state.reducer
    backend = reducer.kernels
    for name in CODEC:
        if hasattr(backend, name):
            setattr(backend, name, clock.timed(name, getattr(backend, name)))
    for name in FRAMES:
        setattr(grid_step, name, clock.timed(name, getattr(grid_step, name)))
    link = reducer.link
    for name in COLLECTIVES:
        real = getattr(link, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            sent = link.counter.sent
            start = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                clock.add(_name, time.perf_counter() - start, link.counter.sent - sent)

        setattr(link, name, counted)
    real_bucket = state._run_bucket

    def bucket(buffer, params, last, future):
        start = time.perf_counter()
        if clock.handed:
            clock.add("hand-off", start - clock.handed.popleft())
        try:
            return real_bucket(buffer, params, last, future)
        finally:
            clock.add("hook thread", time.perf_counter() - start)
            if last:
                clock.marks["done"] = time.perf_counter()

    state._run_bucket = bucket


def _timed_hook(real_hook: Callable, clock: Clock) -> Callable:
    """A communication hook that notes when DDP hands each bucket over (the last one: the
    backward pass's gradients are all computed)."""

    def hook(state, bucket):
        now = time.perf_counter()
        clock.handed.append(now)
        clock.marks["last call"] = now
        return real_hook(state, bucket)

    return hook


def _fp16_hook(clock: Clock) -> Callable:
    """PyTorch's fp16_compress_hook, its whole work (cast, all-reduce, cast back) timed."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state, bucket):
        clock.marks["last call"] = time.perf_counter()
        start = time.perf_counter()
        future = default_hooks.fp16_compress_hook(state, bucket)

        def done(fut):
            clock.add("hook thread", time.perf_counter() - start)
            clock.marks["done"] = time.perf_counter()
            return fut.value()

        return future.then(done)

    return hook


def _rank(rank: int, world: int, port: int, args: dict[str, Any], result: str) -> None:
    """One rank: compute alone, then every method; rank 0 writes every rank's numbers."""
    import torch.distributed as dist
    from torch import nn

    import terngrad.ddp
    from terngrad.train import models

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=args["timeout"]),
    )  # fmt: skip
    shape = models.default_input_shape(args["model"])
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args["batch_size"], *shape, generator=gen)
    y = torch.randint(0, 10, (args["batch_size"],), generator=gen)

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return models.build(args["model"], shape, 10)

    def steps(model: nn.Module, count: int, clock: Clock | None = None) -> list[dict]:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        out = []
        for _ in range(count):
            dist.barrier()
            if clock is not None:
                clock.reset()
            start = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            backward_end = time.perf_counter()
            optimizer.step()
            row = {"step": time.perf_counter() - start}
            if clock is not None:
                exposed = clock.marks.get("done", backward_end) - clock.marks.get(
                    "last call", backward_end
                )
                row.update(
                    parts=dict(clock.seconds), calls=dict(clock.calls),
                    bytes=dict(clock.bytes), exposed=max(exposed, 0.0),
                )  # fmt: skip
            out.append(row)
        return out

    rows: dict[str, list[dict]] = {"compute": steps(fresh(), args["warmup"] + args["steps"])}
    for method in args["methods"]:
        model, clock = fresh(), Clock()
        ddp = nn.parallel.DistributedDataParallel(model)
        if method == "fp32":
            clock = None
        elif method == "fp16":
            ddp.register_comm_hook(dist.group.WORLD, _fp16_hook(clock))
        else:
            state = terngrad.ddp.State(options=get(method).options())
            ddp.register_comm_hook(state, _timed_hook(terngrad.ddp.hook, clock))
            steps(ddp, 1)  # the state is built at its first use
            instrument(state, clock)
        rows[method] = steps(ddp, args["warmup"] + args["steps"], clock)
        del ddp
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {k: v[args["warmup"] :] for k, v in rows.items()})
    if rank == 0:
        Path(result).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def honoured(method: Method) -> Method:
    """``method``, if this benchmark runs all of it: DDP's fp32 all-reduce, the fp16 hook and
    terngrad's hook on SGD steps (no optimizer recipe, no warm-up); one line otherwise."""
    return method.require("bench overhead", baselines=("fp32", "fp16"))


def measure(
    model: str, workers: int = 4, methods: Sequence[str] = DEFAULT_METHODS, steps: int = 20,
    warmup: int = 5, batch_size: int | None = None, timeout: float = 600.0,
) -> dict[str, Any]:  # fmt: skip
    """Run ``workers`` ranks on this machine and return the summary (:func:`summarise`)."""
    from terngrad import kernels
    from terngrad.train import models

    models.default_input_shape(model)  # an unknown model fails here
    methods = [honoured(m).name for m in select(methods)]
    kernels.warm_up(levels=True, threads=1)  # the ranks' build, compiled once here
    args = {"model": model, "methods": list(methods), "steps": steps, "warmup": warmup,
            "batch_size": batch_size or BATCH.get(model, 32), "timeout": timeout}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "ranks.json")
        # forkserver, as the trainer: a rank leaves through os._exit once its function has
        # returned, never through the interpreter's teardown, where torch 2.13 + gloo
        # sometimes aborts ("terminate called without an active exception")
        torch.multiprocessing.start_processes(
            _rank, args=(workers, _port(), args, result), nprocs=workers,
            start_method="forkserver",
        )  # fmt: skip
        raw = json.loads(Path(result).read_text())
    return summarise(raw, args)


def _per_step(raw: list[dict], method: str, key: str, part: str) -> float:
    """Mean over ranks of the median over steps of ``row[key][part]``."""
    return statistics.fmean(
        statistics.median(r.get(key, {}).get(part, 0) for r in rank[method]) for rank in raw
    )


def summarise(raw: list[dict], args: dict[str, Any]) -> dict[str, Any]:
    """Per method: the step (slowest rank, median over steps), its extra over compute alone,
    and for the hooks every part per step (mean over ranks)."""

    def slowest(method: str) -> float:
        per_step = zip(*([r["step"] for r in rank[method]] for rank in raw), strict=True)
        return statistics.median(max(s) for s in per_step)

    compute = slowest("compute")
    out: dict[str, Any] = {**args, "workers": len(raw), "compute_seconds": compute, "methods": {}}
    for method in args["methods"]:
        row: dict[str, Any] = {"step_seconds": slowest(method)}
        row["extra_seconds"] = row["step_seconds"] - compute
        if method != "fp32":
            parts = sorted({p for rank in raw for r in rank[method] for p in r["parts"]})
            row["parts"] = {p: _per_step(raw, method, "parts", p) for p in parts}
            row["calls"] = {p: _per_step(raw, method, "calls", p) for p in parts}
            row["bytes"] = {p: _per_step(raw, method, "bytes", p) for p in COLLECTIVES
                            if p in parts}  # fmt: skip
            row["exposed_seconds"] = statistics.fmean(
                statistics.median(r["exposed"] for r in rank[method]) for rank in raw
            )
            inside = ("hook thread", "hand-off")
            measured = sum(v for p, v in row["parts"].items() if p not in inside)
            row["parts"]["glue"] = max(row["parts"].get("hook thread", 0.0) - measured, 0.0)
        out["methods"][method] = row
    return out


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def table(summary: dict[str, Any]) -> str:
    """The summary in Markdown: the steps, then each hook's parts per step."""
    ms = 1e3
    lines = [
        f"### {summary['model']}, {summary['workers']} ranks on this machine's cores "
        f"(gloo, loopback), batch {summary['batch_size']} a rank",
        "",
        f"compute alone {ms * summary['compute_seconds']:.1f} ms a step",
        "",
        "| method | step ms | vs fp32 | over compute ms | hook thread ms | exposed ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = summary["methods"]
    fp32 = rows.get("fp32", {}).get("step_seconds")
    for method, r in rows.items():
        ratio = f"{r['step_seconds'] / fp32:.2f}x" if fp32 else "-"
        hook = r.get("parts", {}).get("hook thread")
        exposed = r.get("exposed_seconds")
        lines.append(
            f"| {method} | {ms * r['step_seconds']:.1f} | {ratio} | {ms * r['extra_seconds']:.1f} "
            f"| {_ms(hook)} | {_ms(exposed)} |"
        )
    for method, r in rows.items():
        if "parts" not in r or method == "fp16":
            continue
        lines += ["", f"{method}'s hook, per step and rank:", "",
                  "| part | ms | calls | KB sent |", "|---|---:|---:|---:|"]  # fmt: skip
        order = [*CODEC, *FRAMES, *COLLECTIVES, "glue", "hand-off"]
        for part in [p for p in order if p in r["parts"]]:
            sent = r["bytes"].get(part)
            lines.append(
                f"| {part} | {ms * r['parts'][part]:.2f} | {r['calls'].get(part, 0):.0f} | "
                f"{'' if sent is None else f'{sent / 1e3:.1f}'} |"
            )
    return "\n".join(lines) + "\n"
