"""The DDP hook on real gloo ranks: the (state, hook) pair and ``register`` train alike,
registration errors, full precision in the parameters' dtype, a state loaded before first use."""

from __future__ import annotations

import hook_workers as w
import torch
from ranks import run


def test_an_unbound_pair_trains_like_register():
    ranks = run(w.pair_against_register, 2)
    for r in ranks:
        assert r["pair_built_at_first_use"]
        a, b = r["register"], r["pair"]
        assert a["stats"] == b["stats"] and a["stats"].steps == 6
        assert a["excluded"] == b["excluded"] == ["0.bias", "2.bias", "2.weight"]
        for x, y in zip(a["params"], b["params"], strict=True):
            assert torch.equal(x, y)
    for x, y in zip(ranks[0]["pair"]["params"], ranks[1]["pair"]["params"], strict=True):
        assert torch.equal(x, y)  # identical replicas


def test_a_second_registration_is_refused_before_anything_is_built():
    for r in run(w.second_registration, 2):
        assert "already has a communication hook (hook)" in r["errors"][0]
        assert "(BuiltinCommHookType.FP16_COMPRESS)" in r["errors"][1]  # a C++ hook too
        assert r["groups_made"] == 0


def test_a_failed_first_use_fails_again_without_building_twice():
    for r in run(w.failed_first_use, 2):
        first, second = r["errors"]
        assert "saved with another configuration" in first
        assert second != "no error"  # (DDP itself may fail first: its reducer saw the error)
        assert r["groups_made"] == 2  # one build (its two groups), not a second one


def test_full_precision_keeps_the_parameters_dtype():
    for r in run(w.full_precision_dtypes, 2):
        bf16, fp32, fp64 = r["torch.bfloat16"], r["torch.float32"], r["torch.float64"]
        assert bf16["bytes_per_step"] == bf16["expected"]  # 2 bytes an element, not 4
        assert fp64["bytes_per_step"] == fp64["expected"]
        assert fp32["bytes_per_step"] == fp32["expected"]
        assert bf16["bytes_per_step"] * 2 == fp32["bytes_per_step"]
        assert fp64["drift"] < 1e-13  # against PyTorch's own DDP (float32 would be ~1e-9)
        assert bf16["param_dtypes"] == {"torch.bfloat16"}


def test_a_state_loaded_before_first_use_goes_on_from_it():
    for r in run(w.load_before_first_use, 2):
        assert r["pending_kept"]
        assert r["steps"] == 5
        assert r["residuals"]  # error feedback restored and updated


def test_compiled_ddp_python_reducer_is_refused_clearly():
    for r in run(w.python_reducer, 1):
        for how in ("register", "pair"):
            assert "python_reducer" in r[how] and "optimize_ddp=True" in r[how], r[how]


def test_a_state_no_gradient_went_through_says_so():
    for messages in run(w.unused_state_warns, 2):
        assert len(messages) == 1  # the dropped one; not the one that trained
