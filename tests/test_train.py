"""`terngrad train`: a real 2-worker run writes every output; it resumes from its checkpoint."""

import json

import pytest
import torch

from terngrad.cli import main
from terngrad.comm import Options
from terngrad.train import checkpoints
from terngrad.train.config import TrainConfig

ARGS = ["train", "--model", "lenet", "--dataset", "mnist", "--workers", "2", "--quiet",
        "--total-batch-size", "32", "--eval-every", "2"]  # fmt: skip


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


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dataset", "cifar10"], "CIFAR-10 needs --data-dir"),
        (["--total-batch-size", "33"], "does not split evenly over 2 workers"),
        (["--quantizer", "qsgd", "--levels", "4"], "levels must be odd"),
    ],
)
def test_bad_runs_fail_before_training(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "2", "--out", str(tmp_path / "x"), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_unwritable_out(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "2", "--out", str(blocker)])
    assert exc.value.code == 2 and "is not a folder" in capsys.readouterr().err
    assert blocker.read_text() == "keep me"


def test_config_validation():
    with pytest.raises(ValueError, match=r"one of batch-size .* and total-batch-size, not both"):
        TrainConfig(out="x", batch_size=8, total_batch_size=64)
    assert TrainConfig(out="x").batch_size == 64  # neither: 64 a worker, said once
    with pytest.raises(ValueError, match="a run's seed and timeout are its own"):
        TrainConfig(out="x", exchange=Options(seed=3))
    with pytest.raises(ValueError, match="unknown optimizer"):
        TrainConfig(out="x", optimizer="lbfgs")
    cfg = TrainConfig(out="x", total_batch_size=64, batch_size=None, workers=4)
    assert cfg.worker_batch == 16
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


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


def test_batch_size_and_total_batch_size_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--batch-size", "8", "--steps", "2", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2
    assert "give one of batch-size (per worker) and total-batch-size" in capsys.readouterr().err


def test_the_config_embeds_the_exchange_options_and_reads_the_flat_layout_of_0_1():
    from pathlib import Path

    from terngrad.comm import Options

    saved = json.loads(
        (Path(__file__).parent.parent / "docs/results/lenet/terngrad-2w/summary.json").read_text()
    )["config"]  # written by terngrad 0.1: the exchange's options beside the run's
    cfg = TrainConfig.from_dict(saved)
    assert cfg.exchange == Options(quantize_last=True, min_numel=0)
    assert (cfg.seed, cfg.timeout) == (0, 300.0)  # the run's own, read from the exchange's
    assert (cfg.lr, cfg.total_batch_size, cfg.steps) == (0.01, 64, 10000)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["exchange"]["quantize_last"] is True
    other = TrainConfig(out="y", exchange=cfg.exchange.replace(topology="ps"), lr=0.5)
    assert cfg.diff(other, ignore=("out",)) == [
        "batch_size=64 instead of None",
        "lr=0.5 instead of 0.01",
        "lr_schedule='constant' instead of 'poly'",
        "steps=1000 instead of 10000",
        "topology='ps' instead of 'sharded'",
        "total_batch_size=None instead of 64",
        "weight_decay=0.0 instead of 0.0005",
        "workers=4 instead of 2",
    ]
    assert TrainConfig(out="x", exchange=Options()).hook_options.timeout == 300.0
    old = {**cfg.to_dict(), "exchange": {**cfg.to_dict()["exchange"], "seed": 7, "timeout": 60}}
    del old["seed"], old["timeout"]  # as 0.3 wrote them: in the exchange's options
    moved = TrainConfig.from_dict(old)
    assert (moved.seed, moved.timeout, moved.exchange.seed) == (7, 60, 0)
    assert moved.hook_options.seed == 7 and "seed" not in moved.to_dict()["exchange"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--topology", "ring"], "unknown topology 'ring'; choose one of: sharded, ps, allgather"),
        (["--clip", "2", "--no-clip"], "give --clip or --no-clip, not both"),
        (["--quantizer", "linear", "--policy", "auto"], "policy 'auto' predicts"),
        (["--seed", "1" + "0" * 30], "expected an integer from -2**63 to 2**63 - 1"),
        (["--levels", "3"], "quantizer 'terngrad' has no option 'levels'"),
    ],
)
def test_bad_exchange_options_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--steps", "2", "--out", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_pytorch_baselines_train_and_each_is_in_effect(tmp_path, capsys):
    """``--baseline``: PyTorch's own averaging instead of the hook; each one changes the bits
    (the hook is really registered), none is counted as terngrad traffic, and a run resumes."""
    params = {}
    for baseline in ("fp32", "fp16", "powersgd"):
        out = tmp_path / baseline
        argv = [*ARGS, "--baseline", baseline, "--check-replicas-every", "2", "--out", str(out)]
        assert main([*argv, "--steps", "4"]) == 0
        assert f"PyTorch's {baseline} averaging" in capsys.readouterr().out
        summary = json.loads((out / "summary.json").read_text())
        assert summary["method"] == baseline and summary["bytes_sent_per_rank"] is None
        assert summary["wire_bytes_per_step"] is None  # counted only inside the testbed
        assert 0 < summary["train_seconds"] < summary["seconds"]
        params[baseline] = checkpoints.load(checkpoints.latest(out))["model"]
    assert main([*argv, "--steps", "6"]) == 0  # PowerSGD resumes (its memory afresh)
    assert [m["step"] for m in _metrics(tmp_path / "powersgd")] == [2, 4, 6]
    for a, b in (("fp32", "fp16"), ("fp32", "powersgd"), ("fp16", "powersgd")):
        assert any(not torch.equal(params[a][k], params[b][k]) for k in params[a]), (a, b)
    with pytest.raises(ValueError, match="unknown baseline 'int8'"):
        TrainConfig(out="x", baseline="int8")


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


def test_warmup_epochs_count_the_training_set_over_all_workers():
    from terngrad.train import schedule

    epoch = schedule.steps_per_epoch(60_000, workers=4, worker_batch=64)
    assert epoch == 235  # ceil(60000 / 256)
    assert schedule.warmup_length(0, 5.0, epoch) == 1175
    assert schedule.warmup_length(7, 0.0, epoch) == 7
    factor = schedule.lr_factor("constant", steps=2000, power=0.5, warmup=1175)
    assert factor(0) == pytest.approx(0.1)
    assert factor(1175 // 2) == pytest.approx(0.1 + 0.9 * 587 / 1175)
    assert factor(1175) == factor(1999) == 1.0
    poly = schedule.lr_factor("poly", steps=10, power=1.0, warmup=4)  # the two multiply
    assert [poly(k) for k in (0, 2, 4, 8)] == pytest.approx([0.1, 0.55 * 0.8, 0.6, 0.2])
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(out="x", warmup_steps=10, warmup_epochs=1.0)
    for bad in ({"warmup_steps": -1}, {"warmup_steps": 2.5}, {"warmup_epochs": float("nan")}):
        with pytest.raises(ValueError, match="warmup"):
            TrainConfig(out="x", **bad)
