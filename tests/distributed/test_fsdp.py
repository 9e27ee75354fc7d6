"""terngrad.fsdp on real gloo ranks: TernGrad as FSDP2's reduce-scatter."""

from __future__ import annotations

import fsdp_workers as fw
import pytest
import torch
from ranks import run

TERNGRAD = {"quantizer": "terngrad", "min_numel": 100}


def test_the_reduce_scatter_is_the_sharded_exchanges_first_half_bit_for_bit():
    # the same gradients, layout and draws: each rank's chunk is the exchange's mean there,
    # its own decoded digits the exchange's; a NaN on one rank, or beside on another, is
    # seen by all
    for result in run(fw.reduce_scatter_against_the_exchange, 3, 3 * 101):
        assert result == {"same": True, "own": True, "skipped": True, "beside": True}


def test_fsdp_trains_with_terngrad_and_the_full_precision_gradients_are_fsdps_own():
    plain = run(fw.train, 3, None, 3)
    tern = run(fw.train, 3, TERNGRAD, 3)
    # the last layer and the small tensors (biases, the norm) travel in full precision, their
    # gradients' shards FSDP's own (up to the order gloo adds three values in); the blocks'
    # weights on the grid, unbiased but not equal
    kept = ["blocks.0.bias", "blocks.1.bias", "head.bias", "head.weight", "norm.bias",
            "norm.weight"]  # fmt: skip
    for p, t in zip(plain, tern, strict=True):
        assert t["excluded"] == kept
        for name in kept:
            torch.testing.assert_close(t["grads"][name], p["grads"][name], rtol=1e-6, atol=1e-8)
        for name in ("blocks.0.weight", "blocks.1.weight"):
            assert not torch.equal(p["grads"][name], t["grads"][name])
            assert torch.isfinite(t["grads"][name]).all()
    # the full parameters, all-gathered from the shards, are the same on every rank
    for name, value in tern[0]["full"].items():
        assert all(torch.equal(value, other["full"][name]) for other in tern[1:]), name
    stats = tern[0]["stats"]
    assert stats.steps == 3 and stats.skipped_steps == 0
    assert stats.last_step_bytes_sent == stats.bytes_sent / 3


def test_every_tensor_on_the_grid_sends_over_ten_times_fewer_bytes_than_fp32():
    results = run(fw.train, 2, {"quantize_last": True, "min_numel": 0}, 2)
    for r in results:
        assert r["excluded"] == []
        ratio = r["fp32_bytes_sent"] / r["stats"].bytes_sent
        assert ratio > 10, ratio  # 1.6 bits an element + a scale per parameter shard


def test_a_nan_on_one_rank_skips_the_step_on_every_rank():
    results = run(fw.train, 3, TERNGRAD, 3, {"nan_at": 1})
    for r in results:
        assert r["skipped"] == [False, True, False]
        assert r["stats"].skipped_steps == 1  # one step, though two groups zeroed their shard
    for name, value in results[0]["full"].items():
        assert all(torch.equal(value, other["full"][name]) for other in results[1:]), name


def test_a_resumed_run_ends_bitwise_as_the_straight_one_error_feedback_included():
    options = {**TERNGRAD, "error_feedback": True}
    straight = run(fw.train, 2, options, 4, {"save_at": 2})
    resumed = run(fw.train, 2, options, 4, {"saved": [r["saved"] for r in straight]})
    for a, b in zip(straight, resumed, strict=True):
        for name, value in a["shards"].items():
            assert torch.equal(value, b["shards"][name]), name
        assert a["stats"] == b["stats"]


def test_the_mixed_precision_reduce_dtype_is_honoured():
    results = run(fw.train, 2, TERNGRAD, 2, {"reduce_dtype": torch.bfloat16})
    for r in results:
        assert all(torch.isfinite(torch.tensor(r["losses"])))
        assert all(g.dtype == torch.float32 for g in r["grads"].values())  # the params' dtype
        assert r["stats"].bytes_sent > 0


@pytest.mark.parametrize("world", [1])
def test_what_it_cannot_serve_is_one_line_at_register(world):
    said = run(fw.refusals, world)[0]
    assert said[0].startswith("terngrad.fsdp: the model is not sharded: call")
    assert "linear cannot sum exactly in FSDP's sharded layout" in said[1]
    assert "leave topology and policy at their defaults" in said[2]
    assert said[3].startswith("terngrad.fsdp: fuse_buckets is the DDP hook's")
    assert said[4].startswith("terngrad.fsdp: fit_scale is the DDP hook's and DiLoCo's")
    assert said[5] == "terngrad.fsdp: this model is registered already; register it once"
    assert all("\n" not in s for s in said)


def test_a_gradient_divide_factor_is_refused_in_terngrads_words():
    """Every FSDP group goes through terngrad's check, the ones it keeps in full precision
    whole included (here the root's: the norm and the head), whose reduce-scatter was FSDP's
    own and failed with gloo's "Cannot use ReduceOp.PREMUL_SUM with Gloo"."""
    said = run(fw.divide_factor, 2, 3.0)
    for line in said:
        assert line.startswith("ValueError: terngrad.fsdp: FSDP asked for a reduce-scatter with "
                               "ReduceOp.PREMUL_SUM (a gradient divide factor)"), line  # fmt: skip
        assert "leave set_gradient_divide_factor unset" in line
