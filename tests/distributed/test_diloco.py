"""DiLoCo with terngrad's exchange on real gloo ranks: replicas bitwise equal after every outer
step, the outer step as the algorithm writes it, ternary outer gradients in far fewer bytes, a
resumed run bitwise the straight one, a non-finite pseudo-gradient skipped on every rank, and
bad input refused in one line."""

import diloco_workers as w
import pytest
import torch
from ranks import run

from terngrad.util.differences import same

STEPS, H = 12, 4


@pytest.fixture(scope="module", params=[2, 4])
def ternary(request):
    world = request.param
    return world, run(w.train, world, STEPS, H, {})


def test_replicas_restart_from_one_anchor_at_every_outer_step(ternary):
    _, ranks = ternary
    for out in ranks:
        assert out["outer"] == [(s + 1) % H == 0 for s in range(STEPS)]
        assert (out["stats"].inner_steps, out["stats"].outer_steps) == (STEPS, STEPS // H)
        assert out["stats"].skipped_outer_steps == 0
    for step in range(STEPS):
        first = ranks[0]["params"][step]
        alike = all(same(first, r["params"][step]) for r in ranks[1:])
        assert alike == ((step + 1) % H == 0), step  # equal after an outer step only
    for r in ranks[1:]:
        assert same(ranks[0]["anchor"], r["anchor"])
        # what a checkpoint takes from rank 0 alone is every rank's, bit for bit
        assert same(ranks[0]["replicated"], r["replicated"])


def test_the_outer_step_is_nesterov_sgd_on_the_mean_pseudo_gradient():
    """fp32 outer gradients: the anchor moves as SGD with Nesterov momentum along the mean of
    the ranks' anchor − local parameters, written out here."""
    world = 2
    ranks = run(w.train, world, 2 * H, H, {"quantizer": "fp32", "topology": "allgather"})
    anchor = [p.detach().clone() for p in w.model().parameters()]
    momentum = [torch.zeros_like(a) for a in anchor]
    n = len(anchor)
    for k in range(2):
        locals_ = [r["before_outer"][k][:n] for r in ranks]
        for i, a in enumerate(anchor):
            delta = sum(a - loc[i] for loc in locals_) / world
            momentum[i] = 0.9 * momentum[i] + delta
            a -= 0.7 * (delta + 0.9 * momentum[i])
        after = ranks[0]["params"][(k + 1) * H - 1][:n]
        for a, p in zip(anchor, after, strict=True):
            assert torch.allclose(a, p, rtol=1e-5, atol=1e-6), k


@pytest.mark.parametrize("world", [2, 4])
def test_ternary_outer_gradients_send_far_fewer_bytes_than_fp32(world):
    """Every tensor quantized: (N-1)/N (1.6 + log2(2N+1)) bits an element against fp32's
    2 (N-1)/N 32, 16.3x fewer at 2 ranks and 13.4x at 4 before headers and scales; the batch
    norm's 256 statistics travel in fp32 in both (measured 11.3x and 9.7x on this 10k-parameter
    MLP)."""
    every = {"quantize_last": True, "min_numel": 0}
    tern = run(w.train, world, STEPS, H, every)[0]["stats"]
    full = run(w.train, world, STEPS, H, {**every, "quantizer": "fp32"})[0]["stats"]
    assert tern.bytes_sent == tern.bytes_sent_per_step * STEPS > 0
    assert full.bytes_sent_per_step / tern.bytes_sent_per_step > {2: 10.5, 4: 9}[world]


def test_a_resumed_run_ends_bitwise_as_the_straight_one():
    ef = {"error_feedback": True}  # the residuals resume too
    straight = run(w.train, 2, STEPS, H, ef, False, 6)  # saved between two outer steps
    resumed = run(w.train, 2, STEPS, H, ef, False, None, [r["saved"] for r in straight])
    for a, b in zip(straight, resumed, strict=True):
        for x, y in zip(a["params"][-1], b["params"][-1], strict=True):
            assert torch.equal(x, y)
        assert a["stats"] == b["stats"]


def test_a_ddp_model_keeps_ddp_and_trains_locally_between_outer_steps():
    ranks = run(w.train, 2, 2 * H, H, {}, True)
    assert not all(
        torch.equal(a, b) for a, b in zip(ranks[0]["params"][0], ranks[1]["params"][0], strict=True)
    )  # after one inner step: each replica its own
    assert all(
        torch.equal(a, b)
        for a, b in zip(ranks[0]["params"][H - 1], ranks[1]["params"][H - 1], strict=True)
    )


def test_a_non_finite_pseudo_gradient_skips_the_outer_step_on_every_rank():
    ranks = run(w.train, 2, 2 * H, H, {}, False, None, None, H - 1)
    for out in ranks:
        assert out["stats"].skipped_outer_steps == 1 and out["stats"].outer_steps == 2
        start = [p.detach() for p in w.model().parameters()]
        after = out["params"][H - 1][: len(start)]
        assert all(torch.equal(a, b) for a, b in zip(start, after, strict=True))  # anchor kept
        assert all(torch.isfinite(p).all() for p in out["params"][-1])
        assert out["warnings"] == [  # the run's step, not the exchange's count
            "terngrad: the outer step of inner step 4 was skipped: a rank's pseudo-gradient "
            "was NaN or Inf; the anchor stays and every replica restarts from it (1 skipped "
            "so far)"
        ]


def test_overlap_recovers_from_one_non_finite_pseudo_gradient():
    """With overlap, a NaN in rank 1's replica once (at the end of the second window): rank 1
    restarts from the anchor rather than from ``anchor − its own Δ`` (NaN: its optimizer's
    moments would be NaN for good), the exchange of that window is skipped when it lands, every
    replica restarts from the anchor, and the outer steps after it apply again — one skipped
    outer step, not every later one."""
    ranks = run(w.train, 2, 6 * H, H, {"overlap": True}, False, None, None, 2 * H - 1)
    for out in ranks:
        assert out["final_stats"].skipped_outer_steps == 1
        assert all(torch.isfinite(p).all() for p in out["final"])
        assert len(out["warnings"]) == 1 and "outer step of inner step 8 was" in out["warnings"][0]
        last, before = out["anchors"][-1], out["anchors"][-2]
        assert not all(torch.equal(a, b) for a, b in zip(last, before, strict=True))  # it learns
    assert same(ranks[0]["final"], ranks[1]["final"])


def test_a_state_that_does_not_fit_is_refused_before_anything_changes():
    """Each forged part refused in one line naming it, and the DiLoCo — its anchor, its
    optimizers, its exchange, its counts, its model — bitwise as it was (an outer momentum of
    another shape was taken, an inner optimizer of another kind failed half loaded)."""
    for said in run(w.refused_loads, 2):
        for line, unchanged in said:
            assert "\n" not in line and line != "accepted" and unchanged, line
        lines = [line for line, _ in said]
        assert "outer optimizer's momentum_buffer of parameter 0 is a [3] float32" in lines[0]
        assert "holds an outer exchange in flight (pending)" in lines[1]
        assert "inner optimizer" in lines[2] and "inner optimizer" in lines[3]
        assert "its 'inner_steps' is -1, not a whole number >= 0" in lines[4]
        assert "outer optimizer has lr=123.0, this run lr=0.7" in lines[5]
        assert "belongs to rank" in lines[6]


def test_bad_input_is_one_line():
    said = run(w.refusals, 2)
    for lines in said:
        assert all("\n" not in s and s != "accepted" for s in lines), lines
        assert lines[0].startswith("local_steps must be an integer of at least 1")
        assert "'automatic'" in lines[1] and "2.5" in lines[2]
        assert "4 of the model's are not in it, 0 of its" in lines[3]
        assert "0 of the model's are not in it, 1 of its are not the model's" in lines[4]
        assert lines[5].startswith("outer-lr must be a positive finite number")
        assert lines[6].startswith("outer-momentum must be a number from 0 up to")
        assert "unknown quantizer 'nope'" in lines[7]
        assert "the ranks made DiLoCo with different settings" in lines[8]
        assert "local_steps=5 instead of 4" in lines[8] or "local_steps" in lines[8]
        assert lines[9] == "overlap must be True or False, got 'yes'"
        assert lines[10].startswith("max-comm-share must be a share in (0, 1)")
        assert lines[11].startswith("auto_choices must be a non-empty list of positive integ")
        assert "overlap=True instead of False" in lines[12] or "overlap" in lines[12]
        assert "the ranks made DiLoCo with different settings" in lines[12]
        assert lines[13] == (
            "local_steps 8 is not what terngrad-local4 runs (local_steps 4); the method that "
            "does is terngrad-local8: name it, or leave out local_steps"
        )
        assert lines[14].startswith("without overlap is not what terngrad-local4-overlap runs")
        assert "already has a communication hook" in lines[15]


def test_a_method_runs_its_own_local_steps_and_exchange(ternary):
    """``method="terngrad-local4"``: H = 4 and the plain TernGrad exchange, bit for bit the run
    given ``local_steps=4``; a method of one step gives the exchange, ``local_steps`` the H."""
    world, straight = ternary
    if world != 2:
        pytest.skip("one world size is enough")
    for settings, h in (({"method": "terngrad-local4"}, None), ({"method": "terngrad"}, H)):
        ranks = run(w.train, world, STEPS, h, settings)
        for mine, theirs in zip(ranks, straight, strict=True):
            assert mine["local_steps"] == H
            assert same(mine["params"], theirs["params"])
            assert mine["bytes"] == theirs["bytes"]


@pytest.mark.parametrize("steps, local_steps, overlap", [(6, H, False), (6, H, True),
                                                         (3, "auto", False)])  # fmt: skip
def test_training_that_ends_between_outer_steps_is_warned_of(steps, local_steps, overlap):
    """Ended 2 steps after an outer step (with overlap too: after the last update landed),
    or before ``"auto"`` chose H: ``finish()`` warns on every rank that the replicas differ,
    which they do. A run ended at an outer step says nothing (the tests above)."""
    ranks = run(w.train, 2, steps, local_steps, {"overlap": overlap})
    said = "before local_steps='auto' chose H" if local_steps == "auto" else "2 steps after"
    for r in ranks:
        assert len(r["finish_warnings"]) == 1 and said in r["finish_warnings"][0], r
    assert not same(ranks[0]["final"], ranks[1]["final"])
    straight = run(w.train, 2, 2 * H, H, {"overlap": overlap})
    assert all(r["finish_warnings"] == [] for r in straight)


# --- overlap: the outer exchange behind the next inner steps, its update one outer step late


def test_overlap_applies_each_averaged_update_one_outer_step_late():
    """fp32 outer gradients, overlap: at outer step k the anchor moves along the mean of the
    ranks' Δ_{k-1} (nothing at the first); each replica restarts from the anchor moved by its
    own Δ_k, and its next Δ is taken from there; ``finish()`` lands the last update and every
    replica is the anchor. Written out here. The bytes count the exchanges landed."""
    world = 2
    ranks = run(w.train, world, 3 * H, H, {"quantizer": "fp32", "topology": "allgather",
                                           "overlap": True})  # fmt: skip
    n = len(list(w.model().parameters()))
    anchor = [p.detach().clone() for p in w.model().parameters()]
    momentum = [torch.zeros_like(a) for a in anchor]
    starts = [[a.clone() for a in anchor] for _ in range(world)]
    in_flight = None

    def outer_update(deltas):
        for i, a in enumerate(anchor):
            mean = sum(d[i] for d in deltas) / world
            momentum[i] = 0.9 * momentum[i] + mean
            a -= 0.7 * (mean + 0.9 * momentum[i])

    def close(xs, ys):
        return all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(xs, ys, strict=True))

    for k in range(3):
        deltas = [[s - loc for s, loc in zip(starts[r], ranks[r]["before_outer"][k][:n],
                                              strict=True)] for r in range(world)]  # fmt: skip
        if in_flight is not None:
            outer_update(in_flight)
        in_flight = deltas
        for r in range(world):
            assert close(ranks[r]["anchors"][k], anchor), k
            starts[r] = [a - d for a, d in zip(anchor, deltas[r], strict=True)]
            assert close(ranks[r]["params"][(k + 1) * H - 1][:n], starts[r]), (k, r)
    outer_update(in_flight)
    for r in ranks:
        assert close(r["final"][:n], anchor)
        assert r["final_stats"].outer_steps == 3 and r["stats"].skipped_outer_steps == 0
        # an exchange counts once landed, the one in flight never (what a step reads does not
        # depend on the background thread's progress); each outer step also averages the
        # buffers (b bytes, at once); fp32: x bytes each exchange, the last landed by finish()
        r1, r2, r3 = (r["bytes"][k * H - 1] for k in (1, 2, 3))
        x = r["final_stats"].bytes_sent - r3
        assert x > 0 and r2 == 2 * r1 + x and r3 == 3 * r1 + 2 * x, (r1, r2, r3, x)
        assert r["bytes"] == [(0, r1, r2, r3)[(s + 1) // H] for s in range(3 * H)]
    assert not close(ranks[0]["params"][-1][:n], ranks[1]["params"][-1][:n])  # own Δ each
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["final"], ranks[1]["final"],
                                                 strict=True))  # fmt: skip


@pytest.mark.parametrize("save_at", [H, H + 2])
def test_overlap_resumes_bitwise_with_an_exchange_in_flight(save_at):
    """Saved just after an outer step (its exchange in flight: sent again on load) and
    between two: the resumed run ends bitwise as the straight one, replicas equal."""
    settings = {"overlap": True}
    straight = run(w.train, 2, STEPS, H, settings, False, save_at)
    resumed = run(w.train, 2, STEPS, H, settings, False, None, [r["saved"] for r in straight])
    for a, b in zip(straight, resumed, strict=True):
        for x, y in zip(a["final"], b["final"], strict=True):
            assert torch.equal(x, y)
        assert a["final_stats"] == b["final_stats"]
    for x, y in zip(straight[0]["final"], straight[1]["final"], strict=True):
        assert torch.equal(x, y)


# --- local_steps="auto": H from the measured step and exchange


def test_auto_chooses_one_h_on_every_rank_and_counts_no_probe_bytes():
    ranks = run(w.train, 2, 16, "auto", {"auto_choices": [2, 4, 8]})
    h = ranks[0]["local_steps"]
    assert h in (2, 4, 8) and all(r["local_steps"] == h for r in ranks)
    for r in ranks:
        auto = r["auto"]
        assert auto["local_steps"] == h and auto["max_comm_share"] == 0.1
        assert auto["inner_step_seconds"] > 0 and auto["exchange_seconds"] > 0
        first = 4 if 4 % h == 0 else 8  # decided at the 4th inner step
        assert r["outer"] == [s + 1 >= first and (s + 1) % h == 0 for s in range(16)]
        assert r["bytes"][first - 2] == 0 < r["bytes"][first - 1]  # the probe left no count
    assert ranks[0]["auto"] == ranks[1]["auto"]


def test_a_state_saved_before_auto_chose_resumes_bitwise():
    """Saved at inner step 2, before ``"auto"`` chooses at step 4 (one choice allowed, so the
    timing cannot change H): the state keeps the steps timed so far, the resumed run chooses
    at step 4 as the straight one did, and ends bitwise as it (it raised ZeroDivisionError on
    every rank; then it chose 4 steps after the restore, a window late)."""
    settings = {"auto_choices": [4]}
    straight = run(w.train, 2, 2 * H, "auto", settings, False, 2)
    assert straight[0]["saved"]["outer"]["local_steps"] == "auto"
    resumed = run(w.train, 2, 2 * H, "auto", settings, False, None,
                  [r["saved"] for r in straight])  # fmt: skip
    for a, b in zip(straight, resumed, strict=True):
        assert b["local_steps"] == 4 and same(a["final"], b["final"])
        assert a["final_stats"] == b["final_stats"]


def test_auto_with_a_slow_rank_chooses_one_h_from_the_slowest_step():
    """One rank's inner steps 0.05 s slower: both ranks take the slowest step (their maximum)
    and choose the same H, and the replicas are one model at the end (16 steps, H among
    divisors of 16)."""
    ranks = run(w.auto_with_a_slow_rank, 2, 16, 0.05)
    assert ranks[0]["auto"] == ranks[1]["auto"]
    assert ranks[0]["local_steps"] == ranks[1]["local_steps"] == ranks[0]["auto"]["local_steps"]
    assert ranks[0]["auto"]["inner_step_seconds"] >= 0.05
    assert all(r["in_sync"] for r in ranks) and same(ranks[0]["final"], ranks[1]["final"])
