"""What each rank runs in the distributed tests (top level, so spawned processes import it)."""

from __future__ import annotations

import copy
import itertools
import math
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import terngrad.ddp
from terngrad import quantize
from terngrad.comm import (
    TOPOLOGIES,
    ByteCounter,
    ExchangeSettings,
    Link,
    Synchronizer,
    make_exchange,
    rank_seed,
)
from terngrad.kernels import Streams, resolve, stream_seed, triton_available
from terngrad.quantize import Layout

#: the topologies that route codes on the quantizer's path (own-scales: its own cases)
ROUTED = tuple(t for t in TOPOLOGIES if t != "own-scales")

SEGMENTS = (300, 7, 0, 1234, 57)
GRID = [("terngrad", {}), ("terngrad", {"bucket_size": 100}), ("qsgd", {"bucket_size": 64})]
MESSAGES = [("fp32", {}), ("fp16", {}), ("linear", {"bucket_size": 64}), ("signsgd", {})]
KERNELS = ("torch", "numba")


def local_gradient(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(sum(SEGMENTS), generator=gen) * (1 + rank)


def draws(rank: int) -> Streams:
    """The random streams rank ``rank`` rounds with in the exchange scenarios."""
    return Streams(tuple(stream_seed(7, rank, p) for p in range(len(SEGMENTS))))


def _measured(link, exchange, g, layout, streams, gen) -> dict:
    """One exchange of ``g``: its mean, this rank's own values, the bytes it counted."""
    sent, received = link.counter.sent, link.counter.received
    result = exchange.reduce(g, layout, streams, gen, key="bucket")
    return {
        "mean": result.mean,
        "own": result.own,
        "sent": link.counter.sent - sent,
        "received": link.counter.received - received,
    }


def exchanges(rank: int, world: int) -> dict:
    """Every topology with grid and message quantizers on one flat gradient per rank."""
    link = Link(dist.new_group())
    g = local_gradient(rank)
    out = {}
    cases = itertools.product(GRID + MESSAGES, ROUTED, KERNELS)
    for (name, options), topology, kernels in cases:
        q = quantize.get(name, **options)
        layout = Layout.of(g.numel(), SEGMENTS, q.bucket_size)
        for aggregate in ("requantize", "fp16") if name == "linear" else ("requantize",):
            settings = ExchangeSettings(aggregate)
            exchange = make_exchange(topology, q, link, settings, resolve(kernels))
            gen = torch.Generator().manual_seed(rank_seed(8, rank))  # re-quantization
            out[(name, str(options), topology, aggregate, kernels)] = _measured(
                link, exchange, g, layout, draws(rank), gen
            )
    for (name, options), kernels in itertools.product(GRID, KERNELS):  # no scalar sharing
        q = quantize.get(name, **options)
        layout = Layout.of(g.numel(), SEGMENTS, q.bucket_size)
        exchange = make_exchange("own-scales", q, link, kernels=resolve(kernels))
        out[("own", name, str(options), kernels)] = _measured(
            link, exchange, g, layout, draws(rank), None
        )
        inplace = g.clone()  # into the gradient itself, this rank's own message not kept apart
        result = exchange.reduce(inplace, layout, draws(rank), None, out=inplace, own=False)
        out[("own-inplace", name, str(options), kernels)] = (result.mean, result.own, inplace)
    bad = g.clone()
    if rank == world - 1:
        bad[5] = float("nan")
    for (name, options), kernels in itertools.product(GRID, KERNELS):
        q = quantize.get(name, **options)
        exchange = make_exchange("own-scales", q, link, kernels=resolve(kernels))
        result = exchange.reduce(bad, Layout.of(g.numel(), SEGMENTS, q.bucket_size), None, None)
        out[("own-nan", name, str(options), kernels)] = result
    for name, topology, kernels in itertools.product(("terngrad", "linear"), ROUTED, KERNELS):
        q = quantize.get(name)
        result = make_exchange(topology, q, link, kernels=resolve(kernels)).reduce(
            bad, Layout.of(g.numel(), SEGMENTS, q.bucket_size), None, None
        )
        out[("nan", name, topology, kernels)] = result.mean
    return out


class MLP(nn.Module):
    def __init__(self, widths=(32, 48, 40, 10)):
        super().__init__()
        layers = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.Tanh()]
        self.body = nn.Sequential(*layers[:-1])

    def forward(self, x):
        return self.body(x)


def _batches(rank: int, steps: int, width: int = 32, batch: int = 16):
    gen = torch.Generator().manual_seed(1000 + rank)
    teacher = torch.Generator().manual_seed(5)
    w = torch.randn(width, 10, generator=teacher)
    for _ in range(steps):
        x = torch.randn(batch, width, generator=gen)
        yield x, (x @ w).argmax(1)


def _train(ddp, optimizer, rank, steps):
    losses = []
    for x, y in _batches(rank, steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def training(rank: int, world: int) -> dict:
    """20 steps of DDP with several buckets, for each topology and optimizer."""
    out = {}
    cases = [(t, "momentum", {}) for t in ROUTED] + [
        ("sharded", "adam", {}),
        ("ps", "adam", {}),
        ("sharded", "momentum", {"quantizer": "signsgd", "error_feedback": True}),
        ("allgather", "momentum", {"quantizer": "qsgd", "error_feedback": True, "min_numel": 0}),
        ("own-scales", "momentum", {}),
        ("own-scales", "adam", {"error_feedback": True, "min_numel": 0}),
    ]
    for topology, opt_name, options in cases:
        torch.manual_seed(0)
        model = MLP()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        state = terngrad.ddp.register(ddp, topology=topology, **{"min_numel": 100, **options})
        if opt_name == "adam":
            optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
        else:
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        losses = _train(ddp, optimizer, rank, 20)
        out[(topology, opt_name, str(options))] = {
            "params": [p.detach().clone() for p in model.parameters()],
            "losses": losses,
            "stats": state.stats,
            "bucket_layouts": len(state.reducer.planner.plans),
            "plans": [
                (sum(plan.sizes), plan.layout.n_buckets, [n for _, n in plan.excluded])
                for plan in state.reducer.planner.plans.values()
            ],
        }
    return out


def checkpoint(rank: int, world: int) -> dict:
    """Save the hook state mid-run, go on, restore, go on again: the same parameters."""
    torch.manual_seed(0)
    model = MLP()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    state = terngrad.ddp.register(ddp, quantizer="signsgd", error_feedback=True, min_numel=0)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    _train(ddp, optimizer, rank, 5)
    saved = (copy.deepcopy(state.state_dict()), copy.deepcopy(model.state_dict()),
             copy.deepcopy(optimizer.state_dict()))  # fmt: skip
    _train(ddp, optimizer, rank, 5)
    first = [p.detach().clone() for p in model.parameters()]
    first_stats = state.stats
    state.load_state_dict(saved[0])
    model.load_state_dict(saved[1])
    optimizer.load_state_dict(saved[2])
    _train(ddp, optimizer, rank, 5)
    other = terngrad.ddp.register(
        nn.parallel.DistributedDataParallel(MLP()), quantizer="terngrad", min_numel=0
    )
    try:
        other.load_state_dict(saved[0])
        error = None
    except ValueError as exc:
        error = str(exc)
    return {
        "first": first,
        "second": [p.detach().clone() for p in model.parameters()],
        "first_stats": first_stats,
        "second_stats": state.stats,
        "residual_norm": state.reducer.memory.norm(),
        "wrong_config_error": error,
    }


def bytes_against_fp32(rank: int, world: int) -> dict:
    """Bytes per step of the sharded TernGrad hook and of PyTorch's fp32 all-reduce hook."""
    widths = (784, 256, 256, 10)
    counter = ByteCounter()

    def counting_allreduce(process_group, bucket):
        ring = 2 * (world - 1) * bucket.buffer().numel() * 4 // world
        counter.add(ring, ring, 2 * (world - 1))
        return default_hooks.allreduce_hook(process_group, bucket)

    results = {}
    for hook in ("terngrad", "fp32"):
        torch.manual_seed(0)
        model = MLP(widths)
        ddp = nn.parallel.DistributedDataParallel(model)
        if hook == "terngrad":
            state = terngrad.ddp.register(ddp, topology="sharded")
        else:
            ddp.register_comm_hook(None, counting_allreduce)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            ddp(torch.randn(8, 784, generator=gen)).square().mean().backward()
        results[hook] = state.stats.bytes_sent_per_step if hook == "terngrad" else counter.sent / 3
        results["params"] = sum(p.numel() for p in model.parameters())
    return results


def mismatch(rank: int, world: int) -> str:
    ddp = nn.parallel.DistributedDataParallel(MLP())
    try:
        terngrad.ddp.register(ddp, clip=2.0 if rank == 1 else 2.5)
    except ValueError as exc:
        return str(exc)
    return "no error"


def error_feedback_regression(rank: int, world: int) -> dict:
    """Least squares with scaled sign and error feedback, through the Synchronizer."""
    teacher = torch.randn(20, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(256, 20, generator=gen)
    y = x @ teacher
    out = {}
    for feedback in (True, False):
        model = nn.Linear(20, 1, bias=False)
        sync = Synchronizer(
            model, "signsgd", "sharded", error_feedback=feedback, quantize_last=True, min_numel=0
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses, norms = [], []
        for _ in range(300):
            optimizer.zero_grad()
            loss = (model(x).squeeze(1) - y).square().mean()
            loss.backward()
            sync.step()
            optimizer.step()
            losses.append(loss.item())
            norms.append(sync.reducer.memory.norm() if feedback else 0.0)
        out[feedback] = {"losses": losses, "norms": norms, "weight": model.weight.detach().clone()}
    return out


def nan_training(rank: int, world: int) -> dict:
    """A NaN on one rank at step 2: every rank zeroes that step and counts it skipped."""
    torch.manual_seed(0)
    model = MLP()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    state = terngrad.ddp.register(ddp, min_numel=0)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    skipped = []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for step, (x, y) in enumerate(_batches(rank, 4)):
            optimizer.zero_grad()
            if step == 2 and rank == 0:
                x = x.clone()
                x[0, 0] = float("nan")
            nn.functional.cross_entropy(ddp(x), y).backward()
            skipped.append(state.last_step_skipped)
            if not state.last_step_skipped:
                optimizer.step()
    return {
        "skipped": skipped,
        "stats": state.stats,
        "params": [p.detach().clone() for p in model.parameters()],
    }


def ddp_against_synchronizer(rank: int, world: int) -> dict:
    """The same 5 steps through the DDP hook (several buckets, rebuilt after step 1), through
    the Synchronizer (one bucket), and through the DDP hook on the torch reference kernels:
    with every tensor ternarized and draws per parameter, all give the same bits."""
    out = {}
    for how in ("ddp", "synchronizer", "ddp-torch-kernels", "ddp-triton-kernels"):
        if how == "ddp-triton-kernels" and not triton_available():
            continue
        torch.manual_seed(0)
        model = MLP()
        options = {"quantize_last": True, "min_numel": 0, "seed": 3}
        if how.endswith("kernels"):
            options["kernels"] = how.split("-")[1]
        if how.startswith("ddp"):
            net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
            terngrad.ddp.register(net, **options)
            sync = None
        else:
            net, sync = model, Synchronizer(model, **options)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in _batches(rank, 5):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            if sync is not None:
                sync.step()
            optimizer.step()
        out[how] = [p.detach().clone() for p in model.parameters()]
    return out


def mixed_kernels(rank: int, world: int) -> dict:
    """Rank 0 on the fused kernels, the others on the torch reference: every backend gives the
    same bits, so registration accepts it and the replicas stay identical; a state saved on
    one backend loads into another."""
    torch.manual_seed(0)
    model = MLP()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    kernels = "numba" if rank == 0 else "torch"
    state = terngrad.ddp.register(ddp, kernels=kernels, min_numel=0, quantize_last=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    _train(ddp, optimizer, rank, 5)
    other = terngrad.ddp.register(
        nn.parallel.DistributedDataParallel(MLP()),
        kernels="torch" if rank == 0 else "numba",
        min_numel=0,
        quantize_last=True,
    )
    other.load_state_dict(state.state_dict())
    return {"params": [p.detach().clone() for p in model.parameters()], "kernels": kernels}


def auto_policy(rank: int, world: int) -> dict:
    """DDP with policy="auto": a given estimate (a slow link, a costly codec call) that sends
    the small bucket fp32 and quantizes the large one; and measured estimates."""
    from terngrad.comm.rank.policy import Estimate

    slow = Estimate(
        bytes_per_s=125e6, latency_s=50e-6, codec_fixed_s=2e-3, codec_s_per_element=1e-9
    )
    results = {}
    for case, estimate in (("given", slow), ("measured", None)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 300), nn.ReLU(), nn.Linear(300, 1000), nn.ReLU(),
                              nn.Linear(1000, 10))  # fmt: skip
        # DDP's first bucket (>= 1 MiB): layers 4 and 2 (301k elements); then layer 0 (9.9k)
        ddp = nn.parallel.DistributedDataParallel(model)
        state = terngrad.ddp.register(ddp, policy="auto", estimate=estimate, seed=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        _train(ddp, optimizer, rank, 4)
        results[case] = {
            "estimate": state.estimate,
            "decisions": dict(state.decisions),
            "stats": state.stats,
            "params": [p.detach().clone() for p in model.parameters()],
        }
    return results


def diverged_replicas(rank: int, world: int) -> str:
    """Rank 1 changes one weight by one ulp; every rank runs the replica check."""
    from terngrad.comm.rank.consistency import ReplicasDiverged, check_replicas

    torch.manual_seed(0)
    model = MLP()
    check_replicas(model, step=3)  # identical: passes
    if rank == 1:
        with torch.no_grad():
            w = model.body[2].weight
            w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0))
    try:
        check_replicas(model, step=4)
    except ReplicasDiverged as exc:
        return str(exc)
    return "no error"


def stuck_rank(rank: int, world: int) -> dict:
    """Rank 1 stalls for longer than the hook's 2 s timeout before its third step (several
    DDP buckets by then: the later ones must fail at once, not time out each)."""
    import time

    torch.manual_seed(0)
    model = MLP()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    terngrad.ddp.register(ddp, timeout=2.0)
    x = torch.randn(8, 32)
    for _ in range(2):  # together; DDP rebuilds its buckets (a sync) at the second forward
        ddp(x).square().mean().backward()
    start = time.perf_counter()
    if rank == 1:
        time.sleep(6)
    try:
        ddp(x).square().mean().backward()
        message = "no error"
    except Exception as exc:
        message = str(exc)
    return {"seconds": time.perf_counter() - start, "message": message}


def mismatched_runs(rank: int, world: int) -> str:
    """Rank 1 was started with another learning rate and model."""
    from terngrad.train.config import TrainConfig
    from terngrad.train.loop import check_same_run

    cfg = TrainConfig(out=f"/tmp/node{rank}", workers=world)
    if rank == 1:
        cfg = TrainConfig(out="/tmp/node1", workers=world, lr=0.5, model="mlp")
    try:
        check_same_run(cfg)
    except ValueError as exc:
        return str(exc)
    return "no error"


def nan_in_one_tensor(rank: int, world: int) -> dict:
    """A NaN in one tensor's gradient only (the last layer's bias, which the hook keeps in fp32
    and sends at the step's end) on rank 0 at step 1: every gradient of that step must be zero
    on every rank, through DDP and through the Synchronizer."""
    out = {}
    for path in ("ddp", "synchronizer"):
        torch.manual_seed(0)
        model = MLP()
        last, poison = model.body[-1].bias, [False]
        if rank == 0:
            last.register_hook(lambda g, on=poison: g.new_full(g.shape, math.nan) if on[0] else g)
        if path == "ddp":
            net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
            state = terngrad.ddp.register(net)
        else:
            net, sync = model, Synchronizer(model, bucket_cap_mb=0.004)
        zero = []
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for step, (x, y) in enumerate(_batches(rank, 3)):
                poison[0] = step == 1
                model.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                skipped = state.last_step_skipped if path == "ddp" else sync.step()
                grads = [p.grad for p in model.parameters()]
                zero.append((skipped, all(bool((g == 0).all()) for g in grads)))
        out[path] = zero
    return out


def level_kernels_by_backend(rank: int, world: int) -> dict:
    """How many times the fused level kernels (fit and pack) ran for an ORQ exchange, by
    ``kernels`` and ``aggregate``; and the means, which must not depend on ``kernels``."""
    from terngrad.comm import Options
    from terngrad.comm.rank.reducer import Reducer
    from terngrad.kernels import NumbaKernels

    calls = []
    originals = {op: getattr(NumbaKernels, op) for op in ("level_fit", "level_pack")}

    def counting(op):
        def counted(self, *args):
            calls.append(op)
            return originals[op](self, *args)

        return counted

    for op in originals:
        setattr(NumbaKernels, op, counting(op))
    out = {}
    try:
        for kernels, aggregate in itertools.product(
            ("auto", "numba", "torch"), ("requantize", "coherent")
        ):
            p = torch.nn.Parameter(torch.zeros(1500))
            options = Options.of(
                "orq", "allgather", kernels=kernels, aggregate=aggregate, min_numel=0, seed=5
            )
            reducer = Reducer(options, [("w", p)], set())
            buffer = local_gradient(rank)[:1500].clone()
            before = len(calls)
            reducer.reduce_bucket(buffer, [p])
            reducer.finish_step()
            out[kernels, aggregate] = (sorted(set(calls[before:])), buffer)
    finally:
        for op, original in originals.items():
            setattr(NumbaKernels, op, original)
    return out


#: the level quantizers of Algorithm 2 (the optimal-quantization paper), clipped or not
ALGORITHM2 = [
    ("orq", {"levels": 5, "bucket_size": 64}),
    ("orq", {"levels": 3, "bucket_size": 100, "clip": 2.5}),
    ("linear", {"levels": 5, "bucket_size": 64}),
    ("bingrad-b", {"bucket_size": 64}),
    ("bingrad-pb", {"bucket_size": 64, "clip": 2.5}),
    ("signsgd", {"bucket_size": 64}),
]


def algorithm2(rank: int, world: int) -> dict:
    """Both broadcast options (coherent levels; re-quantized with server error feedback) of
    every ALGORITHM2 quantizer through every topology, twice in a row (the second exchange
    carries the first's server residual), on one flat gradient per rank; then DDP training
    with coherent levels through the parameter server and the sharded exchange."""
    link = Link(dist.new_group())
    g = local_gradient(rank)
    out = {}
    for (name, options), topology in itertools.product(ALGORITHM2, ROUTED):
        q = quantize.get(name, **options)
        layout = Layout.of(g.numel(), SEGMENTS, q.bucket_size)
        for aggregate in ("coherent", "requantize"):
            settings = ExchangeSettings(aggregate)
            exchange = make_exchange(topology, q, link, settings, resolve("numba"))
            gen = torch.Generator().manual_seed(rank_seed(8, rank))
            for repeat in range(2):
                out[(name, str(options), topology, aggregate, repeat)] = _measured(
                    link, exchange, g, layout, draws(rank), gen
                )
    for topology, aggregate in itertools.product(("ps", "sharded"), ("coherent", "requantize")):
        torch.manual_seed(0)
        model = MLP()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        terngrad.ddp.register(
            ddp, quantizer="orq", topology=topology, aggregate=aggregate, clip=2.5, min_numel=100
        )
        losses = _train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9), rank, 20)
        out[("training", topology, aggregate)] = {
            "params": [p.detach().clone() for p in model.parameters()],
            "losses": losses,
        }
    return out


def full_precision_warmup(rank: int, world: int) -> dict:
    """``full_precision_steps=2``: per step, the DDP gradients against the exact mean of the
    ranks' local gradients, the bytes the step sent, and the error-feedback residual."""
    torch.manual_seed(0)
    model = MLP()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
    state = terngrad.ddp.register(
        ddp, topology="sharded", full_precision_steps=2, error_feedback=True, min_numel=0
    )
    local = copy.deepcopy(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = []
    for x, y in _batches(rank, 4):
        local.load_state_dict(model.state_dict())
        local.zero_grad()
        nn.functional.cross_entropy(local(x), y).backward()
        exact = torch.cat([p.grad.flatten() for p in local.parameters()])
        dist.all_reduce(exact)
        exact /= world
        sent = state.stats.bytes_sent
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        steps.append({
            "equal": torch.equal(torch.cat([p.grad.flatten() for p in model.parameters()]), exact),
            "sent": state.stats.bytes_sent - sent,
            "residual": state.reducer.memory.norm(),
        })  # fmt: skip
        optimizer.step()
    return {"steps": steps, "params": sum(p.numel() for p in model.parameters())}


WIDER = (32, 48, 40, 40, 10)  # weights of 1536, 1920, 1600 elements: a DDP bucket each


def fused_buckets(rank: int, world: int) -> dict:
    """5 steps of DDP (one bucket per weight, rebuilt after step 1; the last layer and the
    biases deferred in fp32) with ``fuse_buckets`` off and on, for TernGrad with and without
    error feedback and for QSGD: the parameters, the collective rounds of the last step, and a
    fused run's state loaded into an unfused hook."""
    out: dict = {}
    for name, options in (
        ("terngrad", {}),
        ("terngrad-ef", {"error_feedback": True}),
        ("qsgd", {"quantizer": "qsgd"}),
        ("terngrad-own", {"topology": "own-scales"}),
    ):
        for fuse in (False, True):
            torch.manual_seed(0)
            model = MLP(WIDER)
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
            state = terngrad.ddp.register(ddp, fuse_buckets=fuse, seed=3, **options)
            rounds: list[str] = []
            for link, collective in (
                *((state.reducer.link, c) for c in ("all_reduce", "all_to_all", "all_gather")),
                (state.reducer.side, "start_all_reduce"),  # the deferred fp32 tensors
            ):
                real = getattr(link, collective)

                def counted(*args, _real=real, _name=collective, _rounds=rounds, **kwargs):
                    _rounds.append(_name)
                    return _real(*args, **kwargs)

                setattr(link, collective, counted)
            real_bucket = state._run_bucket

            def bucket(*args, _real=real_bucket, _rounds=rounds):
                _rounds.append("bucket")
                return _real(*args)

            state._run_bucket = bucket
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for x, y in _batches(rank, 5):
                rounds.clear()
                optimizer.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                optimizer.step()
            out[name, fuse] = {
                "params": [p.detach().clone() for p in model.parameters()],
                "rounds": list(rounds),
                "state": state.state_dict(),
            }
    unfused = terngrad.ddp.register(
        nn.parallel.DistributedDataParallel(MLP(WIDER), bucket_cap_mb=0.004), error_feedback=True,
        seed=3,
    )  # fmt: skip
    unfused.load_state_dict(out["terngrad-ef", True]["state"])  # a fused run's state loads
    out["loaded"] = unfused.reducer.memory.norm()
    try:
        Synchronizer(MLP(), fuse_buckets=True)
    except ValueError as e:
        out["synchronizer"] = str(e)
    return out


def fitted_feedback(rank: int, world: int, clip: float | None, topology: str, steps: int) -> dict:
    """Error feedback on fresh Gaussian gradients every step, plain and with ``fit_scale``
    (through the Synchronizer): the residual's norm each step, the first step's means (the
    same draws in both) and every rank's first gradient (to rebuild the fitted values)."""
    out: dict = {}
    for fit in (False, True):
        model = nn.Linear(64, 64, bias=False)
        sync = Synchronizer(
            model, "terngrad", topology, clip=clip, error_feedback=True, fit_scale=fit,
            quantize_last=True, min_numel=0, seed=5,
        )  # fmt: skip
        gen = torch.Generator().manual_seed(200 + rank)
        norms, means, sent, true = [], [], torch.zeros(64 * 64), torch.zeros(64 * 64)
        for _ in range(steps):
            g = torch.randn(64, 64, generator=gen)
            model.weight.grad = g.clone()
            sync.step()
            mean = model.weight.grad.reshape(-1).clone()
            total = g.reshape(-1).clone()
            dist.all_reduce(total)
            sent += mean
            true += total / world
            norms.append(sync.reducer.memory.norm() / float(g.norm()))
            means.append(mean)
        out[fit] = {
            "norms": norms,
            "first_mean": means[0],
            "last_mean": means[-1],
            "drift": float((sent - true).norm() / true.norm()),
        }
    firsts = [torch.empty(64 * 64) for _ in range(world)]
    dist.all_gather(firsts, torch.randn(64, 64, generator=torch.Generator().manual_seed(
        200 + rank)).reshape(-1))  # fmt: skip
    out["gradients"] = firsts
    return out
