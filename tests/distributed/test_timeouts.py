"""A timeout left unset is the default group's: every path that makes a
process group of its own — the DDP hook, the Synchronizer (and DiLoCo on it), FSDP — waits as
long as ``init_process_group(timeout=...)`` said, not torch's 30 minutes, and says so in
``options.timeout``."""

from __future__ import annotations

import pytest
import timeout_workers as tw
from ranks import run


def test_every_path_takes_the_default_groups_timeout_and_says_so():
    for out in run(tw.resolved, 2, timeout=3):
        assert out["state before use"] is None  # no process group to ask yet
        assert out["state"] == (3.0, 3.0, 3.0)
        assert out["given"] == (5.0, 5.0, 5.0)
        assert out["group"] == (7.0, 7.0, 7.0)  # a group given keeps its own, its twin too
        assert out["synchronizer"] == (3.0, 3.0, 3.0)
        assert out["fsdp"] == (3.0, 3.0)


@pytest.mark.parametrize("how", ["register", "synchronizer", "diloco"])
def test_a_late_rank_fails_the_other_within_the_default_groups_timeout(how):
    # rank 1 is 7 s late; the default group waits 3 s: rank 0 fails after about 3 s (it used
    # to wait for rank 1, up to 30 minutes, and so succeed after 7 s)
    waiting, _ = run(tw.late_rank, 2, how, 7.0, timeout=3)
    assert waiting["timeout"] == 3.0
    assert waiting["message"] != "no error"
    assert 2.5 < waiting["seconds"] < 5.5, waiting
    # one line, the hook's and DiLoCo's Synchronizer alike (it used to be gloo's raw one)
    assert "the gradient exchange failed" in waiting["message"]
    assert "every collective waits at most 3 s" in waiting["message"]
    if how == "diloco":
        assert waiting["message"].endswith("(outer step 1)"), waiting["message"]
