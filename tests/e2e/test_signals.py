"""A run's lifetime and folder under hostile conditions: a signal to the launcher
alone stops every worker; a SIGKILLed launcher's workers hold the folder until they are gone
and end by themselves; fewer steps than the checkpoint are refused; a folder removed mid-run
ends the run in one line; an evaluation record the metrics lost is written back on resume;
local steps killed or stopped around their outer steps (with overlap: during the exchange in
flight) resume bitwise, and a checkpoint of theirs that cannot be written leaves no part."""

import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import SMALL_RUN as RUN
from support import gone, kill_group, refused, workers_of

from terngrad.cli import main
from terngrad.train import checkpoints, run_folder
from terngrad.train.outputs import METRICS

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


#: runs of each case of the signal test (``TERNGRAD_SIGNAL_REPEATS=10`` for the issue-42 loop;
#: each run starts a launcher, seconds on two cores)
REPEATS = int(os.environ.get("TERNGRAD_SIGNAL_REPEATS", "1"))


def _sigint(disposition):
    """In the child before exec: SIGINT to ``disposition`` — the default, or ignored, as a shell
    without job control starts a background command (and ignored signals are inherited)."""
    return lambda: signal.signal(signal.SIGINT, disposition)


def _start(out, steps=4000, sigint=signal.SIG_DFL, extra=(), preexec=None):
    """A long two-worker run (``RUN`` and ``extra``) in its own session (SIGINT set to
    ``sigint``, then ``preexec`` called in the child), returned once it has a checkpoint (so
    its workers train and hold the folder)."""
    argv = [sys.executable, "-m", "terngrad.cli", *RUN, *extra, "--steps", str(steps),
            "--checkpoint-every", "2", "--out", str(out)]  # fmt: skip

    def before_exec():
        _sigint(sigint)()
        if preexec is not None:
            preexec()

    proc = subprocess.Popen(argv, env=ENV, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=before_exec)  # fmt: skip
    deadline = time.monotonic() + 300
    while not checkpoints.steps(out):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run did not start: {proc.communicate()}")
        time.sleep(0.05)
    return proc


def _held(out) -> bool:
    """Whether some process holds ``out``'s lock (tried without taking it for long)."""
    fd = os.open(out / run_folder.LOCK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _holders(out) -> list[str]:
    """The processes with ``out``'s lock file open (what holds the folder, when it is held)."""
    lock = str((out / run_folder.LOCK).resolve())
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == lock:
                found.append(_command(int(fd.parts[2])))
        except OSError:  # (a process or descriptor gone meanwhile)
            pass
    return sorted(set(found))


def _session(pid: int, seconds: float = 10) -> list[str]:
    """The processes of session ``pid`` still alive (not zombies) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        found = subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True)
        alive = [int(p) for p in found.stdout.split() if not gone(int(p), 0)]
        if not alive or time.monotonic() > deadline:
            return [_command(p) for p in alive]
        time.sleep(0.1)


def _command(pid: int) -> str:
    try:
        return (
            f"{pid}: " + (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")).decode()
        )
    except OSError:
        return f"{pid}: gone"


@pytest.mark.parametrize(
    "sig, says",
    [(signal.SIGTERM, "stopped by SIGTERM; every worker was stopped"),
     (signal.SIGHUP, "stopped by SIGHUP; every worker was stopped"),
     (signal.SIGINT, "interrupted")],
)  # fmt: skip
def test_a_signal_to_the_launcher_alone_stops_every_worker(tmp_path, sig, says):
    """What a scheduler or ``kill PID`` sends reaches the workers: none trains on, the folder
     is free once the launcher has returned, and nothing is written after it. SIGINT whether the
     launcher inherited it at its default or ignored (a background command of a shell without
     job control: the runs alternate, the first ignored), which left every process running
    . ``REPEATS`` runs each."""
    for run in range(REPEATS):
        sigint = signal.SIG_IGN if run % 2 == 0 else signal.SIG_DFL
        _signal_stops_every_worker(tmp_path / f"run{run}", sig, says, sigint)


def _signal_stops_every_worker(out, sig, says, sigint):
    proc = _start(out, sigint=sigint)
    workers = workers_of(proc.pid)
    assert len(workers) == 2, workers
    sent = time.monotonic()
    os.kill(proc.pid, sig)  # the launcher alone, not its process group
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # (the failure once seen: the launcher trained on)
        left = _session(proc.pid, 0)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{signal.Signals(sig).name} left the run going: {left}")
    assert proc.returncode == 128 + sig, err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert all(gone(w, 0) for w in workers)  # before the launcher returned
    assert time.monotonic() - sent < 15
    assert not _held(out)
    written = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    time.sleep(1)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == written
    assert _session(proc.pid) == []


def test_a_sigkilled_launchers_workers_hold_the_folder_until_they_are_gone(tmp_path, capsys):
    """SIGKILL cannot be caught: the workers hold the folder's lock with the launcher (a
    second run is refused while any lives) and end by themselves once it is gone. The
    workers are stopped first, so that the lock is seen held while they live."""
    out = tmp_path / "run"
    proc = _start(out)
    workers = workers_of(proc.pid)
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _held(out)
        err = refused(capsys, [*RUN, "--steps", "4000", "--out", str(out)])
        assert f"--out {out} is in use by another run" in err
    finally:
        for w in workers:
            os.kill(w, signal.SIGCONT)
    assert all(gone(w, 10) for w in workers)
    assert not _held(out), _holders(out)
    assert _session(proc.pid) == []
    assert "the launcher (PID" in proc.stderr.read()
    newest = checkpoints.steps(out)[-1]  # and the folder resumes
    assert main([*RUN, "--steps", str(newest + 2), "--out", str(out)]) == 0


def test_fewer_steps_than_the_checkpoint_are_refused_and_nothing_is_rewritten(
    tmp_path, capsys, finished_run
):
    out = finished_run(4, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != run_folder.LOCK}
    err = refused(capsys, [*RUN, "--steps", "2", "--out", str(out)])
    assert f"--steps 2 is fewer than the 4 steps {checkpoints.path_for(out, 4)} has trained" in err
    assert "give --steps 4 or more" in err
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != run_folder.LOCK}
    assert after == before  # config.json and summary.json as they were
    assert main([*RUN, "--steps", "4", "--out", str(out)]) == 0  # the same steps: fine


def test_a_folder_removed_mid_run_ends_it_in_one_line(tmp_path):
    import shutil

    out = tmp_path / "run"
    proc = _start(out)
    # gone from its path in one step, as `rm -rf` leaves it; emptied once the run has ended
    # (a tree removed under a run that still writes into it may refuse to go: ENOTEMPTY)
    os.rename(out, tmp_path / "removed")
    _, err = proc.communicate(timeout=120)
    shutil.rmtree(tmp_path / "removed")
    assert proc.returncode == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"into --out {out} at step" in err
    assert (
        "the folder was removed during the run, which stopped there, and its checkpoints "
        "with it: run the same command again to start afresh" in err
    )  # (none to resume from)
    assert _session(proc.pid) == []


def test_an_evaluation_the_metrics_lost_is_written_back_on_resume(tmp_path, finished_run):
    """The last line of metrics.jsonl damaged (a crash mid-append, a full disk): the record of
    the checkpoint's step comes back from the checkpoint, as it was, when the run goes on."""
    out = finished_run(4, tmp_path / "run")
    lines = (out / METRICS).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [2, 4]
    (out / METRICS).write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    assert main([*RUN, "--steps", "6", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / METRICS).read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    assert records[1] == json.loads(lines[1])


def test_as_many_steps_as_the_checkpoint_sum_up_its_own_evaluation(tmp_path, finished_run):
    """``--steps`` equal to the checkpoint's, which made no evaluation (checkpoints between
    evaluations) and whose metrics are gone: nothing is trained, the checkpoint is evaluated,
    and the summary gives that evaluation's loss beside its accuracy (it said ``loss: null``)."""
    out = finished_run(2, tmp_path / "run")
    path = checkpoints.latest(out)
    ckpt = checkpoints.load(path)
    ckpt["evaluation"] = None  # a checkpoint written between two evaluations
    checkpoints.save(path, ckpt)
    (out / METRICS).unlink()
    assert main([*RUN, "--steps", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and 0 <= summary["accuracy"] <= 1
    assert summary["loss"] > 0 and summary["best_loss"] == summary["loss"]


LOCAL = ["--local-steps", "2", "--optimizer", "adamw", "--lr", "1e-3"]


@pytest.mark.parametrize(
    "sig, overlap",
    [(signal.SIGKILL, False), (signal.SIGKILL, True), (signal.SIGTERM, True),
     (signal.SIGINT, True)],
    ids=["kill", "kill-overlap", "sigterm-overlap", "sigint-overlap"],
)  # fmt: skip
def test_local_steps_stopped_by_a_signal_resume_bitwise(tmp_path, sig, overlap):
    """Local steps (H = 2, outer steps at every checkpoint), SIGKILLed (the launcher and its
    workers at once) or sent SIGTERM or SIGINT (the launcher alone) once training: with
    overlap, an outer exchange is in flight at every moment after the first outer step. The
    run stops (SIGTERM, SIGINT: status 128 + the signal, every worker stopped), and resumed
    it ends bitwise as a straight run of the same steps."""
    local = [*LOCAL, *(["--outer-overlap"] if overlap else [])]
    out = tmp_path / "run"
    proc = _start(out, extra=local)
    time.sleep(0.5)  # (a few more steps, outer steps among them)
    if sig == signal.SIGKILL:
        kill_group(proc.pid)
        proc.wait()
    else:
        os.kill(proc.pid, sig)
        proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig
    assert _session(proc.pid) == [] and not _held(out)
    steps = checkpoints.steps(out)[-1] + 4
    assert main([*RUN, *local, "--steps", str(steps), "--out", str(out)]) == 0  # resumed
    straight = tmp_path / "straight"
    assert main([*RUN, *local, "--steps", str(steps), "--out", str(straight)]) == 0
    a, b = (checkpoints.load(checkpoints.latest(p)) for p in (straight, out))
    assert a["step"] == b["step"] == steps
    assert all(torch.equal(t, b["model"][k]) for k, t in a["model"].items())
    assert a["hook_states"][0]["outer_steps"] == b["hook_states"][0]["outer_steps"] == steps // 2


def _file_size_limit(limit: int):
    """In the child before exec: files it (and every process it starts) writes end at
    ``limit`` bytes; a write past it fails with EFBIG (Python ignores SIGXFSZ), as a full disk
    fails one with ENOSPC."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_local_steps_checkpoint_that_cannot_be_written_stops_the_run_and_leaves_no_part(
    tmp_path,
):
    """Disk full during a local-steps checkpoint (its anchor, outer and inner optimizers make
    it several MB: writes stop at 1 MB): the run stops with status 1 and one line naming the
    write, no checkpoint and no part of one is left, the folder is free, and the same command
    (room again) trains."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "terngrad.cli", *RUN, *LOCAL, "--steps", "4",
            "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300,
                          preexec_fn=_file_size_limit(1 << 20))  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("terngrad:")]
    assert len(lines) == 1 and "File too large" in lines[0], done.stderr
    assert checkpoints.steps(out) == [] and not _held(out)
    assert [p.name for p in out.iterdir() if ".tmp" in p.name or p.name.endswith(".pt")] == []
    assert main([*RUN, *LOCAL, "--steps", "4", "--out", str(out)]) == 0
    assert checkpoints.steps(out)[-1] == 4
