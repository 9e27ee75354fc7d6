"""FrozenVarianceAdamW with its momentum exchanged by the hook (issue 29), on real gloo ranks:
the switch at the same step everywhere, replicas bitwise identical, exact resume, and through
an exact exchange the same training as one process on the mean gradient."""

import momentum_workers as w
import ranks
import torch


def test_the_switch_comes_at_the_same_step_on_every_rank_and_replicas_stay_identical():
    out = ranks.run(w.train, 3, "terngrad", 8, 3)
    assert all(r["phases"] == [False] * 3 + [True] * 5 for r in out)
    for r in out[1:]:
        assert all(torch.equal(p, q) for p, q in zip(out[0]["params"], r["params"], strict=True))
        assert torch.equal(out[0]["momentum"], r["momentum"])  # the momentum all agreed on
    assert out[0]["bytes_per_step"] > 0


def test_through_an_exact_exchange_it_is_one_process_on_the_mean_gradient():
    """fp32 exchange: averaging the ranks' momenta is the momentum of the mean gradient (the
    same up to float rounding: lerp of a mean against a mean of lerps)."""
    out = ranks.run(w.train, 2, "fp32", 10, 4)
    want = w.reference(2, 10, 4)
    for got in (out[0]["params"], out[1]["params"]):
        for p, q in zip(got, want, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_run_resumed_after_the_switch_ends_bitwise_as_the_straight_one():
    straight = ranks.run(w.train, 2, "terngrad", 9, 3, 5)
    saved = [r["saved"] for r in straight]
    resumed = ranks.run(w.train, 2, "terngrad", 9, 3, None, saved)
    for a, b in zip(straight, resumed, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
        assert b["phases"] == [True] * 4
