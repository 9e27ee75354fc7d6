"""FrozenVarianceAdamW and LocalVarianceAdamW with their momentum exchanged by the hook (issue
29), on real gloo ranks: the switch (the variance's shares) at the same step everywhere, replicas
bitwise identical, exact resume, and through an exact exchange the same training as one process
written out."""

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


def test_local_variance_replicas_agree_and_each_share_costs_one_all_reduce_of_the_model():
    out = ranks.run(w.train_local, 3, "terngrad", 9, 4)
    for r in out[1:]:
        assert all(torch.equal(p, q) for p, q in zip(out[0]["params"], r["params"], strict=True))
        assert torch.equal(out[0]["momentum"], r["momentum"])
        assert torch.equal(out[0]["denom"], r["denom"])  # made from the same mean
    own = [r["variance"] for r in out]
    assert not torch.equal(own[0]["0.weight"], own[1]["0.weight"])  # each rank's own
    numel = sum(p.numel() for p in w.model().parameters())
    share = 2 * (3 - 1) * 2 * numel * 2 // 3  # a ring all-reduce of v_i, m_i in bfloat16
    sizes = out[0]["bytes"]  # steps 1, 2, 4 and 8 share (sync_every 4)
    plain = sizes[2]
    assert all(sizes[i] == plain for i in (2, 4, 5, 6, 8))
    assert all(0 < sizes[i] - plain <= share + 64 for i in (0, 1, 3, 7))


def test_local_variance_through_an_exact_exchange_is_the_algorithm_written_out():
    out = ranks.run(w.train_local, 2, "fp32", 10, 4, None, None, torch.float32)
    want = w.reference_local(2, 10, 4)
    for got in (out[0]["params"], out[1]["params"]):
        for p, q in zip(got, want, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_local_variance_resumed_between_shares_ends_bitwise_as_the_straight_run():
    straight = ranks.run(w.train_local, 2, "terngrad", 11, 4, 6)
    saved = [r["saved"] for r in straight]
    resumed = ranks.run(w.train_local, 2, "terngrad", 11, 4, None, saved)
    for a, b in zip(straight, resumed, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
        assert all(torch.equal(a["variance"][n], v) for n, v in b["variance"].items())
