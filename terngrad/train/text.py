"""A character-level text corpus for language models: Python's documentation, held in memory.

``load_pydoc(data_dir, context)`` returns a :class:`TextSet` built from the reStructuredText sources
of Python's documentation that Debian's ``python3-doc`` installs (497 files, 11 million characters
of English and code under ``/usr/share/doc/python3*/html/_sources/``), or from any folder of
UTF-8 ``*.txt`` files given as ``data_dir``:

* **Split by whole files.** The files are sorted by their path inside the folder; every
  ``HELD_OUT``-th of them (the 10th, 20th, ...) is held out for validation, the rest is the
  training text. No line of a held-out file is ever trained on.
* **Characters as tokens.** The vocabulary is the set of characters of the training text, sorted
  by code point, after id 0, which stands for any character the training text lacks (the
  held-out text may have a few). The metric is bits per character, ``loss / ln 2``.
* **Examples are windows.** Each split is one stream (the files joined in order, each ending in
  a newline). Training example ``i`` is the window of ``context + 1`` characters that starts at
  ``i * context`` plus a random offset in ``[0, context)`` drawn per example (a different cut of
  the text each epoch, like a random crop): the model reads the first ``context`` and predicts
  the last ``context``. Validation reads ``VALIDATION_WINDOWS`` fixed windows spread evenly over
  the held-out stream (the same ones at every evaluation; all of them if the stream is shorter).

A ``TextSet`` answers what the trainer asks of an image :class:`~terngrad.train.data.DataSet`
(``train_batch``, ``test_batch``, ``train_size``, ``test_size``, ``num_classes``,
``input_shape``), with int64 token ids ``(B, context)`` for inputs and targets.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from terngrad.train.missing import DataMissing
from terngrad.util.files import MEMORY_LIMIT, read_bounded

#: where Debian's python3-doc puts the documentation's reStructuredText sources
PYDOC_GLOB = "/usr/share/doc/python3*/html/_sources"
PYDOC_INSTALL = "apt-get install python3-doc"
#: one file in this many is held out for validation (the HELD_OUT-th, 2*HELD_OUT-th, ...)
HELD_OUT = 10
#: validation windows read at each evaluation (evenly spaced over the held-out text)
VALIDATION_WINDOWS = 512
UNKNOWN = 0  # the id of a character the training text does not have


@dataclass(frozen=True, eq=False)
class TextSet:
    """Two token streams (int16 ids of characters) and the vocabulary that maps them back."""

    name: str
    train_tokens: torch.Tensor = field(repr=False)
    test_tokens: torch.Tensor = field(repr=False)
    #: the characters of ids 1, 2, ... (id 0: unknown)
    vocabulary: str = field(repr=False)
    context: int
    train_files: int = 0
    test_files: int = 0

    def __post_init__(self) -> None:
        for split, tokens in (("training", self.train_tokens), ("held-out", self.test_tokens)):
            if len(tokens) < self.context + 1:
                raise ValueError(
                    f"{self.name}: the {split} text has {len(tokens)} characters, fewer than "
                    f"one window of {self.context + 1} (context {self.context} + 1); give more "
                    "text"
                )

    @property
    def num_classes(self) -> int:
        """The vocabulary's size, unknown included: the model's output width."""
        return len(self.vocabulary) + 1

    @property
    def input_shape(self) -> tuple[int]:
        return (self.context,)

    @property
    def train_size(self) -> int:
        """Training windows: one per ``context`` characters of the training stream."""
        return (len(self.train_tokens) - 1) // self.context

    @property
    def test_size(self) -> int:
        return min(VALIDATION_WINDOWS, (len(self.test_tokens) - 1) // self.context)

    def train_batch(
        self, index: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-character targets ``(B, context)`` for these training windows, each
        shifted by an offset in ``[0, context)`` drawn from ``generator`` (kept inside the text)."""
        offset = torch.randint(0, self.context, (len(index),), generator=generator)
        last = len(self.train_tokens) - self.context - 1
        return self._windows(self.train_tokens, (index * self.context + offset).clamp_max(last))

    def test_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of these validation windows (window ``j`` starts at
        ``floor(j * (n - context - 1) / (test_size - 1))`` of the ``n`` held-out characters)."""
        last = len(self.test_tokens) - self.context - 1
        spread = max(1, self.test_size - 1)
        return self._windows(self.test_tokens, index * last // spread)

    def _windows(self, tokens: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        window = tokens[starts[:, None] + torch.arange(self.context + 1)].long()
        return window[:, :-1], window[:, 1:]

    def decode(self, ids: torch.Tensor) -> str:
        """The text of a sequence of ids (unknown characters as U+FFFD)."""
        table = "\ufffd" + self.vocabulary
        return "".join(table[i] for i in ids.tolist())


def pydoc_folder() -> Path | None:
    """The installed documentation sources (the newest Python's, if several), or ``None``."""
    found = sorted({os.path.realpath(p) for p in glob.glob(PYDOC_GLOB) if os.path.isdir(p)})
    return Path(found[-1]) if found else None


def load_pydoc(data_dir: str | os.PathLike | None, context: int) -> TextSet:
    """The corpus of ``data_dir`` (every ``*.txt`` below it), by default Python's documentation
    sources; :class:`~terngrad.train.missing.DataMissing` if there is none."""
    if data_dir is None:
        folder = pydoc_folder()
        if folder is None:
            raise DataMissing(
                f"the pydoc corpus needs Python's documentation sources ({PYDOC_GLOB}): "
                f"{PYDOC_INSTALL}, or pass --data-dir with a folder of UTF-8 .txt files"
            )
    else:
        folder = Path(data_dir)
    files = sorted(folder.rglob("*.txt"), key=lambda p: p.relative_to(folder).as_posix())
    if len(files) < HELD_OUT:
        raise DataMissing(
            f"the pydoc corpus needs at least {HELD_OUT} .txt files in {folder} (one in "
            f"{HELD_OUT} is held out), found {len(files)}"
        )
    held_out = [f for i, f in enumerate(files) if i % HELD_OUT == HELD_OUT - 1]
    training = [f for i, f in enumerate(files) if i % HELD_OUT != HELD_OUT - 1]
    train_text, test_text = _read(training), _read(held_out)
    points = np.frombuffer(train_text.encode("utf-32-le"), dtype=np.uint32)
    vocabulary, train_ids = np.unique(points, return_inverse=True)
    test_points = np.frombuffer(test_text.encode("utf-32-le"), dtype=np.uint32)
    place = np.searchsorted(vocabulary, test_points).clip(max=len(vocabulary) - 1)
    test_ids = np.where(vocabulary[place] == test_points, place + 1, UNKNOWN)
    dtype = np.int16 if len(vocabulary) < 2**15 - 1 else np.int32
    return TextSet(
        name="pydoc",
        train_tokens=torch.from_numpy((train_ids + 1).astype(dtype)),
        test_tokens=torch.from_numpy(test_ids.astype(dtype)),
        vocabulary="".join(map(chr, vocabulary.tolist())),
        context=context,
        train_files=len(training),
        test_files=len(held_out),
    )


def _read(files: list[Path]) -> str:
    """The files' text joined in order, each ending in one newline (``ValueError`` naming a
    file that is not UTF-8)."""
    parts = []
    for path in files:
        try:
            text = read_bounded(path, MEMORY_LIMIT, "text file").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        parts.append(text if text.endswith("\n") else text + "\n")
    return "".join(parts)


def bits_per_character(loss: float) -> float:
    """Cross-entropy in nats per character as bits per character: ``loss / ln 2``."""
    return loss / math.log(2)
