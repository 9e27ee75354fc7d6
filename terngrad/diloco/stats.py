"""What one rank's local steps did (:attr:`terngrad.diloco.DiLoCo.stats`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DiLoCoStats"]


@dataclass(frozen=True)
class DiLoCoStats:
    """What one rank's local steps did: inner and outer steps, outer steps skipped for a
    non-finite pseudo-gradient, and the bytes and messages of the outer exchanges (as the
    exchange counts them), per inner step too. With ``overlap``, an exchange counts once it
    has landed: the one in flight is left out, so that what a step reads does not depend on
    how far the background thread has got."""

    inner_steps: int
    outer_steps: int
    skipped_outer_steps: int
    bytes_sent: int
    bytes_received: int
    messages_sent: int
    #: ``H`` in force (``"auto"`` until chosen)
    local_steps: int | str = 1
    #: across nodes (a DDP model over a node's ranks): the bytes sent to the node's other
    #: ranks (the fast link); ``bytes_sent`` is what crossed the slow link. 0 without nodes
    node_bytes_sent: int = 0

    @property
    def bytes_sent_per_step(self) -> float:
        """Bytes sent per inner step: comparable to the DDP hook's per step."""
        return self.bytes_sent / self.inner_steps if self.inner_steps else 0.0

    @property
    def steps(self) -> int:
        """The inner steps (as the hook's ``Stats.steps``: the steps the bytes are spread on)."""
        return self.inner_steps

    @property
    def skipped_steps(self) -> int:
        """The steps whose update was dropped: the outer steps skipped (as the hook's
        ``Stats.skipped_steps``, for reports that read either)."""
        return self.skipped_outer_steps
