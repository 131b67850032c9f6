"""MinGRUDiag: multi-head minGRU with a diagonal gated transition and a k x v matrix state (GLA form)."""

from __future__ import annotations

import torch
from torch import Tensor

from mingru.layers._common import MatrixStateLayer
from mingru.min_gru import diag_recurrence


class MinGRUDiag(MatrixStateLayer):
    """Multi-head minGRU with a diagonal, input-dependent decay on a matrix state.

    Per head: ``a_t = sigmoid(La x_t)`` in ``(0, 1)^k``, ``B_t = ((1 - a_t) * key_t) value_t^T`` and
    ``H_t = diag(a_t) H_{t-1} + B_t`` with ``H`` of shape ``(k, v)`` (the GLA / Mamba-2 form); the
    read-out is ``q_t^T H_t``. Each row of ``H`` is a convex mix of its past and the new write, so the
    state stays bounded. State ``(B, heads, k, v)``.

    Args:
        dim: model width (input and output features).
        heads: number of heads n.
        head_dim: k, the key size (one decay per key channel).
        value_dim: v, the value size (default ``head_dim``).
        recompute: keep only the input and one state per chunk of time steps for the backward, and recompute
            each chunk's projections, gates and scan there (less memory, one more input projection).
        chunk_len: steps per chunk with ``recompute=True`` (default: ``recompute_chunk_len``).

    Raises:
        ValueError: an argument that is not a positive int (``recompute``: not a bool; ``chunk_len``
            without ``recompute``).
    """

    @staticmethod
    def _transition_width(k: int) -> int:
        return k  # one decay per key channel

    def _transition(self, transition: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        a = torch.sigmoid(transition)
        b = (torch.sigmoid(-transition) * key)[..., :, None] * value[..., None, :]
        return a, b

    def _scan(self, a: Tensor, b: Tensor, h0: Tensor | None) -> Tensor:
        return diag_recurrence(a, b, h0)

    def _apply_transition(self, a: Tensor, h: Tensor) -> Tensor:
        return a[..., None] * h
