"""Progress for rank 0: steps, loss, accuracy, megabytes sent, rate and time left.

On a terminal, a tqdm bar (redrawn in place, the events printed above it); elsewhere (logs,
CI) a plain line at each evaluation and at the end, so logs stay short.
"""

from __future__ import annotations

import math
import sys
import time

from tqdm import tqdm


class Progress:
    """``update(step, loss, accuracy, bytes_sent)`` after each step; ``note(text)`` for events."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream=None) -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.stream = stream or sys.stderr
        self.bar = (
            tqdm(total=total, initial=start, file=self.stream, unit="step", dynamic_ncols=True)
            if self.enabled and self.stream.isatty()
            else None
        )
        self.began = time.perf_counter()
        self.line = ""

    def _render(self, step: int, loss: float, accuracy: float, bytes_sent: int) -> str:
        width = 24
        filled = int(width * step / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        rate = (step - self.start) / max(time.perf_counter() - self.began, 1e-9)
        left = (self.total - step) / rate if rate > 0 else math.inf
        acc = f"{100 * accuracy:5.2f}%" if not math.isnan(accuracy) else "  -   "
        eta = f"{left:5.0f}s" if math.isfinite(left) else "   - "
        return (
            f"[{bar}] {step}/{self.total} loss {loss:.4f} acc {acc} "
            f"sent {bytes_sent / 1e6:8.2f} MB  {rate:5.1f} step/s  eta {eta}"
        )

    def update(self, step: int, loss: float, accuracy: float, bytes_sent: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.line = self._render(step, loss, accuracy, bytes_sent)
            return
        acc = f"{100 * accuracy:.2f}%" if not math.isnan(accuracy) else "-"
        self.bar.set_postfix_str(
            f"loss {loss:.4f} acc {acc} sent {bytes_sent / 1e6:.2f} MB", refresh=False
        )
        self.bar.update(step - self.bar.n)

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            return
        if self.line:
            self.stream.write(self.line + "\n")
        self.stream.flush()
