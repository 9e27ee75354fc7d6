"""Worker-side error feedback: what this worker's quantization dropped is sent later.

With ``C`` the rank's compression (encode then decode), each step sends ``C(g + e)`` and keeps
``e <- (g + e) - C(g + e)`` (Seide et al. 2014; Karimireddy et al. 2019, "EF-SGD"). Biased
quantizers such as scaled sign then converge like SGD. Residuals are stored per parameter
name, not per DDP bucket, so they survive DDP's rebuild of its buckets after the first
iteration and load into a model whose buckets differ.
"""

from __future__ import annotations

import math

import torch


class ErrorFeedback:
    """Residuals ``e`` of one worker, by parameter name."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}
        self._staged: dict[str, torch.Tensor] = {}

    def compensate(
        self, names: tuple[str, ...], sizes: tuple[int, ...], flat: torch.Tensor
    ) -> torch.Tensor:
        """``g + e`` for the flat gradient of the parameters ``names`` (a new tensor)."""
        parts = [
            self.residuals.get(name, flat.new_zeros(size))
            for name, size in zip(names, sizes, strict=True)
        ]
        return flat + torch.cat(parts)

    def update(
        self,
        names: tuple[str, ...],
        sizes: tuple[int, ...],
        compensated: torch.Tensor,
        sent: torch.Tensor,
    ) -> None:
        """Stage ``e = (g + e) - C(g + e)``, split by parameter, for :meth:`commit` at the
        step's end (a skipped step's residuals are dropped by :meth:`discard`)."""
        residual = compensated - sent
        self._staged.update(zip(names, residual.split(list(sizes)), strict=True))

    def commit(self) -> None:
        """The step went through: its staged residuals become the residuals."""
        self.residuals.update(self._staged)
        self._staged = {}

    def discard(self) -> None:
        """The step was skipped (a NaN somewhere): it leaves the residuals as they were."""
        self._staged = {}

    def norm(self) -> float:
        """``||e||_2`` over all parameters."""
        return math.sqrt(sum(float(r.double().square().sum()) for r in self.residuals.values()))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: r.clone() for name, r in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residuals = {name: r.clone() for name, r in state.items()}
