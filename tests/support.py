"""Helpers the test tiers share (fixtures live in conftest.py): the small runs the command-line
tests start, the one-line refusal check, a text corpus, a time-to-accuracy comparison's base
settings, whether this machine can build the namespace testbed, and a launcher's processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

#: the repository's root (examples/, docs/)
REPO = Path(__file__).resolve().parents[1]
#: the small run the folder and checkpoint tests start from (2 workers, evaluated every 2 steps)
SMALL_RUN = ["train", "--model", "mlp", "--dataset", "synthetic", "--quiet", "--workers", "2",
             "--eval-every", "2"]  # fmt: skip
#: the smallest training command (its worker count and steps left to the test)
MLP_RUN = ["train", "--model", "mlp", "--dataset", "synthetic", "--quiet"]
#: LeNet on MNIST, 2 workers, evaluated every 2 steps
LENET_RUN = ["train", "--model", "lenet", "--dataset", "mnist", "--workers", "2", "--quiet",
             "--total-batch-size", "32", "--eval-every", "2"]  # fmt: skip
#: LeNet on synthetic images, otherwise as LENET_RUN: for runs that check the trainer's
#: mechanics, not what it learns (no MNIST to load, no 10,000 images to evaluate: ~5 s a run)
LENET_SYNTHETIC_RUN = ["train", "--model", "lenet", "--dataset", "synthetic", "--workers", "2",
                       "--quiet", "--total-batch-size", "32", "--eval-every", "2"]  # fmt: skip


def refused(capsys, argv) -> str:
    """Run the CLI on ``argv``, which must be refused: exit status 2 and one line, returned."""
    from terngrad.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def write_corpus(folder: Path, files: int = 20, extra: dict[int, str] | None = None) -> list[str]:
    """``files`` text files ``f00.txt`` ... in ``folder`` (file ``i``'s text ``extra[i]`` where
    given); returns their texts in order."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for i in range(files):
        body = (extra or {}).get(i, f"File {i:02d} says: the quick brown fox jumps. " * 4)
        (folder / f"f{i:02d}.txt").write_text(body, encoding="utf-8")
        texts.append(body if body.endswith("\n") else body + "\n")
    return texts


def accuracy_base(out, **changes):
    """The base settings of a small time-to-accuracy comparison: an MLP on MNIST, 2 workers,
    20 steps evaluated every 10."""
    from terngrad.train.config import TrainConfig

    settings = dict(
        out=str(out), model="mlp", dataset="mnist", workers=2, batch_size=64, steps=20,
        eval_every=10, progress=False, keep_checkpoints=1, timeout=120,
    )  # fmt: skip
    return TrainConfig(**{**settings, **changes})


def why_no_testbed(prefix: str = "tgtest") -> str | None:
    """Why the namespace testbed cannot run here (root, iproute2, namespaces), or ``None``."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = subprocess.run(["ip", "netns", "add", f"{prefix}-probe"], capture_output=True)
    if probe.returncode:
        return f"cannot create network namespaces: {probe.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "delete", f"{prefix}-probe"], capture_output=True)
    return None


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended since it was listed
        return b""


def workers_of(launcher: int) -> list[int]:
    """The training processes of a launcher: the children of its fork server (not
    multiprocessing's resource tracker), in the order they were started."""
    servers = [p for p in children(launcher) if b"forkserver" in _cmdline(p)]
    assert len(servers) == 1, children(launcher)
    return sorted(children(servers[0]))


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (or is a zombie waiting to be reaped): every thread of
    it, not its main thread alone (a process ended by a signal or by another thread's
    ``os._exit`` shows its main thread a zombie while the others still tear down its memory,
    its files, the run folder's lock among them, still open)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):  # the process is reaped
        return True
    for task in tasks:
        try:
            state = Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            # this thread is released, not the process: its leader (a zombie until the
            # process is reaped) and the other threads say whether the process has ended
            continue
        if state not in ("Z", "X"):
            return False
    return True


def gone(pid: int, seconds: float = 10) -> bool:
    """Whether process ``pid`` has ended (:func:`_ended`) within ``seconds`` (0: now)."""
    deadline = time.monotonic() + seconds
    while not _ended(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def kill_group(pgid: int, seconds: float = 30) -> None:
    """SIGKILL every process of group ``pgid`` (a launcher started with
    ``start_new_session=True``, its fork server and its workers) and return once none is left
    running: a killed worker holds the folder's lock until every thread of it has exited, a
    moment after the signal (:func:`_ended`; zombies have let go of it)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and not _ended(int(stat.parent.name)):
                alive.append(stat.parent.name)
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes {alive} outlived SIGKILL"
        time.sleep(0.05)


def markdown_rows(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table at or after ``heading`` in
    ``text``, its header first, the separator left out."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]
