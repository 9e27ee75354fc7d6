"""`terngrad train`: a real 2-worker run writes every output and resumes from its checkpoint bit
for bit; PyTorch's baselines; the learning-rate warm-up."""

import json

import pytest
import torch
from support import LENET_RUN as ARGS
from support import LENET_SYNTHETIC_RUN as QUICK

from terngrad.cli import main
from terngrad.comm.spec.method_spec import Method
from terngrad.train import checkpoints


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_worker_run_writes_all_outputs_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*ARGS, "--steps", "4", "--out", str(out)]) == 0
    assert "test accuracy" in capsys.readouterr().out
    for name in ("metrics.jsonl", "summary.json", "checkpoint-00000004.pt", "curves.png"):
        assert (out / name).stat().st_size > 0, name
    assert checkpoints.steps(out) == [2, 4]
    first = _metrics(out)
    assert [m["step"] for m in first] == [2, 4]
    assert set(first[0]) == {
        "step", "loss", "accuracy", "train_loss", "lr", "bytes_sent", "seconds", "train_seconds",
        "wire_bytes",
    }  # fmt: skip
    assert first[1]["bytes_sent"] > first[0]["bytes_sent"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["workers"] == 2 and summary["steps"] == 4
    assert 0 <= summary["accuracy"] <= 1
    ckpt = checkpoints.load(checkpoints.latest(out))
    assert ckpt["step"] == 4 and len(ckpt["hook_states"]) == len(ckpt["rng_states"]) == 2
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # the same command with more steps resumes at step 4 and keeps the first evaluations
    assert main([*ARGS, "--steps", "6", "--out", str(out)]) == 0
    resumed = _metrics(out)
    assert [m["step"] for m in resumed] == [2, 4, 6]
    assert resumed[:2] == first
    assert checkpoints.load(checkpoints.latest(out))["step"] == 6
    assert json.loads((out / "summary.json").read_text())["steps"] == 6

    # a different run into the same folder is refused, and nothing there is touched
    before = checkpoints.latest(out).read_bytes()
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "6", "--lr", "0.5", "--out", str(out)])
    assert exc.value.code == 2
    assert (
        "belongs to a different run (this run's settings instead of the checkpoint's: "
        "lr=0.5 instead of 0.01)"
    ) in capsys.readouterr().err
    assert checkpoints.latest(out).read_bytes() == before


def test_resumed_run_is_bitwise_identical_to_an_uninterrupted_one(tmp_path):
    """The random draws are per parameter and step, the data per step, and every rank's
    generator is in the checkpoint: a resumed run ends with the same bits."""
    args = [*ARGS, "--eval-every", "3"]
    assert main([*args, "--steps", "6", "--out", str(tmp_path / "straight")]) == 0
    assert main([*args, "--steps", "3", "--out", str(tmp_path / "resumed")]) == 0
    assert main([*args, "--steps", "6", "--out", str(tmp_path / "resumed")]) == 0
    straight = checkpoints.load(checkpoints.latest(tmp_path / "straight"))
    resumed = checkpoints.load(checkpoints.latest(tmp_path / "resumed"))
    assert straight["step"] == resumed["step"] == 6
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    # and so is its summary: every step in DDP's rebuilt buckets (State.settle_buckets), so
    # the resumed process's first step frames and counts its bytes as the straight run's did
    a, b = (
        json.loads((tmp_path / r / "summary.json").read_text()) for r in ("straight", "resumed")
    )
    for key in ("bytes_sent_per_rank", "bytes_received_per_rank", "bytes_sent_per_step",
                "skipped_steps", "accuracy", "best_accuracy"):  # fmt: skip
        assert a[key] == b[key], key


def test_pytorch_baselines_train_and_each_is_in_effect(tmp_path, capsys):
    """``--baseline``: PyTorch's own averaging instead of the hook; each one changes the bits
    (the hook is really registered), none is counted as terngrad traffic, and a run resumes."""
    params = {}
    for baseline in ("fp32", "fp16", "powersgd"):
        out = tmp_path / baseline
        argv = [*QUICK, "--baseline", baseline, "--check-replicas-every", "2", "--out", str(out)]
        assert main([*argv, "--steps", "4"]) == 0
        assert f"PyTorch's {baseline} averaging" in capsys.readouterr().out
        summary = json.loads((out / "summary.json").read_text())
        assert summary["method"] == baseline and summary["bytes_sent_per_rank"] is None
        assert summary["wire_bytes_per_step"] is None  # counted only inside the testbed
        assert 0 < summary["train_seconds"] < summary["seconds"]
        params[baseline] = checkpoints.load(checkpoints.latest(out))["model"]
    assert main([*argv, "--steps", "6"]) == 0  # PowerSGD resumes (its memory afresh)
    assert [m["step"] for m in _metrics(tmp_path / "powersgd")] == [2, 4, 6]
    rank4 = tmp_path / "powersgd-r4"  # the method's rank reaches PyTorch's hook
    assert main([*QUICK, "--method", "powersgd-r4", "--steps", "4", "--out", str(rank4)]) == 0
    assert json.loads((rank4 / "summary.json").read_text())["method"] == "powersgd-r4"
    params["powersgd-r4"] = checkpoints.load(checkpoints.latest(rank4))["model"]
    pairs = (
        ("fp32", "fp16"),
        ("fp32", "powersgd"),
        ("fp16", "powersgd"),
        ("powersgd", "powersgd-r4"),
    )
    for a, b in pairs:
        assert any(not torch.equal(params[a][k], params[b][k]) for k in params[a]), (a, b)
    with pytest.raises(ValueError, match="unknown baseline 'int8'"):
        Method(baseline="int8")


def test_warmup_rises_linearly_from_a_tenth_of_the_lr(tmp_path):
    """``--warmup-steps 4``: the lr of step k is lr (0.1 + 0.9 k / 4) for k < 4, then lr; the
    recorded lr of every evaluation is that of its step, and a run resumed inside the warm-up
    (3 steps, then extended to 6) continues it."""
    from conftest import SMALL_RUN

    args = [*SMALL_RUN, "--lr", "0.1", "--warmup-steps", "4", "--eval-every", "1"]
    out = tmp_path / "warm"
    assert main([*args, "--steps", "3", "--out", str(out)]) == 0
    assert main([*args, "--steps", "6", "--out", str(out)]) == 0  # resumed at step 3
    expected = [0.1 * (0.1 + 0.9 * min(k, 4) / 4) for k in range(6)]
    assert [r["lr"] for r in _metrics(out)] == pytest.approx(expected, rel=1e-12)


def test_a_time_to_accuracy_run_stops_at_its_target_and_stays_stopped(tmp_path, capsys):
    """``--stop-at-accuracy``: the run ends after the evaluation that reaches it, with a
    checkpoint of that step; run again, it trains nothing more; a higher target goes on."""
    from support import SMALL_RUN

    out = tmp_path / "run"
    args = [*SMALL_RUN, "--steps", "12", "--eval-every", "4", "--out", str(out)]
    assert main([*args, "--stop-at-accuracy", "0.01"]) == 0  # any accuracy reaches 1%
    assert "after 4 steps (its target, --stop-at-accuracy)" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["steps"], summary["stopped_at_target"]) == (4, True)
    assert checkpoints.steps(out) == [4] and [m["step"] for m in _metrics(out)] == [4]
    assert main([*args, "--stop-at-accuracy", "0.01"]) == 0  # reached before: nothing more
    assert [m["step"] for m in _metrics(out)] == [4] and checkpoints.steps(out) == [4]
    assert main([*args, "--stop-at-accuracy", "1.0"]) == 0  # never reached: to the end
    assert [m["step"] for m in _metrics(out)] == [4, 8, 12]
    assert json.loads((out / "summary.json").read_text())["stopped_at_target"] is False
    # a loss target (a language model's): the first evaluation whose test loss is at most it
    out = tmp_path / "by-loss"
    args = [*SMALL_RUN, "--steps", "12", "--eval-every", "4", "--out", str(out)]
    assert main([*args, "--stop-at-loss", "100"]) == 0  # any loss is under 100 nats
    assert "after 4 steps (its target, --stop-at-loss)" in capsys.readouterr().out
    assert main([*args, "--stop-at-loss", "100"]) == 0  # reached before: nothing more
    assert [m["step"] for m in _metrics(out)] == [4] and checkpoints.steps(out) == [4]
