"""Fault injection end to end: a SIGKILLed run resumed bit for bit, NaN steps, damaged, forged
or foreign checkpoints refused and kept, a killed or stopped worker ending the job in one line."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from support import MLP_RUN as RUN
from support import gone as _gone
from support import kill_group
from support import refused as _refused
from support import workers_of as _workers

from terngrad.cli import main
from terngrad.train import checkpoints


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
    assert main(_train_command(straight, 18)[3:]) == 0  # (in this process: the same launch)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_command(killed, 18), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while checkpoints.latest(killed) is None or checkpoints.steps(killed)[-1] < 6:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    kill_group(proc.pid)  # the launcher and every worker, at once; returns when all are gone
    proc.wait()
    at_kill = checkpoints.steps(killed)
    assert 6 <= at_kill[-1] < 18
    assert main(_train_command(killed, 18)[3:]) == 0  # started again
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


def test_a_killed_worker_stops_the_job_with_one_line_and_it_resumes(tmp_path):
    """SIGKILL one worker (not the launcher): the job stops at once with one line naming it,
    and the same command then resumes and finishes."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "run"
    proc = subprocess.Popen(_train_command(out, 20), env=env, start_new_session=True,
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
    assert main(_train_command(out, 20)[3:]) == 0  # the same command (in this process)
    assert checkpoints.steps(out)[-1] == 20


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
