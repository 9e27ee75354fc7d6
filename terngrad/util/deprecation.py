"""Deprecation warnings that name the user's line, however deep in terngrad they are raised."""

from __future__ import annotations

import sys
import warnings


def warn_deprecated(message: str) -> None:
    """A ``FutureWarning`` of ``message``, attributed to the first frame outside terngrad."""
    warnings.warn(message, FutureWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the terngrad package (counted from the
    caller of :func:`warn_deprecated`)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("terngrad"):
        frame, level = frame.f_back, level + 1
    return level
