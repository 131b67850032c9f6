"""Plain Python loops over time: the slow, obviously-correct definitions the references are tested against."""

from __future__ import annotations

import torch
from torch import Tensor


def linear_loop(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    A, h = torch.ones_like(a[:, 0]), torch.zeros_like(b[:, 0])
    As, hs = [], []
    for t in range(a.shape[1]):
        A = a[:, t] * A
        h = a[:, t] * h + b[:, t]
        As.append(A)
        hs.append(h)
    return torch.stack(As, 1), torch.stack(hs, 1)


def log_loop(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    h = log_values[:, 0].exp()
    hs = []
    for t in range(log_coeffs.shape[1]):
        h = log_coeffs[:, t].exp() * h + log_values[:, t + 1].exp()
        hs.append(h)
    return torch.stack(hs, 1)


def affine_loop(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    k = A.shape[-1]
    Abar = torch.eye(k, dtype=A.dtype).expand_as(A[:, 0])
    H = torch.zeros_like(Bm[:, 0])
    Abars, Hs = [], []
    for t in range(A.shape[1]):
        Abar = A[:, t] @ Abar
        H = A[:, t] @ H + Bm[:, t]
        Abars.append(Abar)
        Hs.append(H)
    return torch.stack(Abars, 1), torch.stack(Hs, 1)


def diag_loop(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    abar, H = torch.ones_like(a[:, 0]), torch.zeros_like(Bm[:, 0])
    abars, Hs = [], []
    for t in range(a.shape[1]):
        abar = a[:, t] * abar
        H = a[:, t, ..., None] * H + Bm[:, t]
        abars.append(abar)
        Hs.append(H)
    return torch.stack(abars, 1), torch.stack(Hs, 1)


def rotate_loop(x: Tensor, theta: Tensor, perm: Tensor, sgn: Tensor, p2p: Tensor) -> Tensor:
    """Apply the rotation layers to x (..., k) one coordinate at a time, as SPEC section 3.5 words it."""
    k = x.shape[-1]
    for r in range(perm.shape[0]):
        signed = x * sgn[r].to(x.dtype)
        out = torch.empty_like(x)
        for i in range(k):
            j, m = int(perm[r, i]), int(p2p[r, i])
            angle = theta[..., r, m]
            if i < j:
                out[..., i] = angle.cos() * signed[..., i] - angle.sin() * signed[..., j]
            else:
                out[..., i] = angle.sin() * signed[..., j] + angle.cos() * signed[..., i]
        x = out
    return x


def angle_loop(theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale, has_decay) -> Tensor:
    h = h0
    hs = []
    for t in range(b.shape[1]):
        factor = torch.ones_like(scale[:, t])
        if has_scale:
            factor = factor * scale[:, t]
        if has_decay:
            factor = factor * gamma[:, t]
        h = factor[..., None] * rotate_loop(h, theta[:, t], perm, sgn, p2p) + b[:, t]
        hs.append(h)
    return torch.stack(hs, 1)
