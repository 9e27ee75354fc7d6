"""What goes wrong between ranks, said plainly."""

from __future__ import annotations


class ExchangeMismatch(RuntimeError):
    """A rank received a message that does not fit its own configuration."""


class CollectiveFailed(RuntimeError):
    """A collective of the exchange timed out or lost a peer: another rank died or hangs."""


#: what gloo and NCCL say when a peer is gone or a collective ran past its timeout
_LOST_PEER = ("timed out", "Timed out", "Connection closed", "Connection reset", "Broken pipe")


def explain(exc: BaseException, rank: int, timeout: float | None) -> BaseException:
    """A collective that timed out or lost its peer as one :class:`CollectiveFailed` line (the
    cause kept as ``__cause__``); any other error unchanged."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not any(s in text for s in _LOST_PEER):
        return exc
    limit = f"{timeout:g} s" if timeout else "the process group's timeout"
    first = text.strip().splitlines()[0][:200]
    err = CollectiveFailed(
        f"terngrad: rank {rank}: the gradient exchange failed ({first}): another rank has died "
        f"or is stuck; every collective waits at most {limit}"
    )
    err.__cause__ = exc
    return err
