"""MinGRUMatrix: multi-head minGRU with input-dependent k x k transitions and a k x v matrix state."""

from __future__ import annotations

import torch
from torch import Tensor

from mingru.layers._common import MatrixStateLayer
from mingru.min_gru import affine_recurrence


class MinGRUMatrix(MatrixStateLayer):
    """Multi-head minGRU whose transition is a full, input-dependent ``k x k`` matrix per head.

    Per head: ``M_t = reshape(Lm x_t)`` (k x k), ``z_t = sigmoid(Lz x_t)`` (a scalar),
    ``A_t = (1 - z_t) M_t / max(1, sqrt(||M_t||_1 ||M_t||_inf))``, ``B_t = z_t key_t value_t^T`` and
    ``H_t = A_t H_{t-1} + B_t`` with ``H`` of shape ``(k, v)``; the read-out is ``q_t^T H_t``.
    ``sqrt(||M||_1 ||M||_inf)`` bounds the spectral norm of ``M``, so ``||A_t||_2 <= 1 - z_t < 1`` and the
    recurrence is stable; signed permutation matrices have bound 1 and pass through unscaled, so the layer
    can represent permutations (state tracking beyond diagonal RNNs). The bias of ``Lm`` starts at the
    identity, so a fresh layer carries its state forward. State ``(B, heads, k, v)``.

    Args:
        dim: model width (input and output features).
        heads: number of heads n.
        head_dim: k, the key size and the transition size.
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
        return k * k + 1  # the matrix M and the gate's pre-activation

    def _init_transition(self) -> None:
        k = self.head_dim
        with torch.no_grad():
            self.proj_in.bias.view(self.heads, -1)[:, : k * k] = torch.eye(k).flatten()

    def _transition(self, transition: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        k = self.head_dim
        m = transition[..., : k * k].unflatten(-1, (k, k))
        pre_z = transition[..., k * k]
        # ||m||_1 (largest column sum) and ||m||_inf (largest row sum), written out: torch.linalg.matrix_norm
        # specializes the sequence length to a constant under torch.compile on torch 2.13
        magnitude = m.abs()
        bound = (magnitude.sum(-2).amax(-1) * magnitude.sum(-1).amax(-1)).clamp(min=1)
        a = (torch.sigmoid(-pre_z) / bound.sqrt())[..., None, None] * m
        b = torch.sigmoid(pre_z)[..., None, None] * key[..., :, None] * value[..., None, :]
        return a, b

    def _scan(self, a: Tensor, b: Tensor, h0: Tensor | None) -> Tensor:
        return affine_recurrence(a, b, h0)

    def _apply_transition(self, a: Tensor, h: Tensor) -> Tensor:
        return a @ h
