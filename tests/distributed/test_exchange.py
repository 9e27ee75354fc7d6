"""The distributed layer in real multi-process gloo runs (2 and 4 ranks, timeouts set)."""

import itertools
import math

import comm_workers as w
import pytest
import torch
from ranks import run

from terngrad import quantize
from terngrad.comm import TOPOLOGIES, shard_bounds
from terngrad.comm.exchanges.traffic import grid_traffic
from terngrad.kernels import triton_available
from terngrad.quantize import Layout
from terngrad.wire import codes_frame_nbytes

#: the topologies that route codes on the quantizer's path (own-scales: its own cases)
ROUTED = tuple(t for t in TOPOLOGIES if t != "own-scales")


@pytest.fixture(scope="module", params=[2, 4])
def exchanged(request):
    return request.param, run(w.exchanges, request.param)


def _expected_grid_mean(name, options, world):
    """The mean of every rank's quantized gradient on the shared grid, rebuilt here from the
    ranks' gradients and seeds: local scales, MAX, codes, integer sum, s * sum / (N m)."""
    q = quantize.get(name, **options)
    grads = [w.local_gradient(r) for r in range(world)]
    layout = Layout.of(grads[0].numel(), w.SEGMENTS, q.bucket_size)
    shared = torch.stack([q.local_scales(g, w.SEGMENTS) for g in grads]).amax(0)
    codes = [
        q.quantize(g, layout, scale=shared, uniform=w.draws(r).uniform(w.SEGMENTS))[1] - q.m
        for r, g in enumerate(grads)
    ]
    mean = q.decode_codes(shared, sum(codes), layout, world)
    owns = [q.decode_codes(shared, c, layout) for c in codes]
    return mean, owns, q, layout


def _frames(sizes, count, m):
    return [codes_frame_nbytes(n, count, m) for n in sizes]


@pytest.fixture(scope="module", params=[2, 4])
def trained(request):
    return request.param, run(w.training, request.param)


def _ring(nbytes, world):
    return 2 * (world - 1) * nbytes // world


def _hook_bytes(topology, world, rank, d, n_scales):
    """Bytes one rank sends for one bucket's quantized tensors of TernGrad (m = 1)."""
    sent = 0
    if not d:
        return sent
    sent += _ring(4 * (n_scales + 1), world)  # scales and the non-finite flag
    if topology == "sharded":
        sizes = [b - a for a, b in shard_bounds(d, world)]
        one, agg = _frames(sizes, 1, 1), _frames(sizes, world, 1)
        return sent + sum(one) - one[rank] + (world - 1) * max(agg)
    whole, whole_agg = codes_frame_nbytes(d, 1, 1), codes_frame_nbytes(d, world, 1)
    if topology == "ps":
        return sent + ((world - 1) * whole_agg if rank == 0 else whole)
    return sent + (world - 1) * whole


@pytest.mark.parametrize("kernels", w.KERNELS)
@pytest.mark.parametrize("name, options", w.GRID, ids=str)
@pytest.mark.parametrize("topology", ROUTED)
def test_grid_exchange_is_the_exact_mean(exchanged, name, options, topology, kernels):
    """Fused kernels and the torch reference both give the mean rebuilt here, bit for bit."""
    world, results = exchanged
    mean, owns, _, _ = _expected_grid_mean(name, options, world)
    for rank, out in enumerate(results):
        got = out[(name, str(options), topology, "requantize", kernels)]
        assert torch.equal(got["mean"], mean), f"rank {rank}"
        assert torch.equal(got["own"], owns[rank])


@pytest.mark.parametrize("kernels", w.KERNELS)
@pytest.mark.parametrize("name, options", w.GRID, ids=str)
def test_own_scales_give_the_rank_order_mean_in_one_collective(exchanged, name, options,
                                                               kernels):  # fmt: skip
    """``own_scales``: every rank rounds on its own scales; every rank gets the mean of the
    decoded messages summed in rank order (rebuilt here, bit for bit), on both backends, and
    sends its message (and a byte: finite or not) once to each other rank — no round of
    scales before it."""
    world, results = exchanged
    q = quantize.get(name, **options)
    grads = [w.local_gradient(r) for r in range(world)]
    layout = Layout.of(grads[0].numel(), w.SEGMENTS, q.bucket_size)
    owns = []
    for r, g in enumerate(grads):
        own = q.local_scales(g, w.SEGMENTS)
        codes = q.quantize(g, layout, scale=own, uniform=w.draws(r).uniform(w.SEGMENTS))[1]
        owns.append(q.decode_codes(own, codes - q.m, layout))
    total = owns[0].clone()
    for o in owns[1:]:
        total += o
    mean = total / world
    shared = results[0][(name, str(options), "allgather", "requantize", kernels)]["mean"]
    assert not torch.equal(mean, shared)  # a different estimate from scalar sharing's
    message = q.message_nbytes(layout.numel, w.SEGMENTS) + 1
    for rank, out in enumerate(results):
        got = out[("own", name, str(options), kernels)]
        assert torch.equal(got["mean"], mean), f"rank {rank}"
        assert torch.equal(got["own"], owns[rank])
        assert got["sent"] == got["received"] == (world - 1) * message
        mean_inplace, own, written = out[("own-inplace", name, str(options), kernels)]
        assert own is None and torch.equal(mean_inplace, mean) and torch.equal(written, mean)


def test_own_scales_skip_a_non_finite_step_on_every_rank(exchanged):
    """The rank with a NaN flags its message: every rank sees the flag and skips."""
    _, results = exchanged
    for (name, options), kernels in itertools.product(w.GRID, w.KERNELS):
        assert all(out[("own-nan", name, str(options), kernels)].mean is None for out in results)


def test_grid_mean_is_unbiased_estimate_of_true_mean(exchanged):
    """Sanity: the exact ternary mean is close to the float mean (it is one unbiased draw)."""
    world, results = exchanged
    true = sum(w.local_gradient(r) for r in range(world)) / world
    got = results[0][("terngrad", "{}", "sharded", "requantize", "numba")]["mean"]
    cos = float(torch.nn.functional.cosine_similarity(got, true, dim=0))
    assert cos > 0.5


@pytest.mark.parametrize("kernels", w.KERNELS)
@pytest.mark.parametrize("name, options", w.MESSAGES, ids=str)
@pytest.mark.parametrize("topology", ROUTED)
def test_message_exchange_identical_on_every_rank(exchanged, name, options, topology, kernels):
    world, results = exchanged
    key = (name, str(options), topology, "requantize", kernels)
    means = [out[key]["mean"] for out in results]
    for m in means[1:]:
        assert torch.equal(m, means[0])
    owns = [out[key]["own"] for out in results]
    if name == "fp32" or topology == "allgather":
        # nothing re-quantized: exactly the mean of the decoded messages, in rank order
        total = owns[0].clone()
        for o in owns[1:]:
            total += o
        assert torch.equal(means[0], total / world)
    else:
        exact = sum(owns) / world
        rel = float((means[0] - exact).norm() / exact.norm())
        assert rel < (0.02 if name == "fp16" else 1.5)
    other = results[0][(*key[:-1], "torch")]["mean"]
    assert torch.equal(means[0], other)  # the same draws through either backend


def test_fp16_aggregate_option(exchanged):
    world, results = exchanged
    for topology in ("sharded", "ps"):
        key = ("linear", str({"bucket_size": 64}), topology, "fp16", "numba")
        owns = [out[key]["own"] for out in results]
        exact = sum(owns) / world
        got = results[0][key]["mean"]
        assert float((got - exact).abs().max()) <= float(exact.abs().max()) * 2**-10


def test_non_finite_gradient_skips_on_every_rank(exchanged):
    _, results = exchanged
    for name in ("terngrad", "linear"):
        for topology in ROUTED:
            for kernels in w.KERNELS:
                assert all(out[("nan", name, topology, kernels)] is None for out in results)


@pytest.mark.parametrize("name, options", w.GRID, ids=str)
def test_bytes_match_the_analytic_count(exchanged, name, options):
    """Counted bytes equal the frames' exact sizes; those are the ideal bit counts plus headers."""
    world, results = exchanged
    q = quantize.get(name, **options)
    d = sum(w.SEGMENTS)
    layout = Layout.of(d, w.SEGMENTS, q.bucket_size)
    # ring all-reduce of the scales and the non-finite flag
    scales = 2 * (world - 1) * 4 * (layout.n_buckets + 1) // world
    sizes = [b - a for a, b in shard_bounds(d, world)]
    one, agg = _frames(sizes, 1, q.m), _frames(sizes, world, q.m)
    for r, out in enumerate(results):
        by_topology = {t: out[(name, str(options), t, "requantize", "numba")] for t in ROUTED}
        get = by_topology.__getitem__
        sent = scales + sum(one) - one[r] + (world - 1) * max(agg)
        received = scales + (world - 1) * one[r] + (world - 1) * max(agg)
        assert (get("sharded")["sent"], get("sharded")["received"]) == (sent, received)
        whole, whole_agg = codes_frame_nbytes(d, 1, q.m), codes_frame_nbytes(d, world, q.m)
        if r == 0:
            expected_ps = (scales + (world - 1) * whole_agg, scales + (world - 1) * whole)
        else:
            expected_ps = (scales + whole, scales + whole_agg)
        assert (get("ps")["sent"], get("ps")["received"]) == expected_ps
        assert get("allgather")["sent"] == scales + (world - 1) * whole
        for t in ROUTED:  # the model's traffic formula is what the link counted
            model = grid_traffic(t, d, layout.n_buckets, world, q.m)[r]
            assert (model.sent, model.received) == (get(t)["sent"], get(t)["received"]), t
        # against the idealised (N-1)/N d (log2(2m+1) + log2(2Nm+1)) bits, sharded:
        ideal = (world - 1) / world * d * (math.log2(2 * q.m + 1) + math.log2(2 * world * q.m + 1))
        overhead = scales + 2 * (world - 1) * (52 + 8)  # headers and a word of padding a frame
        assert ideal / 8 <= get("sharded")["sent"] <= ideal / 8 * 1.1 + overhead


def test_training_keeps_replicas_bitwise_identical(trained):
    _, results = trained
    for case, first in results[0].items():
        for rank, out in enumerate(results[1:], start=1):
            for a, b in zip(first["params"], out[case]["params"], strict=True):
                assert torch.equal(a, b), f"{case}: rank {rank} diverged"
        assert first["stats"].steps == 20
        assert first["stats"].skipped_steps == 0
        assert first["bucket_layouts"] >= 3  # one bucket at step 1, several after DDP's rebuild
        losses = first["losses"]
        assert all(math.isfinite(x) for x in losses)
        assert sum(losses[-5:]) < sum(losses[:5]), f"{case} did not learn"


@pytest.mark.parametrize("topology", ROUTED)
def test_hook_stats_match_the_analytic_count(trained, topology):
    """The last step used DDP's rebuilt buckets (every plan but the first)."""
    world, results = trained
    for rank, out in enumerate(results):
        case = out[(topology, "momentum", "{}")]
        plans = case["plans"][1:]
        expected = sum(_hook_bytes(topology, world, rank, d, k) for d, k, _ in plans)
        expected += _ring(4 * sum(sum(excluded) for _, _, excluded in plans), world)  # at the end
        assert case["stats"].last_step_bytes_sent == expected


def test_stats_count_every_step(trained):
    _, results = trained
    stats = results[0][("sharded", "momentum", "{}")]["stats"]
    assert stats.bytes_sent > 0 and stats.bytes_received > 0
    assert stats.last_step_bytes_sent > 0
    assert stats.bytes_sent_per_step == pytest.approx(stats.bytes_sent / 20)


def test_checkpoint_round_trip():
    results = run(w.checkpoint, 2)
    for out in results:
        for a, b in zip(out["first"], out["second"], strict=True):
            assert torch.equal(a, b)
        assert out["first_stats"] == out["second_stats"]
        assert out["residual_norm"] > 0
        assert "another configuration" in out["wrong_config_error"]
        assert "quantizer='signsgd' instead of 'terngrad'" in out["wrong_config_error"]


def test_sharded_terngrad_moves_10x_fewer_bytes_than_fp32_allreduce():
    results = run(w.bytes_against_fp32, 4)
    for out in results:
        assert out["fp32"] >= 10 * out["terngrad"], out


def test_mismatched_settings_fail_fast_on_every_rank():
    messages = run(w.mismatch, 2)
    for text in messages:
        assert "registered different exchange configurations" in text
        assert "rank 1: quantizer_options.clip=2.0 instead of 2.5" in text


def test_error_feedback_makes_scaled_sign_converge():
    results = run(w.error_feedback_regression, 2)
    with_ef = results[0][True]
    losses, norms = with_ef["losses"], with_ef["norms"]
    assert losses[-1] < 1e-3 * losses[0]
    assert max(norms[150:]) <= 1.5 * max(norms[:150])  # the residual stays bounded
    assert torch.equal(with_ef["weight"], results[1][True]["weight"])
    assert losses[-1] < results[0][False]["losses"][-1]  # and it beats sign without feedback


def test_nan_on_one_rank_skips_the_step_everywhere():
    results = run(w.nan_training, 2)
    for out in results:
        assert out["skipped"] == [False, False, True, False]
        assert out["stats"].skipped_steps == 1 and out["stats"].steps == 4
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert torch.equal(a, b) and bool(torch.isfinite(a).all())


def test_ddp_and_synchronizer_agree_bit_for_bit():
    for out in run(w.ddp_against_synchronizer, 2):
        assert "ddp-triton-kernels" in out or not triton_available()
        for variant in out.values():  # one bucket or several; numba, torch or Triton kernels
            for a, b in zip(out["ddp"], variant, strict=True):
                assert torch.equal(a, b)


def test_ranks_on_different_kernel_backends_stay_identical():
    results = run(w.mixed_kernels, 2)
    assert [out["kernels"] for out in results] == ["numba", "torch"]
    for a, b in zip(results[0]["params"], results[1]["params"], strict=True):
        assert torch.equal(a, b)


def test_auto_policy_quantizes_only_the_buckets_where_it_pays():
    from terngrad.comm.exchanges.traffic import ring_bytes

    world = 2
    results = run(w.auto_policy, world)
    for case in ("given", "measured"):
        first = results[0][case]
        for out in results[1:]:  # the same measurements, choices and parameters on every rank
            assert out[case]["estimate"] == first["estimate"]
            assert out[case]["decisions"] == first["decisions"]
            for a, b in zip(first["params"], out[case]["params"], strict=True):
                assert torch.equal(a, b)
    decisions = results[0]["given"]["decisions"]  # biases (< 1024 elements) stay fp32
    big, small = decisions[("2.weight",)], decisions[("0.weight",)]  # DDP's rebuilt buckets
    assert big.quantize and big.quantized_seconds < big.fp32_seconds
    assert not small.quantize  # 9.6k elements: the codec's 2 ms per call costs more than it saves
    # last step: 2.weight quantized; bucket 2 all fp32 in one all-reduce; the last layer and
    # 2.bias in the deferred fp32 all-reduce at the step's end
    q = quantize.get("terngrad")
    expected = (
        ring_bytes(4 * (1000 * 10 + 10 + 1000), world)
        + grid_traffic("sharded", 300000, 1, world, q.m)[0].sent
        + ring_bytes(4 * (9600 + 300), world)
    )
    assert results[0]["given"]["stats"].last_step_bytes_sent == expected


def test_nan_in_one_tensor_zeroes_the_whole_step_everywhere():
    for out in run(w.nan_in_one_tensor, 2):
        for path in ("ddp", "synchronizer"):
            assert out[path] == [(False, False), (True, True), (False, False)], path


def test_kernels_torch_keeps_the_level_quantizers_on_the_reference():
    """``kernels="torch"`` means the reference for every quantizer, the level quantizers'
    messages and coherent levels included: the exchange passes its backend to every
    ``encode``, ``decode`` and fit; "auto" and "numba" run the numba level kernels."""
    for result in run(w.level_kernels_by_backend, 2):
        for aggregate, fused in (("requantize", ["level_fit", "level_pack"]),
                                 ("coherent", ["level_fit"])):  # fmt: skip
            assert result["auto", aggregate][0] == fused
            assert result["numba", aggregate][0] == fused
            assert result["torch", aggregate][0] == []
            mean = result["torch", aggregate][1]
            assert torch.equal(result["auto", aggregate][1], mean)  # the same bytes either way
            assert torch.equal(result["numba", aggregate][1], mean)


def test_full_precision_steps_average_exactly_then_quantize():
    # 2 ranks: a sum of two floats does not depend on the order, so the warm-up's mean is
    # bitwise the mean of the local gradients
    for out in run(w.full_precision_warmup, 2):
        steps, fp32_ring = out["steps"], 2 * (2 - 1) * 4 * out["params"] // 2
        assert [s["equal"] for s in steps] == [True, True, False, False]
        assert [s["sent"] for s in steps[:2]] == [fp32_ring, fp32_ring]  # all-reduced fp32
        assert all(0 < s["sent"] < fp32_ring / 4 for s in steps[2:]), steps  # ternary after
        assert [s["residual"] == 0 for s in steps] == [True, True, False, False]


def test_fused_buckets_give_the_same_bits_in_fewer_rounds():
    """fuse_buckets holds a step's DDP buckets and exchanges them at the last one: TernGrad and
    QSGD scale per parameter and sum exactly, so the parameters are the same bits as bucket by
    bucket (with error feedback too), in one exchange a step; its state loads unfused."""
    results = run(w.fused_buckets, 2)
    sharded = ["all_reduce", "all_to_all", "all_gather"]  # scales, shards, sums
    for out in results:
        for name in ("terngrad", "terngrad-ef", "qsgd", "terngrad-own"):
            plain, fused = out[name, False], out[name, True]
            for a, b in zip(plain["params"], fused["params"], strict=True):
                assert torch.equal(a, b), name
            buckets = plain["rounds"].count("bucket")
            assert buckets == fused["rounds"].count("bucket") >= 3  # several DDP buckets
            collectives = [r for r in plain["rounds"] if r != "bucket"]
            # bucket by bucket: the weights' buckets three rounds each (with own scales one,
            # the all-gather), the fp32 tensors one all-reduce started with the last bucket
            rounds = ["all_gather"] if name == "terngrad-own" else sharded
            quantized = (len(collectives) - 1) // len(rounds)
            assert quantized >= 2 and collectives.count("start_all_reduce") == 1
            assert collectives.count("all_gather") == quantized
            assert [r for r in fused["rounds"] if r != "bucket"] == ["start_all_reduce", *rounds]
        assert out["loaded"] > 0
        assert out["synchronizer"].startswith("fuse_buckets is the DDP hook's")
    for a, b in zip(results[0]["terngrad", True]["params"], results[1]["terngrad", True]["params"],
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
