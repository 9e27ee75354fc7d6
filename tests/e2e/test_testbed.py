"""The namespace testbed for real (root and iproute2; skipped with the reason otherwise, and on
its own namespace prefixes so it never touches a user's benchmark): a 2-rank ``bench network``
run, namespaces it did not make refused and kept, a killed run's testbed removed exactly
(processes included), and a 2-rank, 2-method ``bench accuracy`` run and a sweep over it."""

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from support import accuracy_base, why_no_testbed

from terngrad.bench import network, testbed
from terngrad.experiments import comparison, time_to_accuracy_plot
from terngrad.experiments import time_to_accuracy as tta
from terngrad.train import models

PREFIX = "tgtest"
#: why the testbed cannot run here, or None
WHY_NOT = why_no_testbed(PREFIX)


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_two_rank_testbed_run(tmp_path):
    summary = network.run(
        2, "1gbit", "mlp", ["fp32", "terngrad"], tmp_path, steps=2, warmup=1, timeout=300,
        prefix=PREFIX,
    )  # fmt: skip
    assert not [n for n in testbed._namespaces() if n.startswith(f"{PREFIX}-")]  # torn down
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    assert (tmp_path / "speedup.png").stat().st_size > 0
    fp32, tern = summary["methods"]
    # an MLP of 669,706 parameters: the fp32 ring moves 2 (N-1)/N 4 bytes a parameter and more
    # (headers); TernGrad well under a tenth of that
    assert fp32["wire_bytes_per_rank_per_step"] > 669_706 * 4
    assert tern["wire_bytes_per_rank_per_step"] < fp32["wire_bytes_per_rank_per_step"] / 8
    assert fp32["speedup_vs_fp32"] == 1.0 and 0 < tern["codec_share"] < 1
    assert fp32["tcp_retransmits_per_step"] >= 0  # counted inside the ranks' namespaces
    assert summary["link_probe"]["bytes_per_second"] > 0


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_namespaces_it_did_not_make_are_refused_and_never_deleted():
    subprocess.run(["ip", "netns", "add", f"{PREFIX}-r1"], check=True)
    try:
        with (
            pytest.raises(testbed.TestbedUnavailable, match="terngrad's testbed did not make"),
            testbed.Testbed(2, prefix=PREFIX),
        ):
            pass
        assert testbed.cleanup(PREFIX) == ([], [f"{PREFIX}-r1"])  # left alone
        assert f"{PREFIX}-r1" in testbed._namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", f"{PREFIX}-r1"], check=True)


KILLED = """
import subprocess, sys, time
from terngrad.bench import testbed
bed = testbed.Testbed(2, prefix=sys.argv[1]).__enter__()
rank = subprocess.Popen(["ip", "netns", "exec", bed.namespace(1), "sleep", "600"])
print(rank.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_a_killed_runs_testbed_is_removed_exactly_processes_included():
    """The bench SIGKILLed with a rank in a namespace (a process that does not watch its
    parent): --cleanup kills that rank and removes exactly the namespaces the run recorded;
    while the run lives, its testbed is refused to others and to --cleanup."""
    import os
    import signal
    import sys

    from support import gone

    prefix = f"{PREFIX}k"
    stranger = f"{prefix}-r7"  # a look-alike made beside the run's, not by it
    bench = subprocess.Popen([sys.executable, "-c", KILLED, prefix], stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    try:
        rank = int(bench.stdout.readline())
        subprocess.run(["ip", "netns", "add", stranger], check=True)
        with pytest.raises(testbed.TestbedUnavailable, match=f"in use by PID {bench.pid}"):
            testbed.cleanup(prefix)
        with (
            pytest.raises(testbed.TestbedUnavailable, match=f"in use by PID {bench.pid}"),
            testbed.Testbed(2, prefix=prefix),
        ):
            pass
        bench.kill()
        bench.wait()
        assert not gone(rank, 0)  # the rank runs on in its namespace
        with (
            pytest.raises(testbed.TestbedUnavailable, match="--cleanup"),
            testbed.Testbed(2, prefix=prefix),
        ):
            pass
        removed, foreign = testbed.cleanup(prefix)
        assert sorted(removed) == [f"{prefix}-hub", f"{prefix}-r0", f"{prefix}-r1"]
        assert foreign == [stranger]
        assert gone(rank, 5)
        assert [n for n in testbed._namespaces() if n.startswith(f"{prefix}-")] == [stranger]
        assert testbed.cleanup(prefix) == ([], [stranger])  # nothing recorded any more
    finally:
        if bench.poll() is None:
            os.kill(bench.pid, signal.SIGKILL)
        testbed.cleanup(prefix)
        subprocess.run(["ip", "netns", "delete", stranger], capture_output=True)


ACCURACY_PREFIX = "tgacc"


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_nodes_of_two_ranks_share_a_namespace_and_its_link(tmp_path):
    """4 ranks as 2 nodes of 2 (``ranks_per_node``): 2 namespaces, the ranks of a node on its
    one shaped link; plain DDP (its ring crosses the slow link) and local steps across nodes
    (DDP inside a node, the exchange across) race in it; the wire bytes are a node's, and the
    report says so."""
    bed = testbed.Testbed(4, "100mbit", ACCURACY_PREFIX, ranks_per_node=2)
    assert [bed.namespace(r) for r in range(4)] == [f"{ACCURACY_PREFIX}-r{n}" for n in (0, 0, 1, 1)]
    base = accuracy_base(tmp_path / "nodes", workers=4, ranks_per_node=2, steps=5, eval_every=5)
    plan = tta.AccuracyComparison(base, ("fp32", "terngrad-local5-nodes"), "100mbit", 0.3,
                                  time_limit=300, prefix=ACCURACY_PREFIX)  # fmt: skip
    lines: list[str] = []
    comparison.run(plan, Path(base.out), echo=lines.append)
    assert any("building 2 namespaces" in line for line in lines)
    assert not [n for n in testbed._namespaces() if n.startswith(f"{ACCURACY_PREFIX}-")]
    results = json.loads((Path(base.out) / "results.json").read_text())
    fp32, nodes = results["methods"]
    assert fp32["wire_bytes_per_step"] > 0
    assert 0 < nodes["wire_bytes_per_step"] < fp32["wire_bytes_per_step"] / 10
    summary = json.loads((Path(base.out) / "terngrad-local5-nodes" / "summary.json").read_text())
    assert summary["node_bytes_sent_per_rank"] > 0  # what stayed inside the node
    assert "nodes of 2 ranks share one interface" in (Path(base.out) / "results.md").read_text()
    with pytest.raises(ValueError, match="ranks-per-node 3 must divide the testbed's 4 ranks"):
        testbed.Testbed(4, "100mbit", ACCURACY_PREFIX, ranks_per_node=3)


@pytest.mark.slow  # a whole experiment: make test-slow
@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_two_ranks_two_methods_on_the_shaped_testbed_then_a_sweep(tmp_path):
    """A 2-rank, 2-method ``bench accuracy`` run at 100 Mbit/s (read back when run again,
    reported again for another target), then the sweep over it and the unlimited link: the
    100 Mbit/s point is read back, each rate in its own folder, and the sweep's table, JSON and
    plot are written."""
    from terngrad.experiments import sweep

    base = accuracy_base(tmp_path / "sweep")
    swept = tta.AccuracyComparison(base, ("fp32", "terngrad"), "100mbit", 0.3, time_limit=300,
                                   prefix=ACCURACY_PREFIX)  # fmt: skip
    (plan,) = sweep.comparisons(swept, ["100mbit"])
    out = Path(plan.base.out)
    lines: list[str] = []
    comparison.run(plan, out, echo=lines.append)
    results = json.loads((out / "results.json").read_text())
    assert not [
        n for n in testbed._namespaces() if n.startswith(f"{ACCURACY_PREFIX}-")
    ]  # torn down
    fp32, tern = results["methods"]
    assert (fp32["method"], tern["method"]) == ("fp32", "terngrad")
    for row in (fp32, tern):
        assert [m["step"] for m in row["curve"]] == [10, 20]
        assert 0 < row["curve"][0]["train_seconds"] < row["curve"][1]["train_seconds"]
        assert row["train_seconds"] == row["curve"][-1]["train_seconds"]
    # a 2-rank ring all-reduce sends the MLP's gradients once in fp32, plus TCP/IP headers
    nbytes = 4 * sum(p.numel() for p in models.build("mlp", (1, 28, 28), 10).parameters())
    assert nbytes <= fp32["wire_bytes_per_step"] < 1.1 * nbytes
    assert fp32["hook_bytes_per_step"] is None  # PyTorch's own all-reduce: no hook counting
    assert (
        tern["hook_bytes_per_step"] <= tern["wire_bytes_per_step"] < fp32["wire_bytes_per_step"] / 5
    )
    assert any("fp32 step 10: test accuracy" in line for line in lines)  # progress on the way
    table = (out / "results.md").read_text()
    assert "| fp32 |" in table and "| terngrad |" in table
    drawn = time_to_accuracy_plot.plot(results, out / "again.png")
    assert drawn == (["fp32", "terngrad"], ["fp32", "terngrad"])  # every method, both panels
    assert (out / "time-to-accuracy.png").stat().st_size > 10_000
    # run again: every method is read back, nothing is trained twice
    lines.clear()
    comparison.run(plan, out, echo=lines.append)
    again = json.loads((out / "results.json").read_text())
    assert [r["train_seconds"] for r in again["methods"]] == [
        r["train_seconds"] for r in results["methods"]
    ]
    assert sum("(done before)" in line for line in lines) == 2
    # the report again, for another target, without training or building anything
    comparison.report_only(replace(plan, target=0.15), out)
    lower = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in lower["methods"]] == ["fp32", "terngrad"]
    assert all(r["reached"] and r["reached"]["step"] == 10 for r in lower["methods"])
    assert "# Time to 15%" in (out / "results.md").read_text()
    other = replace(plan, base=replace(plan.base, lr=0.5))
    with pytest.raises(ValueError, match=r"fp32 \(DDP fp32 all-reduce\) has not finished"):
        comparison.report_only(other, out)
    # the sweep: 100 Mbit/s read back, the unlimited link trained
    lines.clear()
    plans = sweep.comparisons(swept, ["100mbit", "unlimited"])
    text = sweep.run(plans, lambda p: comparison.run(p, Path(p.base.out), echo=lines.append),
                     tmp_path / "sweep")  # fmt: skip
    assert sum("(done before)" in line for line in lines) == 2  # the 100 Mbit/s point's
    assert "# Time to 30% against the link" in text
    found = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [p["bandwidth"] for p in found["points"]] == ["100mbit", "unlimited"]
    for p in found["points"]:
        assert set(p["methods"]) == {"fp32", "terngrad"}
    for bandwidth in ("100mbit", "unlimited"):
        assert json.loads((out.parent / bandwidth / "results.json").read_text())["bandwidth"] == (
            bandwidth
        )
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 10_000


@pytest.mark.slow  # a whole experiment: make test-slow
@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_a_tuned_race_tunes_on_its_own_seed_then_races_each_method_at_its_rate(tmp_path):
    """``--tune-lr``: TernGrad at three rates on the tuning seed, unlimited, from the middle of
    the grid out: it reaches the target at 0.05, diverges at the huge rate (a point of its
    curve, not a failure), and at the tiny one is stopped once it passes 0.05's steps; then the
    race at the rate chosen; run again, everything is read back."""
    from terngrad.experiments import tuning

    race = tta.AccuracyComparison(
        accuracy_base(tmp_path, steps=20, eval_every=20), ("terngrad",), "unlimited", 0.3,
        time_limit=300,
        prefix=ACCURACY_PREFIX, stop_at_target=True,
    )  # fmt: skip
    tuned = tuning.LrTuning.of(race, tuning.LrGrid((1e-4, 0.05, 1e6), seed=1000))
    lines: list[str] = []
    record, text = tuning.tune(tuned, lines.append)
    tern = record["methods"]["terngrad"]
    assert [p["lr"] for p in tern["points"]] == [1e-4, 0.05, 1e6]
    tiny, good, huge = tern["points"]
    assert good["reached"]["step"] == 20  # (one evaluation: the huge rate diverges before it)
    assert huge["diverged"] and any("diverged" in line for line in lines)
    assert tiny["stopped"] and tiny["steps"] == good["reached"]["step"]
    assert any("stopped (not at 30% by step" in line for line in lines)
    assert tern["chosen"]["lr"] == 0.05
    assert "| terngrad |" in text and "| diverged |" in text
    fair = tuning.raced(race, record)
    results_text = comparison.run(fair, Path(fair.base.out), echo=lines.append)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["tuned_on"] == 1000 and results["seeds"] == [0]
    assert [(m["method"], m["lr"]) for m in results["methods"]] == [("terngrad", 0.05)]
    assert "tuned on seed 1000, kept out of the race" in results_text
    # again: the tuning's points, the diverged one included, and the race are read back
    lines.clear()
    tuning.tune(tuned, lines.append)
    comparison.run(fair, Path(fair.base.out), echo=lines.append)
    assert sum("(done before)" in line for line in lines) == 4
