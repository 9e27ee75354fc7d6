"""Fault injection: damaged checkpoints, a SIGKILLed run resumed bit for bit, NaN steps,
diverged replicas, a stuck rank, and every kind of bad input — each with one clear error."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import comm_workers as w
import pytest
import torch
from conftest import refused as _refused
from distributed import run

from terngrad.cli import main
from terngrad.train import checkpoints

RUN = ["train", "--model", "mlp", "--dataset", "synthetic", "--quiet"]


def test_checkpoint_files_are_whole_or_refused(tmp_path):
    state = {"format": 2, "step": 3, "weights": torch.arange(10.0)}
    path = checkpoints.path_for(tmp_path, 3)
    checkpoints.save(path, state)
    loaded = checkpoints.load(path)
    assert loaded["step"] == 3 and torch.equal(loaded["weights"], state["weights"])
    raw = path.read_bytes()
    cases = {
        "truncated": raw[: len(raw) // 2],
        "bit-flipped": raw[:-100] + bytes([raw[-100] ^ 0x10]) + raw[-99:],
        "empty": b"",
    }
    for name, data in cases.items():
        bad = tmp_path / f"{name}.pt"
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=r"damaged|not a terngrad"):
            checkpoints.load(bad)
    torch.save(state, tmp_path / "plain.pt")  # a torch file, not ours
    with pytest.raises(ValueError, match="not a terngrad training checkpoint"):
        checkpoints.load(tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="no checkpoint at"):
        checkpoints.load(tmp_path / "missing.pt")
    for step in (5, 7, 9, 11):
        checkpoints.save(checkpoints.path_for(tmp_path, step), state)
    checkpoints.prune(tmp_path, 2)
    assert checkpoints.steps(tmp_path) == [9, 11]
    assert checkpoints.latest(tmp_path) == checkpoints.path_for(tmp_path, 11)
    assert not list(tmp_path.glob(".*.tmp"))


def _train_command(out, steps):
    args = [*RUN, "--workers", "3", "--total-batch-size", "48", "--steps", str(steps),
            "--eval-every", "6", "--checkpoint-every", "2", "--check-replicas-every", "4",
            "--out", str(out)]  # fmt: skip
    return [sys.executable, "-m", "terngrad.cli", *args]


def test_sigkilled_run_resumes_bitwise_identical(tmp_path):
    """3 workers (so fp32 sums have an order to get wrong), default exclusions (the last
    layer and small tensors in fp32): killed with SIGKILL mid-run, started again, it ends
    with the same bits as a run that was never interrupted."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    straight = tmp_path / "straight"
    subprocess.run(_train_command(straight, 18), check=True, env=env, timeout=600)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_command(killed, 18), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while checkpoints.latest(killed) is None or checkpoints.steps(killed)[-1] < 6:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker, at once
    proc.wait()
    at_kill = checkpoints.steps(killed)
    assert 6 <= at_kill[-1] < 18
    subprocess.run(_train_command(killed, 18), check=True, env=env, timeout=600)
    a = checkpoints.load(checkpoints.latest(straight))
    b = checkpoints.load(checkpoints.latest(killed))
    assert a["step"] == b["step"] == 18
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert checkpoints.steps(killed) == [14, 16, 18]  # the newest 3 kept


def test_nan_steps_stop_training_with_the_last_good_checkpoint_intact(tmp_path, capsys):
    out = tmp_path / "nan"
    args = [*RUN, "--workers", "2", "--lr", "1e12", "--steps", "40", "--checkpoint-every", "1",
            "--max-skipped-steps", "3", "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "3 consecutive steps" in err and "NaN or Inf gradient" in err
    last = checkpoints.latest(out)
    assert last is not None and last.name in err
    good = checkpoints.load(last)
    assert all(torch.isfinite(t).all() for t in good["model"].values())


def test_diverged_replicas_are_named():
    for message in run(w.diverged_replicas, 3):
        assert message.startswith("replicas diverged at step 4: rank(s) 1 hold other parameters")
        assert "first difference: body.2.weight" in message


def test_a_stuck_rank_fails_the_others_within_the_timeout():
    fast, _ = run(w.stuck_rank, 2)
    assert "another rank has died or is stuck" in fast["message"]
    assert "at most 2 s" in fast["message"]
    assert fast["seconds"] < 6  # well before the stuck rank wakes up, not after 30 minutes


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*RUN, "--steps", "-3"], "expected a positive integer"),
        ([*RUN, "--steps", "0"], "expected a positive integer"),
        ([*RUN[:1], "--model", "resnet"], "invalid choice: 'resnet'"),
        ([*RUN, "--timeout", "0"], "expected a positive number of seconds"),
        ([*RUN, "--check-replicas-every", "-1"], "expected an integer >= 0"),
        ([*RUN, "--resume", "nowhere.pt"], "no checkpoint at nowhere.pt"),
        (["bench", "network", "--bandwidth", "fast"], "bandwidth must be a rate"),
        (["study", "--draws", "1"], "expected an integer >= 2"),
    ],
)
def test_bad_input_gets_one_line_and_status_2(tmp_path, capsys, argv, message):
    argv = [*argv, "--out", str(tmp_path / "x")] if argv[0] in ("train", "study") else argv
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir())


BAD_VALUES = [
    (["--lr", "inf"], "argument --lr: expected a positive finite number, got inf"),
    (["--lr", "nan"], "argument --lr: expected a positive finite number, got nan"),
    (["--momentum", "inf"], "argument --momentum: expected a number from 0 up to"),
    (["--momentum", "-1"], "argument --momentum: expected a number from 0 up to"),
    (["--momentum", "1"], "argument --momentum: expected a number from 0 up to"),
    (["--weight-decay", "inf"], "argument --weight-decay: expected a finite number >= 0"),
    (["--weight-decay", "-1"], "argument --weight-decay: expected a finite number >= 0"),
    (["--lr-power", "inf"], "argument --lr-power: expected a positive finite number"),
    (["--clip", "2", "--no-clip"], "give --clip or --no-clip, not both"),
    (["--warmup-steps", "5", "--warmup-epochs", "1"], "give warmup-steps or warmup-epochs, not"),
    (["--warmup-epochs", "inf"], "argument --warmup-epochs: expected a finite number >= 0"),
    (["--aggregate", "coherent"], "terngrad has no such levels (its grid is shared already"),
    (["--dropout", "-1"], "argument --dropout: expected a number from 0 up to"),
    (["--dropout", "1.5"], "argument --dropout: expected a number from 0 up to"),
    (["--dropout", "inf"], "argument --dropout: expected a number from 0 up to"),
    (["--dropout", "nan"], "argument --dropout: expected a number from 0 up to"),
    (["--seed", "1" * 31], "argument --seed: expected an integer from -2**63 to 2**63 - 1"),
    (["--timeout", "inf"], "argument --timeout: expected a positive number of seconds, at most"),
    (["--timeout", "1e30"], "argument --timeout: expected a positive number of seconds, at most"),
    (["--kernels", "triton"], "--kernels triton runs on CUDA tensors"),
    (["--policy", "auto", "--quantizer", "linear"], "policy 'auto' predicts the exchange"),
    (["--rdzv-endpoint", "foo:bar"], "--rdzv-endpoint 'foo:bar' is not HOST:PORT"),
    (["--workers", "100000"], "--workers 100000 would start 100000 processes on this machine"),
    (["--nnodes", "2", "--node-rank", "5"], "--node-rank 5 is not a node of a 2-node run"),
    (["--batch-size", "100000"], "a batch of 100000 per worker is larger than each worker's"),
    (["--dataset", "cifar10"], "CIFAR-10 needs --data-dir"),
    (["--bogus"], "terngrad: error: unrecognized arguments: --bogus (see terngrad --help)"),
    (["--out"], "terngrad train: error: argument --out: expected one argument (see terngrad"),
    (["--out", ""], "out must name a folder, got ''"),
]


@pytest.mark.parametrize("flags, message", BAD_VALUES, ids=[" ".join(f) for f, _ in BAD_VALUES])
def test_bad_values_are_refused_before_any_worker_starts(tmp_path, capsys, monkeypatch, flags,
                                                         message):  # fmt: skip
    """Exit status 2, one line, no worker started, nothing written."""
    from torch.distributed import run as torchrun

    from terngrad.train import launch

    def started(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(launch, "_spawn", started)
    monkeypatch.setattr(torchrun, "main", started)
    out = tmp_path / "x"
    with pytest.raises(SystemExit) as exc:
        main([*RUN, "--steps", "2", "--out", str(out), *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_bad_values_are_refused_by_the_python_api_too():
    from terngrad.ddp import Options
    from terngrad.train.config import TrainConfig

    for field, value in [("lr", math.inf), ("lr", math.nan), ("momentum", -1.0),
                         ("weight_decay", math.inf), ("lr_power", math.inf), ("dropout", 1.5),
                         ("dropout", math.nan), ("out", "")]:  # fmt: skip
        with pytest.raises(ValueError, match=field.replace("_", "-")):
            TrainConfig(**{"out": "x", field: value})
    for timeout in (math.inf, 1e30, math.nan):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
            Options(timeout=timeout)


def test_model_scale_refuses_infinite_speeds(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["perf-model", "scale", "--gpu-tflops", "inf"])
    assert exc.value.code == 2
    assert "argument --gpu-tflops: expected a positive finite number, got inf" in (
        capsys.readouterr().err
    )


def test_damaged_or_foreign_checkpoints_are_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "run"
    base = [*RUN, "--workers", "2", "--steps", "2", "--eval-every", "2", "--out", str(out)]
    assert main(base) == 0
    ckpt = checkpoints.latest(out)
    raw = ckpt.read_bytes()
    ckpt.write_bytes(raw[:-10])  # truncated
    with pytest.raises(SystemExit) as exc:
        main([*base[:-4], "--steps", "4", "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and len(err.strip().splitlines()) == 1
    assert ckpt.read_bytes() == raw[:-10]  # nothing overwritten
    ckpt.write_bytes(raw)
    other = tmp_path / "other"  # a checkpoint of another model, given with --resume
    with pytest.raises(SystemExit) as exc:
        main([*RUN[:1], "--model", "lenet", "--dataset", "synthetic", "--quiet", "--workers", "2",
              "--steps", "4", "--resume", str(ckpt), "--out", str(other)])  # fmt: skip
    assert exc.value.code == 2
    assert (
        "belongs to a different run (this run's settings instead of the checkpoint's: "
        "model='lenet' instead of 'mlp')"
    ) in capsys.readouterr().err


def test_ranks_started_with_different_settings_fail_naming_them():
    for message in run(w.mismatched_runs, 2):
        assert message == (
            "the ranks were started with different settings (compared with rank 0): rank 1: "
            "lr=0.5 instead of 0.01, model='mlp' instead of 'lenet'"
        )


def test_resuming_an_older_checkpoint_into_a_newer_run_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    base = [*RUN, "--workers", "2", "--steps", "4", "--eval-every", "2", "--out", str(out)]
    assert main(base) == 0
    older = checkpoints.path_for(out, 2)
    with pytest.raises(SystemExit) as exc:
        main([*base, "--resume", str(older)])
    assert exc.value.code == 2
    assert "holds checkpoints newer than" in capsys.readouterr().err
    assert checkpoints.steps(out) == [2, 4]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--max-restarts", "2"])
    assert exc.value.code == 2 and "--max-restarts needs torchrun" in capsys.readouterr().err


def test_a_record_cut_short_by_a_crash_is_dropped_on_resume(tmp_path):
    from terngrad.train.outputs import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 2, "loss": 1.0}\n{"step": 4, "loss": 0.9}\n{"step": 6, "lo')
    truncate_metrics(path, 4)
    assert path.read_text() == '{"step": 2, "loss": 1.0}\n{"step": 4, "loss": 0.9}\n'


def test_error_feedback_of_a_skipped_step_is_dropped():
    from terngrad.comm.memory import ErrorFeedback

    memory = ErrorFeedback()
    memory.update(("a",), (3,), torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3))
    memory.commit()
    memory.update(("a",), (3,), torch.tensor([float("nan")] * 3), torch.zeros(3))
    memory.discard()  # the step was skipped
    assert torch.equal(memory.residuals["a"], torch.tensor([1.0, 2.0, 3.0]))


def test_a_killed_worker_stops_the_job_with_one_line_and_it_resumes(tmp_path):
    """SIGKILL one worker (not the launcher): the job stops at once with one line naming it,
    and the same command then resumes and finishes."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "run"
    proc = subprocess.Popen(_train_command(out, 40), env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while not checkpoints.steps(out):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    workers = _workers(proc.pid)
    assert len(workers) == 3, workers
    os.kill(workers[-1], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "terngrad: a worker died" in err and "Run the same command again" in err
    assert len(err.strip().splitlines()) <= 3  # no traceback
    subprocess.run(_train_command(out, 40), check=True, env=env, timeout=600,
                   capture_output=True)  # fmt: skip
    assert checkpoints.steps(out)[-1] == 40


@pytest.mark.parametrize("forgery", ["no hook states", "one generator too few"])
def test_a_forged_checkpoint_with_a_valid_checksum_is_refused(
    tmp_path, capsys, forgery, finished_run
):
    out = finished_run(2, tmp_path / "run")
    base = [*RUN, "--workers", "2", "--eval-every", "2", "--out", str(out)]
    path = checkpoints.latest(out)
    ckpt = checkpoints.load(path)
    if forgery == "no hook states":
        del ckpt["hook_states"]
        expected = "is not a whole terngrad training checkpoint: its 'hook_states' is missing"
    else:
        ckpt["rng_states"] = ckpt["rng_states"][:1]
        expected = "it holds 2 hook states and 1 generators for 2 workers, at step 2"
    checkpoints.save(path, ckpt)  # a valid checksum over the forged contents
    raw = path.read_bytes()
    assert expected in _refused(capsys, [*base, "--steps", "4"])
    assert path.read_bytes() == raw


def test_the_advice_for_a_damaged_checkpoint_works(tmp_path, capsys, finished_run):
    """The refusal says what to do, and doing it resumes from the checkpoint before."""
    out = finished_run(4, tmp_path / "run")
    base = [*RUN, "--workers", "2", "--eval-every", "2", "--out", str(out)]
    newest = checkpoints.path_for(out, 4)
    newest.write_bytes(newest.read_bytes()[:-10])
    err = _refused(capsys, [*base, "--steps", "6"])
    assert f"checkpoint {newest} is damaged (truncated or modified" in err
    assert (
        f"move it out of --out {out} (or delete it) and run the same command again to resume "
        "from the one before it (step 2)"
    ) in err
    older = str(checkpoints.path_for(out, 2))  # --resume the older one: the damaged one first
    err = _refused(capsys, [*base, "--steps", "6", "--resume", older])
    assert "delete the newer checkpoints first" in err and "--resume" not in err.split(":")[-1]
    newest.unlink()  # the advice
    assert main([*base, "--steps", "6"]) == 0
    assert checkpoints.steps(out)[-1] == 6
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]


def test_a_stopped_worker_ends_the_run_soon_after_the_timeout(tmp_path):
    """SIGSTOP one worker: the other fails within --timeout, and the launcher kills the stopped
    one (it takes no SIGTERM) and exits within seconds, not after torch's 30 s."""
    from terngrad.train.launch import STOP_GRACE

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "terngrad.cli",
        *RUN,
        "--workers",
        "2",
        "--steps",
        "400",
        "--eval-every",
        "100",
        "--checkpoint-every",
        "2",
        "--timeout",
        "3",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not checkpoints.steps(out):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        workers = _workers(proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - stopped
        assert _gone(workers[1])  # the launcher killed the stopped worker
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err
    assert "another rank has died or is stuck" in err and len(err.strip().splitlines()) <= 3
    assert waited < 3 + 2 * STOP_GRACE + 15  # torch's own join waits 30 s after SIGTERM


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _workers(launcher: int) -> list[int]:
    """The training processes of a launcher: the children of its fork server (not
    multiprocessing's resource tracker), in the order they were started."""
    servers = [p for p in _children(launcher)
               if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]  # fmt: skip
    assert len(servers) == 1, _children(launcher)
    return sorted(_children(servers[0]))


def _gone(pid: int, seconds: float = 10) -> bool:
    """Whether process ``pid`` has ended (or is a zombie waiting to be reaped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False
