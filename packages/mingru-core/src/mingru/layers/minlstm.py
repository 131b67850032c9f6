"""MinLSTM: the minimal LSTM of Feng et al. 2024 (arXiv 2410.01201), in log-space or signed linear form."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from mingru.layers._common import ScalarGatedLayer, log_gates


class MinLSTM(ScalarGatedLayer):
    """Minimal LSTM with normalised gates, state ``(B, hidden)``.

    ``f = sigmoid(Lf x)``, ``i = sigmoid(Li x)``, ``f' = f / (f + i)``, ``i' = i / (f + i)``,
    ``h_t = f'_t h_{t-1} + i'_t g(Lh x_t)``. ``mode="log"`` uses the paper's positive ``g`` and a log-space
    scan: ``log f' = -softplus(d)``, ``log i' = -softplus(-d)`` with
    ``d = softplus(-pre_f) - softplus(-pre_i)``. ``mode="linear"`` uses ``g = identity`` and signed states.

    Args:
        dim: model width (input and output features).
        expansion: hidden width factor, > 0; an output Linear is added when ``round(dim * expansion) != dim``.
        mode: ``"log"`` or ``"linear"``.
        bias: add biases to the projections.
        recompute: keep only the input and one state per chunk of time steps for the backward, and recompute
            each chunk's projections, gates and scan there (less memory, one more input projection).
        chunk_len: steps per chunk with ``recompute=True`` (default: ``recompute_chunk_len``).

    Raises:
        ValueError: an argument of the wrong type or out of range, or ``chunk_len`` without ``recompute``.
    """

    def __init__(
        self,
        dim: int,
        *,
        expansion: float = 1.0,
        mode: str = "log",
        bias: bool = True,
        recompute: bool = False,
        chunk_len: int | None = None,
    ) -> None:
        super().__init__(dim, expansion, mode, bias, branches=3, recompute=recompute, chunk_len=chunk_len)

    @property
    def gated_kind(self) -> str:
        return f"lstm-{self.mode}"

    @staticmethod
    def _gate_difference(pre: Tensor) -> tuple[Tensor, Tensor]:
        pre_f, pre_i, h_tilde = pre.chunk(3, dim=-1)
        return F.softplus(-pre_f) - F.softplus(-pre_i), h_tilde

    def _log_coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        return log_gates(*self._gate_difference(pre))

    def _coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        diff, h_tilde = self._gate_difference(pre)
        return torch.sigmoid(-diff), torch.sigmoid(diff) * h_tilde

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, mode={self.mode!r}"
