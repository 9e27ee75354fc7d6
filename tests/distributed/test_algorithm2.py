"""Algorithm 2 of the optimal-quantization paper (Xu, Huo, Huang 2020) on 3 real gloo ranks:
the level quantizers through the parameter server, the sharded exchange and all-gather, with
both broadcast options — levels coherent among the workers (``aggregate="coherent"``) and the
average re-quantized with server-side error feedback (``aggregate="requantize"``).

The coherent means are rebuilt here from the ranks' gradients and seeds, bit for bit; the byte
counts are the frames' exact sizes."""

import itertools

import comm_workers as w
import pytest
import torch
from ranks import run

from terngrad import quantize
from terngrad.comm import TOPOLOGIES, Options, rank_seed, shard_bounds
from terngrad.comm.exchanges.coherent import bucket_shard_bounds
from terngrad.quantize import Layout
from terngrad.wire import Codec, frame_nbytes

#: the topologies that route codes on the quantizer's path (own-scales: its own cases)
ROUTED = tuple(t for t in TOPOLOGIES if t != "own-scales")

WORLD = 3


@pytest.fixture(scope="module")
def results():
    return run(w.algorithm2, WORLD)


def _rebuild(name, options):
    """Each rank's prepared gradient, the agreed scales, each rank's digits and values."""
    q = quantize.get(name, **options)
    grads = [w.local_gradient(r) for r in range(WORLD)]
    layout = Layout.of(grads[0].numel(), w.SEGMENTS, q.bucket_size)
    prepared = [q.prepare(g, layout) for g in grads]
    scales = q.coherent_scales(torch.stack([q.scales(y, layout) for y in prepared]))
    uniform = [w.draws(r).uniform(w.SEGMENTS) if q.stochastic else None for r in range(WORLD)]
    digits = [q.round_onto(y, layout, scales, u) for y, u in zip(prepared, uniform, strict=True)]
    values = [q.dequantize(scales.reshape(-1), d, layout, q.levels) for d in digits]
    return q, layout, scales, values


def _in_order_mean(values):
    total = values[0].clone()
    for v in values[1:]:
        total += v
    return total / len(values)


def _rerounded(q, layout, scales, mean, lo, hi, owner):
    """The owner's re-rounding of ``mean[lo:hi]`` onto the shared levels (its generator is the
    exchange's: fresh per case, seeded rank_seed(8, owner))."""
    gen = torch.Generator().manual_seed(rank_seed(8, owner))
    starts = layout.bucket_starts.tolist()
    first, last = starts.index(lo), starts.index(hi)
    part = layout.slice(lo, hi)
    digits = q.round_onto(mean[lo:hi], part, scales[first:last], torch.rand(hi - lo, generator=gen),
                          rounding="stochastic")  # fmt: skip
    return q.dequantize(scales[first:last].reshape(-1), digits, part, q.levels)


def _frame(q, numel):
    return frame_nbytes(1, 0, Codec.base(q.levels).nbytes(numel))


@pytest.mark.parametrize("topology", ROUTED)
@pytest.mark.parametrize("name, options", w.ALGORITHM2, ids=str)
def test_coherent_levels_give_the_rebuilt_mean_on_every_rank(results, name, options, topology):
    q, layout, scales, values = _rebuild(name, options)
    exact = _in_order_mean(values)
    if topology == "allgather":
        expected = exact  # averaged where it is used: nothing re-rounded
    elif topology == "ps":
        expected = _rerounded(q, layout, scales, exact, 0, layout.numel, 0)
    else:
        bounds = bucket_shard_bounds(layout, WORLD)
        expected = torch.cat(
            [_rerounded(q, layout, scales, exact, a, b, r) for r, (a, b) in enumerate(bounds)]
        )
    for rank, out in enumerate(results):
        got = out[(name, str(options), topology, "coherent", 0)]
        assert torch.equal(got["mean"], expected), f"rank {rank}"
        assert torch.equal(got["own"], values[rank])
        again = out[(name, str(options), topology, "coherent", 1)]
        assert torch.equal(again["own"], values[rank])  # no residual: the same levels again
    if topology != "allgather":  # the broadcast is low-bit: every value is a shared level
        levels = q._levels(scales, q.levels)
        per_element = levels.repeat_interleave(layout.bucket_lengths, dim=0)
        assert bool((per_element == expected[:, None]).any(1).all())
        assert not torch.equal(expected, exact)


@pytest.mark.parametrize("name, options", w.ALGORITHM2, ids=str)
def test_rerounding_onto_the_shared_levels_is_unbiased(name, options):
    """The aggregate's rounding is random and unbiased even for the nearest-rounding methods
    (BinGrad-b, sign): over 4,000 draws every element's mean is within 5 standard errors
    (from the exact variance ``(b_{i+1} - x)(x - b_i)`` of its cell) of the exact average."""
    q, _, scales, values = _rebuild(name, options)
    size = q.bucket_size
    exact, scales = _in_order_mean(values)[: 3 * size], scales[:3]  # three whole buckets
    reps = 4000
    big = Layout.of(exact.numel() * reps, None, size)
    uniform = torch.rand(big.numel, generator=torch.Generator().manual_seed(3))
    digits = q.round_onto(exact.repeat(reps), big, scales.repeat(reps, 1), uniform, "stochastic")
    draws = q.dequantize(scales.repeat(reps, 1).reshape(-1), digits, big, q.levels)
    draws = draws.view(reps, -1).double()
    lengths = torch.full((3,), size)
    levels = q._levels(scales, q.levels).repeat_interleave(lengths, dim=0).double()
    x = exact.double()[:, None]
    lo = torch.where(levels <= x, levels, -torch.inf).amax(1)
    hi = torch.where(levels >= x, levels, torch.inf).amin(1)
    se = ((hi - x[:, 0]) * (x[:, 0] - lo) / reps).sqrt()
    assert bool(((draws.mean(0) - x[:, 0]).abs() <= 5 * se + 1e-6).all())


@pytest.mark.parametrize("topology", ROUTED)
@pytest.mark.parametrize("name, options", w.ALGORITHM2, ids=str)
def test_coherent_bytes_are_the_exact_frame_sizes(results, name, options, topology):
    """A finite flag (ring all-reduce), the scales all-gathered (k float32 per bucket from each
    rank), then digit frames without scales: log2(s) bits an element plus a header."""
    q = quantize.get(name, **options)
    d = sum(w.SEGMENTS)
    layout = Layout.of(d, w.SEGMENTS, q.bucket_size)
    flag = 2 * (WORLD - 1) * 4 // WORLD
    scales = (WORLD - 1) * layout.n_buckets * q._scales_per_bucket(q.levels) * 4
    whole = _frame(q, d)
    shards = [_frame(q, b - a) for a, b in bucket_shard_bounds(layout, WORLD)]
    for r, out in enumerate(results):
        got = out[(name, str(options), topology, "coherent", 0)]
        if topology == "ps":
            sent = (WORLD - 1) * whole if r == 0 else whole
            received = (WORLD - 1) * whole if r == 0 else whole
        elif topology == "sharded":
            sent = sum(shards) - shards[r] + (WORLD - 1) * max(shards)
            received = (WORLD - 1) * shards[r] + (WORLD - 1) * max(shards)
        else:
            sent = received = (WORLD - 1) * whole
        assert (got["sent"], got["received"]) == (flag + scales + sent, flag + scales + received)


@pytest.mark.parametrize("topology", ["ps", "sharded"])
@pytest.mark.parametrize("name, options", w.ALGORITHM2, ids=str)
def test_requantized_average_is_identical_everywhere_and_counted_exactly(
    results, name, options, topology
):
    """Option b: the same mean on every rank; the bytes are a finite flag and the messages
    (with their scales) both ways: the ranks' to the aggregator, the re-quantized average back."""
    q = quantize.get(name, **options)
    d = sum(w.SEGMENTS)
    layout = Layout.of(d, w.SEGMENTS, q.bucket_size)
    first = [out[(name, str(options), topology, "requantize", 0)] for out in results]
    assert all(torch.equal(f["mean"], first[0]["mean"]) for f in first[1:])
    flag = 2 * (WORLD - 1) * 4 // WORLD
    if topology == "ps":
        whole = q.message_nbytes(d, layout.segments)
        expected = [((WORLD - 1) * whole, (WORLD - 1) * whole)] + [(whole, whole)] * (WORLD - 1)
    else:
        bounds = shard_bounds(d, WORLD)
        msgs = [q.message_nbytes(b - a, layout.slice(a, b).segments) for a, b in bounds]
        expected = [
            (sum(msgs) - msgs[r] + (WORLD - 1) * max(msgs), (WORLD - 1) * (msgs[r] + max(msgs)))
            for r in range(WORLD)
        ]
    got = [(f["sent"] - flag, f["received"] - flag) for f in first]
    assert got == expected


@pytest.mark.parametrize("topology", ["ps", "sharded"])
@pytest.mark.parametrize("name", ["bingrad-b", "signsgd"])
def test_requantized_average_carries_the_server_residual(results, name, topology):
    """Deterministic methods (same draws twice): the second exchange of the same gradient differs
    from the first only through the server's error feedback, and the two together are nearer
    the exact mean than the first alone."""
    options = dict(w.ALGORITHM2)[name]
    first = [out[(name, str(options), topology, "requantize", 0)] for out in results]
    second = results[0][(name, str(options), topology, "requantize", 1)]["mean"]
    exact = _in_order_mean([f["own"] for f in first])
    assert not torch.equal(first[0]["mean"], second)
    one = float((first[0]["mean"] - exact).norm())
    two = float(((first[0]["mean"] + second) / 2 - exact).norm())
    assert two < one


def test_shards_end_at_bucket_boundaries():
    layout = Layout.of(sum(w.SEGMENTS), w.SEGMENTS, 64)
    bounds = bucket_shard_bounds(layout, 4)
    starts = set(layout.bucket_starts.tolist())
    assert bounds[0][0] == 0 and bounds[-1][1] == layout.numel
    assert all(a in starts and b in starts for a, b in bounds)
    assert all(b1 == a2 for (_, b1), (a2, _) in itertools.pairwise(bounds))
    equal = [b - a for a, b in shard_bounds(layout.numel, 4)]
    assert max(abs((b - a) - n) for (a, b), n in zip(bounds, equal, strict=True)) <= 64
    few = Layout.of(10, None, 4)  # 3 buckets, 4 shards: one is empty
    assert [b - a for a, b in bucket_shard_bounds(few, 4)].count(0) == 1


@pytest.mark.parametrize("aggregate", ["coherent", "requantize"])
@pytest.mark.parametrize("topology", ["ps", "sharded"])
def test_training_with_either_broadcast_keeps_replicas_identical(results, topology, aggregate):
    """ORQ-5 clipped under DDP, 20 steps, several buckets: the replicas end bit for bit equal."""
    key = ("training", topology, aggregate)
    first = results[0][key]
    for out in results[1:]:
        for a, b in zip(first["params"], out[key]["params"], strict=True):
            assert torch.equal(a, b)
    losses = first["losses"]
    assert sum(losses[-5:]) < sum(losses[:5])


def test_coherent_is_refused_for_quantizers_without_levels_to_agree():
    for name in ("terngrad", "fp16"):  # the type says it: coherent serves the level quantizers
        with pytest.raises(
            ValueError,
            match=f"aggregate 'coherent' serves the level quantizers "
            rf"\(linear, orq, bingrad-b, bingrad-pb, signsgd\); {name} is not one",
        ):
            Options(quantizer=name, aggregate="coherent")
    assert Options(quantizer="bingrad-b", aggregate="coherent").aggregate == "coherent"
