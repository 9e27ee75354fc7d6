"""Reading what is given as a file: a FIFO, a device, a folder or a file
too large is refused with one line before anything is read, and never blocks the reader."""

import gzip
import os
import signal

import pytest

from terngrad.util.files import MEMORY_LIMIT, read_bounded, read_json


@pytest.fixture
def no_hang():
    """Fail instead of hanging: a FIFO opened for reading would wait for a writer for ever."""

    def hung(*_):
        raise AssertionError("the read blocked")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    assert read_bounded(path, 1000, "thing") == b"x" * 1000


@pytest.mark.parametrize(
    "kind, says",
    [("fifo", "is a FIFO (named pipe), not a regular file"),
     ("device", "is a character device, not a regular file"),
     ("folder", "is a folder, not a regular file"),
     ("missing", "no checkpoint at")],
)  # fmt: skip
def test_what_is_not_a_regular_file_is_refused_without_reading(tmp_path, no_hang, kind, says):
    path = {"fifo": tmp_path / "pipe", "device": "/dev/zero", "folder": tmp_path,
            "missing": tmp_path / "nothing"}[kind]  # fmt: skip
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(ValueError) as exc:
        read_bounded(path, 1 << 20, "checkpoint")
    assert says in str(exc.value) and "\n" not in str(exc.value)
    if kind != "missing":
        assert "give the path of a file" in str(exc.value)


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path):
    """A sparse file far larger than the machine's memory: refused by its size (the test
    would be killed for memory if it were read)."""
    huge = tmp_path / "huge"
    with huge.open("wb") as f:
        f.truncate(4 * MEMORY_LIMIT + 1)
    with pytest.raises(ValueError) as exc:
        read_bounded(huge, MEMORY_LIMIT, "checkpoint")
    assert f"holds {4 * MEMORY_LIMIT + 1:,} bytes, more than the {MEMORY_LIMIT:,}" in str(exc.value)
    small = tmp_path / "small"
    small.write_bytes(b"12345")
    with pytest.raises(ValueError, match="holds 5 bytes, more than the 4 a record is read"):
        read_bounded(small, 4, "record")


def test_json_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"a": ')
    with pytest.raises(ValueError, match=r"results file .* is not JSON \(Expecting value"):
        read_json(path, "results file")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        read_json(path, "results file")


def test_a_gzip_bomb_is_refused_before_it_fills_the_memory():
    from terngrad.train.image_files import _gunzip

    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 KiB that unpack to 8 MiB
    assert len(bomb) < 64 << 10
    with pytest.raises(ValueError, match="unpacks to more than 1,048,576 bytes"):
        _gunzip(bomb, "bomb.gz", limit=1 << 20)
    assert _gunzip(bomb + gzip.compress(b"tail"), "two.gz") == b"\0" * (8 << 20) + b"tail"
    with pytest.raises(ValueError, match="not a readable gzip file \\(truncated\\)"):
        _gunzip(bomb[:-20], "cut.gz")
