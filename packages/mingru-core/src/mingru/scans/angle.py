"""Angle scan (fused rotation transition): exact eager reference and the rotation-layout helpers.

Shapes: theta (B, T, n, R, k/2), scale and gamma (B, T, n), b (B, T, n, k), h0 (B, n, k), perm / sgn / p2p
(R, k). Math: h_t = c_t * L_{R-1}(... L_0(h_{t-1})) + b_t, c_t = scale_t^[has_scale] * gamma_t^[has_decay].
Layer r maps x to y with x~_i = sgn[r, i] x_i, j = perm[r, i], t = theta[..., r, p2p[r, i]] and
y_i = cos(t) x~_i - sin(t) x~_j for i < j, y_i = sin(t) x~_j + cos(t) x~_i for i > j: each layer is
orthogonal.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mingru._checks import (
    check_float_tensor,
    check_int_tensor,
    check_same_device_dtype,
    check_shape,
    compute_dtype,
)
from mingru.scans.affine import affine_scan_ref


def _check_layout_shapes(perm: object, sgn: object, p2p: object) -> tuple[Tensor, Tensor, Tensor]:
    perm = check_int_tensor("perm", perm, 2, "(R, k)")
    p2p = check_int_tensor("p2p", p2p, 2, "(R, k)")
    sgn = check_float_tensor("sgn", sgn, 2, "(R, k)")
    check_shape("sgn", sgn, tuple(perm.shape), "like perm (R, k)")
    check_shape("p2p", p2p, tuple(perm.shape), "like perm (R, k)")
    if perm.shape[1] % 2:
        raise ValueError(f"perm must pair up an even state size k, got k = {perm.shape[1]}")
    return perm, sgn, p2p


def validate_angle_layout(perm: Tensor, sgn: Tensor, p2p: Tensor) -> None:
    """Check a rotation layout: perm (R, k) int, sgn (R, k) float of +1/-1, p2p (R, k) int.

    Every layer r must pair positions by an involution without fixed points
    (perm[r, perm[r, i]] == i != perm[r, i]), both members of a pair must share one angle index
    (p2p[r, i] == p2p[r, perm[r, i]] in [0, k/2)), each angle index must be used by exactly one pair, and
    sgn must hold only +1 or -1. Reads the values (a host sync). Raises TypeError/ValueError naming the layer
    and position at fault.
    """
    perm, sgn, p2p = _check_layout_shapes(perm, sgn, p2p)
    layers, k = perm.shape
    perm_rows = perm.detach().cpu().long().tolist()
    p2p_rows = p2p.detach().cpu().long().tolist()
    sgn_rows = sgn.detach().cpu().double().tolist()
    for r in range(layers):
        partners, angles = perm_rows[r], p2p_rows[r]
        for i, j in enumerate(partners):
            if not 0 <= j < k:
                raise ValueError(f"perm[{r}, {i}] must be a position in [0, {k}), got {j}")
            if j == i:
                raise ValueError(f"perm[{r}] must have no fixed point, but perm[{r}, {i}] = {i}")
            if partners[j] != i:
                raise ValueError(
                    f"perm[{r}] must be an involution: perm[{r}, {i}] = {j} "
                    f"but perm[{r}, {j}] = {partners[j]}"
                )
            if not 0 <= angles[i] < k // 2:
                raise ValueError(f"p2p[{r}, {i}] must be an angle index in [0, {k // 2}), got {angles[i]}")
            if angles[j] != angles[i]:
                raise ValueError(
                    f"p2p[{r}] must give both members of a pair one angle: positions {i} and {j} are paired "
                    f"but p2p[{r}, {i}] = {angles[i]} and p2p[{r}, {j}] = {angles[j]}"
                )
        for m in range(k // 2):
            uses = angles.count(m)
            if uses != 2:
                raise ValueError(
                    f"p2p[{r}] must use each angle index by exactly one pair (twice), "
                    f"got index {m} {uses} times"
                )
        bad = [value for value in sgn_rows[r] if value not in (1.0, -1.0)]
        if bad:
            raise ValueError(f"sgn[{r}] must hold only +1 or -1, got {bad[0]}")


def default_angle_layout(k: int, layers: int, *, reflect: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """A rotation layout (perm int64, sgn float32, p2p int64), each (layers, k), for an even state size k.

    When k is a power of two, layer r pairs i with i XOR 2^(r mod log2 k) (a butterfly: log2 k layers mix
    every coordinate); otherwise even layers pair (2m, 2m+1) and odd layers (2m+1, 2m+2 mod k). Angle indices
    number the pairs by their smaller position. reflect=True sets sgn[r, 0] = -1: every layer reflects.
    Raises ValueError for odd or non-positive k or a negative layer count.
    """
    if not isinstance(k, int) or k < 2 or k % 2:
        raise ValueError(f"k must be an even int >= 2, got {k!r}")
    if not isinstance(layers, int) or layers < 0:
        raise ValueError(f"layers must be an int >= 0, got {layers!r}")
    perm = torch.empty(layers, k, dtype=torch.int64)
    p2p = torch.empty(layers, k, dtype=torch.int64)
    power_of_two = k & (k - 1) == 0
    for r in range(layers):
        if power_of_two:
            stride = 1 << (r % int(math.log2(k)))
            partners = [i ^ stride for i in range(k)]
        else:
            offset = r % 2
            partners = [0] * k
            for m in range(k // 2):
                i, j = (2 * m + offset) % k, (2 * m + 1 + offset) % k
                partners[i], partners[j] = j, i
        perm[r] = torch.tensor(partners)
        lows = sorted(i for i in range(k) if i < partners[i])
        for m, i in enumerate(lows):
            p2p[r, i] = p2p[r, partners[i]] = m
    sgn = torch.ones(layers, k)
    if reflect and layers:
        sgn[:, 0] = -1.0
    return perm, sgn, p2p


def apply_rotation_layers(x: Tensor, theta: Tensor, perm: Tensor, sgn: Tensor, p2p: Tensor) -> Tensor:
    """Apply L = L_{R-1} ... L_0 to x (..., k); theta (..., R, k/2) broadcasts against x's leading dims.

    perm and p2p are int (R, k) on x's device, sgn is a float (R, k) of +1/-1. Returns L(x) (..., k).
    """
    k = x.shape[-1]
    position = torch.arange(k, device=x.device)
    for r in range(perm.shape[0]):
        partner = perm[r].long()
        angle = theta[..., r, :].index_select(-1, p2p[r].long())
        signed = x * sgn[r].to(x.dtype)
        side = torch.where(position < partner, -1.0, 1.0).to(x.dtype)
        x = angle.cos() * signed + side * angle.sin() * signed.index_select(-1, partner)
    return x


def check_angle_inputs(
    theta: object, scale: object, gamma: object, b: object, h0: object, perm: object, sgn: object, p2p: object
) -> None:
    """Raise TypeError/ValueError unless the angle-scan inputs have the shapes in this module's docstring."""
    b = check_float_tensor("b", b, 4, "(B, T, n, k)")
    batch, steps, heads, k = b.shape
    perm, sgn, p2p = _check_layout_shapes(perm, sgn, p2p)
    layers = perm.shape[0]
    check_shape("perm", perm, (layers, k), "(R, k) with k from b")
    theta = check_float_tensor("theta", theta, 5, "(B, T, n, R, k/2)")
    check_shape("theta", theta, (batch, steps, heads, layers, k // 2), "(B, T, n, R, k/2)")
    scale = check_float_tensor("scale", scale, 3, "(B, T, n)")
    check_shape("scale", scale, (batch, steps, heads), "(B, T, n)")
    gamma = check_float_tensor("gamma", gamma, 3, "(B, T, n)")
    check_shape("gamma", gamma, (batch, steps, heads), "(B, T, n)")
    h0 = check_float_tensor("h0", h0, 3, "(B, n, k)")
    check_shape("h0", h0, (batch, heads, k), "(B, n, k)")
    check_same_device_dtype({"b": b, "theta": theta, "scale": scale, "gamma": gamma, "h0": h0})
    for name, value in (("perm", perm), ("sgn", sgn), ("p2p", p2p)):
        if value.device != b.device:
            raise ValueError(f"{name} must be on the same device as b ({b.device}), got {value.device}")


def angle_transition_ref(theta: Tensor, perm: Tensor, sgn: Tensor, p2p: Tensor) -> Tensor:
    """Dense orthogonal matrices of the rotation layers: theta (..., R, k/2) -> L (..., k, k), L x = L(x)."""
    k = perm.shape[1]
    eye = torch.eye(k, dtype=theta.dtype, device=theta.device)
    rows = apply_rotation_layers(eye, theta.unsqueeze(-3), perm, sgn, p2p)
    return rows.transpose(-1, -2)


def angle_scan_ref(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    *,
    has_scale: bool,
    has_decay: bool,
) -> Tensor:
    """Differentiable eager angle scan -> h (B, T, n, k) in b's dtype (half types accumulate in float32).

    h_t = c_t L_t h_{t-1} + b_t with c_t = scale_t^[has_scale] gamma_t^[has_decay]; a disabled factor's tensor
    is not read. Built as the matrix affine scan of c_t L_t, so it costs O(k^3) per step: a reference, not a
    fast path. Shapes are checked; the layout values are not (see validate_angle_layout).
    """
    check_angle_inputs(theta, scale, gamma, b, h0, perm, sgn, p2p)
    return _angle_scan(theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale=has_scale, has_decay=has_decay)


def _angle_scan(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    *,
    has_scale: bool,
    has_decay: bool,
) -> Tensor:
    """angle_scan_ref without the input checks (the caller has run them)."""
    work = compute_dtype(b.dtype)
    factor = torch.ones_like(b[..., 0], dtype=work)
    if has_scale:
        factor = factor * scale.to(work)
    if has_decay:
        factor = factor * gamma.to(work)
    transition = angle_transition_ref(theta.to(work), perm, sgn.to(work), p2p) * factor[..., None, None]
    Abar, Bbar = affine_scan_ref(transition, b.to(work).unsqueeze(-1))
    h = Bbar + torch.matmul(Abar, h0.to(work)[:, None, :, :, None])
    return h.squeeze(-1).to(b.dtype)
