"""MinGRUAngle: multi-head minGRU whose transition is a product of input-dependent rotations."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mingru.layers._common import RecurrentLayer, check_bool, check_positive_int, state_dtype
from mingru.min_gru import angle_scan
from mingru.scans.angle import apply_rotation_layers, default_angle_layout, validate_angle_layout


class MinGRUAngle(RecurrentLayer):
    """Multi-head minGRU with an orthogonal (rotation / reflection) transition per head.

    Per head, with state ``h`` in ``R^k``: ``h_t = c_t * L_t(h_{t-1}) + b_t`` where ``L_t`` is the
    product of ``R`` layers of ``k / 2`` plane rotations with angles ``theta_t = Ltheta x_t`` (pairings
    and signs from ``default_angle_layout(k, R, reflect=reflect)``), ``b_t = Lb x_t`` and
    ``c_t = scale_t * gamma_t`` with ``scale_t = tanh(Lu x_t)`` (signed, so a head can flip its state)
    and ``gamma_t = exp(-lambda * dt_t)``, ``lambda = softplus(decay_param)`` per head and
    ``dt_t = softplus(Ldt x_t)``. ``|c_t| <= 1`` keeps the recurrence stable. The output is
    ``Lout(concat_heads(h_t))``. State ``(B, heads, k)``.

    Args:
        dim: model width (input and output features).
        heads: number of heads n.
        head_dim: k, the state size per head; even.
        rotation_layers: R, rotation layers per step.
        use_scale: multiply by ``scale_t = tanh(Lu x_t)``.
        use_decay: multiply by ``gamma_t = exp(-lambda * dt_t)``.
        reflect: let the layout include reflections (sign flips) before the rotations.
        recompute: keep only the input and one state per chunk of time steps for the backward, and recompute
            each chunk's projections, gates and scan there (less memory, one more input projection).
        chunk_len: steps per chunk with ``recompute=True`` (default: ``recompute_chunk_len``).

    Raises:
        ValueError: a non-positive or odd ``head_dim``, a non-positive ``heads`` / ``rotation_layers``,
            a non-bool flag, an invalid rotation layout, or ``chunk_len`` without ``recompute``.
    """

    perm: Tensor
    sgn: Tensor
    p2p: Tensor

    def __init__(
        self,
        dim: int,
        *,
        heads: int = 4,
        head_dim: int = 8,
        rotation_layers: int = 2,
        use_scale: bool = True,
        use_decay: bool = True,
        reflect: bool = False,
        recompute: bool = False,
        chunk_len: int | None = None,
    ) -> None:
        super().__init__()
        owner = "MinGRUAngle"
        self._init_recompute(owner, recompute, chunk_len)
        self.dim = check_positive_int(owner, "dim", dim)
        self.heads = check_positive_int(owner, "heads", heads)
        self.head_dim = check_positive_int(owner, "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"{owner}: head_dim must be even (rotations act on pairs); got {head_dim}")
        self.rotation_layers = check_positive_int(owner, "rotation_layers", rotation_layers)
        self.use_scale = check_bool(owner, "use_scale", use_scale)
        self.use_decay = check_bool(owner, "use_decay", use_decay)
        self.reflect = check_bool(owner, "reflect", reflect)

        perm, sgn, p2p = default_angle_layout(head_dim, rotation_layers, reflect=reflect)
        validate_angle_layout(perm, sgn, p2p)
        self.register_buffer("perm", perm, persistent=False)
        self.register_buffer("sgn", sgn, persistent=False)
        self.register_buffer("p2p", p2p, persistent=False)

        self._split_sizes = (rotation_layers * head_dim // 2, int(use_scale), int(use_decay), head_dim)
        self.proj_in = nn.Linear(dim, heads * sum(self._split_sizes))
        self.proj_out = nn.Linear(heads * head_dim, dim)
        if use_scale:
            with torch.no_grad():
                self.proj_in.bias.view(heads, -1)[:, self._split_sizes[0]] = 2.0
        # lambda = softplus(decay_param), log-spaced over heads in [0.01, 1]
        self.decay_param = nn.Parameter(torch.logspace(-2, 0, heads).expm1().log()) if use_decay else None

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.heads, self.head_dim)

    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(theta (..., n, R, k/2), scale (..., n), gamma (..., n), b (..., n, k))`` in the state dtype."""
        pre = self.proj_in(x).to(state_dtype(x.dtype)).unflatten(-1, (self.heads, sum(self._split_sizes)))
        theta, pre_scale, pre_dt, b = pre.split(self._split_sizes, dim=-1)
        theta = theta.unflatten(-1, (self.rotation_layers, self.head_dim // 2))
        ones = torch.ones_like(b[..., 0])
        scale = torch.tanh(pre_scale.squeeze(-1)) if self.use_scale else ones
        if self.decay_param is not None:
            rate = F.softplus(self.decay_param.to(b.dtype))
            gamma = torch.exp(-rate * F.softplus(pre_dt.squeeze(-1)))
        else:
            gamma = ones
        return theta, scale, gamma, b

    def _forward(self, x: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
        theta, scale, gamma, b = self._gates(x)
        if h0 is None:
            h0 = self.init_state(x.shape[0], x.device, b.dtype)
        h = angle_scan(
            theta,
            scale,
            gamma,
            b,
            h0,
            self.perm,
            self.sgn.to(b.dtype),
            self.p2p,
            has_scale=self.use_scale,
            has_decay=self.use_decay,
        )
        return self.proj_out(h.flatten(-2).to(x.dtype)), h[:, -1].clone()

    def _step(self, x_t: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        theta, scale, gamma, b = self._gates(x_t)
        rotated = apply_rotation_layers(h, theta, self.perm, self.sgn.to(h.dtype), self.p2p)
        h = (scale * gamma)[..., None] * rotated + b
        return self.proj_out(h.flatten(-2).to(x_t.dtype)), h

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, heads={self.heads}, head_dim={self.head_dim}, "
            f"rotation_layers={self.rotation_layers}, use_scale={self.use_scale}, "
            f"use_decay={self.use_decay}, reflect={self.reflect}"
        )
