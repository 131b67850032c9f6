"""MinGRU: the minimal GRU of Feng et al. 2024 (arXiv 2410.01201), in log-space or signed linear form."""

from __future__ import annotations

import torch
from torch import Tensor

from mingru.layers._common import ScalarGatedLayer, check_bool, log_gates


class MinGRU(ScalarGatedLayer):
    """Minimal GRU: ``z = sigmoid(Lz x)``, ``h_t = (1 - z_t) h_{t-1} + z_t g(Lh x_t)``, state ``(B, hidden)``.

    ``mode="log"`` (the paper): ``g(x) = x + 0.5`` for ``x >= 0`` else ``sigmoid(x)``, so states stay
    positive; the scan runs in log space. ``mode="linear"``: ``g`` is the identity and states are signed;
    with ``negative_gates=True`` the transition is ``a = 1 - 2z`` in ``(-1, 1)``, which can flip the sign
    of the state (parity tracking). ``hidden = round(dim * expansion)``; an output Linear maps it back to
    ``dim`` when ``hidden != dim``.

    Args:
        dim: model width (input and output features).
        expansion: hidden width factor, > 0.
        mode: ``"log"`` or ``"linear"``.
        negative_gates: use ``a = 1 - 2z`` (``mode="linear"`` only).
        bias: add biases to the projections.
        recompute: keep only the input and one state per chunk of time steps for the backward, and recompute
            each chunk's projections, gates and scan there (less memory, one more input projection).
        chunk_len: steps per chunk with ``recompute=True`` (default: ``recompute_chunk_len``).

    Raises:
        ValueError: an argument of the wrong type or out of range, ``negative_gates`` with ``mode="log"``, or
            ``chunk_len`` without ``recompute``.
    """

    def __init__(
        self,
        dim: int,
        *,
        expansion: float = 1.0,
        mode: str = "log",
        negative_gates: bool = False,
        bias: bool = True,
        recompute: bool = False,
        chunk_len: int | None = None,
    ) -> None:
        super().__init__(dim, expansion, mode, bias, branches=2, recompute=recompute, chunk_len=chunk_len)
        self.negative_gates = check_bool("MinGRU", "negative_gates", negative_gates)
        if negative_gates and self.mode != "linear":
            raise ValueError(f"MinGRU: negative_gates=True requires mode='linear'; got mode={self.mode!r}")

    @property
    def gated_kind(self) -> str:
        if self.negative_gates:
            return "gru-negative"
        return f"gru-{self.mode}"

    def _log_coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        k, h_tilde = pre.chunk(2, dim=-1)
        return log_gates(k, h_tilde)

    def _coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        k, h_tilde = pre.chunk(2, dim=-1)
        a = -torch.tanh(0.5 * k) if self.negative_gates else torch.sigmoid(-k)
        return a, torch.sigmoid(k) * h_tilde

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, hidden={self.hidden}, mode={self.mode!r}, negative_gates={self.negative_gates}"
        )
