"""Failures across ranks, each named in one line: diverged replicas, a stuck rank within the
timeout, ranks started with different settings."""

import comm_workers as w
from ranks import run


def test_diverged_replicas_are_named():
    for message in run(w.diverged_replicas, 3):
        assert message.startswith("replicas diverged at step 4: rank(s) 1 hold other parameters")
        assert "first difference: body.2.weight" in message


def test_a_stuck_rank_fails_the_others_within_the_timeout():
    fast, _ = run(w.stuck_rank, 2)
    assert "another rank has died or is stuck" in fast["message"]
    assert "at most 2 s" in fast["message"]
    assert fast["seconds"] < 6  # well before the stuck rank wakes up, not after 30 minutes


def test_ranks_started_with_different_settings_fail_naming_them():
    for message in run(w.mismatched_runs, 2):
        assert message == (
            "the ranks were started with different settings (compared with rank 0): rank 1: "
            "lr=0.5 instead of 0.01, model='mlp' instead of 'lenet'"
        )
