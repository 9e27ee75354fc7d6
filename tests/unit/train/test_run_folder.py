"""The folder's lock: it never follows a link nor writes into a file that
is not a lock, and it is held by every process handed its descriptor."""

import fcntl
import os

import pytest

from terngrad.train.run_folder import LOCK, FolderInUse, claim


def _refusal(folder) -> str:
    with pytest.raises(ValueError) as exc, claim(folder):
        pass
    message = str(exc.value)
    assert "\n" not in message and not isinstance(exc.value, FolderInUse)
    return message


@pytest.mark.parametrize(
    "make, kind",
    [("symlink", "a symbolic link"),
     ("hard link", "a file with 2 names (a hard link)"),
     ("fifo", "not a regular file"),
     ("stranger", "a file that is not terngrad's")],
)  # fmt: skip
def test_the_lock_never_writes_a_file_it_did_not_make(tmp_path, make, kind):
    folder, victim = tmp_path / "run", tmp_path / "precious"
    folder.mkdir()
    victim.write_text("keep me\n")
    lock = folder / LOCK
    if make == "symlink":
        lock.symlink_to(victim)
    elif make == "hard link":
        os.link(victim, lock)
    elif make == "fifo":
        os.mkfifo(lock)
    else:
        lock.write_text("keep me\n")
    message = _refusal(folder)
    assert f"its lock file {LOCK} is {kind}" in message
    assert f"remove {lock} (or choose another --out)" in message
    assert victim.read_text() == "keep me\n"
    if make == "stranger":
        assert lock.read_text() == "keep me\n"
    lock.unlink()  # the advice
    with claim(folder):
        assert lock.read_text().startswith(f"PID {os.getpid()} on ")


def test_an_earlier_runs_lock_file_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    with claim(folder):
        pass
    with claim(folder):  # the record of the run before is a lock record
        assert (folder / LOCK).read_text().startswith(f"PID {os.getpid()} ")


def test_a_duplicate_of_the_descriptor_holds_the_folder_after_the_claim_ends(tmp_path):
    """What the workers are handed: the folder stays held until the last copy is closed."""
    folder = tmp_path / "run"
    with claim(folder) as fd:
        kept = os.dup(fd)
    try:
        with pytest.raises(FolderInUse, match="is in use by another run"), claim(folder):
            pass
    finally:
        os.close(kept)
    with claim(folder) as fd:
        other = os.open(folder / LOCK, os.O_RDONLY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(other)
