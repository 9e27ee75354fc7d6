"""A run never destroys another run's files: one run a folder (the second is refused naming the
holder), a killed run's temporary files removed at the next start, another run's outputs and
histories never overwritten or mixed."""

import json
import os
import subprocess
import sys
import time

import pytest
from support import SMALL_RUN as RUN
from support import kill_group
from support import refused as _refused

from terngrad.cli import main
from terngrad.train import checkpoints, run_folder
from terngrad.util.files import atomic_write

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != run_folder.LOCK}


def _wait_for(predicate, proc, seconds=300):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_second_run_on_a_folder_in_use_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "terngrad.cli", *RUN, "--steps", "400", "--checkpoint-every",
         "100", "--out", str(out)],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: checkpoints.steps(out), first)  # it holds the folder and trains
        err = _refused(capsys, [*RUN, "--steps", "400", "--out", str(out)])
        assert f"--out {out} is in use by another run (PID {first.pid} on " in err
        assert "wait for it to finish, or choose another --out" in err
        assert f"PID {first.pid} " in (out / run_folder.LOCK).read_text()  # still the holder
    finally:
        kill_group(first.pid)  # the launcher, its fork server and its workers, all gone
        first.wait()
    # the holder was killed: the kernel dropped its lock, and the same folder resumes
    done = checkpoints.steps(out)[-1]
    assert main([*RUN, "--steps", str(done + 2), "--out", str(out)]) == 0
    assert checkpoints.steps(out)[-1] == done + 2


def test_a_killed_writes_temporary_file_is_removed_at_the_next_start(tmp_path, finished_run):
    out = finished_run(2, tmp_path / "run")
    writer = subprocess.Popen(  # killed in the middle of an atomic write, as a crash would
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from terngrad.util.files import atomic_write; atomic_write(Path(sys.argv[1]), "
         "lambda f: (f.write(b'x' * 1000), f.flush(), print('writing', flush=True), "
         "time.sleep(60)))", str(checkpoints.path_for(out, 4))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert writer.stdout.readline() == "writing\n"
    writer.kill()
    writer.wait()
    left = [p for p in out.iterdir() if p.name.startswith(".checkpoint-00000004.pt.")]
    assert len(left) == 1 and left[0].stat().st_size == 1000
    keep = [out / "notes.tmp", out / ".hidden"]  # not a leftover of atomic_write: kept
    for path in keep:
        path.write_text("mine")
    assert main([*RUN, "--steps", "4", "--out", str(out)]) == 0
    assert not left[0].exists() and not list(out.glob(".*.tmp"))
    assert all(p.read_text() == "mine" for p in keep)
    assert checkpoints.steps(out)[-1] == 4


def test_another_runs_outputs_are_never_overwritten(tmp_path, capsys, finished_run):
    out = finished_run(2, tmp_path / "run")
    for path in checkpoints.steps(out):
        checkpoints.path_for(out, path).unlink()
    (out / "config.json").unlink()  # outputs of some run, no checkpoint, no settings: not ours
    before = _files(out)
    err = _refused(capsys, [*RUN, "--steps", "2", "--out", str(out)])
    assert "holds another run's outputs (metrics.jsonl, summary.json, curves.png)" in err
    assert _files(out) == before
    # the same run killed before its first checkpoint: its config.json says so; it restarts
    same = finished_run(2, tmp_path / "same")
    for step in checkpoints.steps(same):
        checkpoints.path_for(same, step).unlink()
    with (same / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "acc')  # a record cut short by the kill
    assert main([*RUN, "--steps", "2", "--out", str(same)]) == 0
    assert [json.loads(x)["step"] for x in (same / "metrics.jsonl").read_text().splitlines()] == [2]


def test_resuming_from_another_folder_needs_an_empty_one(tmp_path, capsys, finished_run):
    source = finished_run(4, tmp_path / "source")
    target = finished_run(2, tmp_path / "target")
    before = _files(target)
    err = _refused(
        capsys, [*RUN, "--steps", "6", "--resume", str(checkpoints.path_for(source, 4)),
                 "--out", str(target)],
    )  # fmt: skip
    assert f"--out {target} already holds a run (checkpoint-00000002.pt" in err
    assert "a checkpoint of another folder, would mix the two; give an empty --out" in err
    assert _files(target) == before
    fresh = tmp_path / "fresh"  # an empty folder: the run goes on there, its history with it
    ckpt = checkpoints.path_for(source, 2)
    assert main([*RUN, "--steps", "4", "--resume", str(ckpt), "--out", str(fresh)]) == 0
    steps = [json.loads(x)["step"] for x in (fresh / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4]
    assert checkpoints.steps(source) == [2, 4] and checkpoints.steps(fresh) == [4]

    def measures(folder):  # all but the clock
        records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in records]

    assert measures(fresh) == measures(source)  # the same run, continued elsewhere


def test_a_failed_claim_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(RuntimeError), run_folder.claim(out):
        raise RuntimeError("a check failed")
    assert not out.exists()
    in_use = pytest.raises(run_folder.FolderInUse, match=r"PID \d+ on ")
    with run_folder.claim(out), in_use, run_folder.claim(out):
        pass
    assert out.is_dir()
    atomic_write(out / "x", lambda f: f.write(b"1"))
    assert run_folder.remove_leftovers(out) == []
