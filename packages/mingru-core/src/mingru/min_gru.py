"""The dispatched scans (kernel or reference, chosen by ``MINGRU_SCAN``) and the recurrences built on them.

Every function here is differentiable, takes float16/bfloat16/float32/float64 inputs (half types accumulate in
float32) and returns its outputs in the input dtype. Shapes: B batch, T time, D channels, n heads, k state
size, v value columns, R rotation layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mingru._checks import check_float_tensor, check_same_device_dtype, check_shape, compute_dtype
from mingru.dispatch import _dispatch_angle_scan, _dispatch_recurrence, _dispatch_scan
from mingru.scans.affine import check_affine_inputs
from mingru.scans.diag import check_diag_inputs
from mingru.scans.linear import check_linear_inputs
from mingru.scans.log import safe_log

ScanFn = Callable[..., Any]

__all__ = [
    "_dispatch_angle_scan",
    "_dispatch_scan",
    "affine_recurrence",
    "affine_scan",
    "angle_scan",
    "diag_recurrence",
    "diag_scan",
    "linear_recurrence",
    "linear_scan",
    "log_recurrence",
    "parallel_scan_log",
]


def parallel_scan_log(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """Log-space scan: log_coeffs (B, T, D), log_values (B, T+1, D) -> h (B, T, D).

    h_t = exp(log_coeffs_t) h_{t-1} + exp(log_values_t) with h_0 = exp(log_values_0). -inf entries are exact
    zeros and never give NaN. Raises TypeError/ValueError on bad inputs.
    """
    return _dispatch_scan("log", log_coeffs, log_values)


def linear_scan(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Signed k = 1 scan: a, b (B, T, D) -> (A, Bc) (B, T, D) with A_t = a_t ... a_1 and
    Bc_t = a_t Bc_{t-1} + b_t (Bc_0 = 0). Raises TypeError/ValueError on bad inputs."""
    return _dispatch_scan("linear", a, b)


def affine_scan(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Matrix affine scan: A (B, T, n, k, k), Bm (B, T, n, k, v) -> (Abar, Bbar) with Abar_t = A_t ... A_1 and
    Bbar_t = A_t Bbar_{t-1} + B_t (Bbar_0 = 0). Raises TypeError/ValueError on bad inputs."""
    return _dispatch_scan("affine", A, Bm)


def diag_scan(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Diagonal affine scan: a (B, T, n, k), Bm (B, T, n, k, v) -> (abar (B, T, n, k), Bbar (B, T, n, k, v))
    with Bbar_t = diag(a_t) Bbar_{t-1} + B_t (Bbar_0 = 0). Raises TypeError/ValueError on bad inputs."""
    return _dispatch_scan("diag", a, Bm)


def angle_scan(
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
    """Angle (rotation) scan -> h (B, T, n, k); see ``mingru.scans.angle`` for the math and shapes.

    h_t = c_t L_t(h_{t-1}) + b_t, c_t = scale_t^[has_scale] gamma_t^[has_decay]. Raises TypeError/ValueError
    on bad shapes; the layout values are checked by ``validate_angle_layout`` (layers: once, when built).
    """
    return _dispatch_angle_scan(
        theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale=has_scale, has_decay=has_decay
    )


def _check_state(name: str, state: object, expected: tuple[int, ...], layout: str, like: Tensor) -> Tensor:
    state = check_float_tensor(name, state, len(expected), layout)
    check_shape(name, state, expected, layout)
    if state.device != like.device:
        raise ValueError(
            f"{name} must be on the same device as the inputs ({like.device}), got {state.device}"
        )
    return state.to(like.dtype)


def log_recurrence(log_coeffs: Tensor, log_b: Tensor, h0: Tensor | None = None) -> Tensor:
    """h_t = exp(log_coeffs_t) h_{t-1} + exp(log_b_t) from h0 (B, D) (None: zeros) -> h (B, T, D).

    log_coeffs and log_b are (B, T, D). Exact for any sign of h0: its positive part enters the log-space scan
    as log(h0) and its negative part is carried linearly (prod a) * min(h0, 0), so no NaN arises.
    """
    log_coeffs = check_float_tensor("log_coeffs", log_coeffs, 3, "(B, T, D)")
    log_b = check_float_tensor("log_b", log_b, 3, "(B, T, D)")
    check_shape("log_b", log_b, tuple(log_coeffs.shape), "like log_coeffs (B, T, D)")
    check_same_device_dtype({"log_coeffs": log_coeffs, "log_b": log_b})
    if h0 is not None:
        h0 = _check_state("h0", h0, (log_coeffs.shape[0], log_coeffs.shape[2]), "(B, D)", log_coeffs)
    return _dispatch_recurrence("log", _compose_log, log_coeffs, log_b, h0)


def _compose_log(scan: ScanFn, log_coeffs: Tensor, log_b: Tensor, h0: Tensor | None) -> Tensor:
    if h0 is None:
        log_h0 = torch.full_like(log_coeffs[:, :1], float("-inf"))
        return scan(log_coeffs, torch.cat((log_h0, log_b), dim=1))
    log_h0 = safe_log(h0).unsqueeze(1)
    h = scan(log_coeffs, torch.cat((log_h0, log_b), dim=1))
    negative = h0.clamp(max=0).unsqueeze(1)
    decay = torch.cumsum(log_coeffs, dim=1, dtype=compute_dtype(log_coeffs.dtype)).exp()
    return h + decay.to(h.dtype) * negative


def linear_recurrence(a: Tensor, b: Tensor, h0: Tensor | None = None) -> Tensor:
    """h_t = a_t h_{t-1} + b_t from h0 (B, D) (None: zeros); a, b (B, T, D) -> h (B, T, D)."""
    check_linear_inputs(a, b)
    if h0 is not None:
        h0 = _check_state("h0", h0, (a.shape[0], a.shape[2]), "(B, D)", a)
    return _dispatch_recurrence("linear", _compose_linear, a, b, h0)


def _compose_linear(scan: ScanFn, a: Tensor, b: Tensor, h0: Tensor | None) -> Tensor:
    A, Bc = scan(a, b)
    return Bc if h0 is None else torch.addcmul(Bc, A, h0.unsqueeze(1))


def affine_recurrence(A: Tensor, Bm: Tensor, H0: Tensor | None = None) -> Tensor:
    """H_t = A_t H_{t-1} + B_t from H0 (B, n, k, v) (None: zeros); A (B, T, n, k, k), Bm (B, T, n, k, v)
    -> H (B, T, n, k, v)."""
    check_affine_inputs(A, Bm)
    if H0 is not None:
        batch, _, heads, k, v = Bm.shape
        H0 = _check_state("H0", H0, (batch, heads, k, v), "(B, n, k, v)", Bm)
    return _dispatch_recurrence("affine", _compose_affine, A, Bm, H0)


def _compose_affine(scan: ScanFn, A: Tensor, Bm: Tensor, H0: Tensor | None) -> Tensor:
    Abar, Bbar = scan(A, Bm)
    return Bbar if H0 is None else Bbar + torch.matmul(Abar, H0.unsqueeze(1))


def diag_recurrence(a: Tensor, Bm: Tensor, H0: Tensor | None = None) -> Tensor:
    """H_t = diag(a_t) H_{t-1} + B_t from H0 (B, n, k, v) (None: zeros); a (B, T, n, k), Bm (B, T, n, k, v)
    -> H (B, T, n, k, v)."""
    check_diag_inputs(a, Bm)
    if H0 is not None:
        batch, _, heads, k, v = Bm.shape
        H0 = _check_state("H0", H0, (batch, heads, k, v), "(B, n, k, v)", Bm)
    return _dispatch_recurrence("diag", _compose_diag, a, Bm, H0)


def _compose_diag(scan: ScanFn, a: Tensor, Bm: Tensor, H0: Tensor | None) -> Tensor:
    abar, Bbar = scan(a, Bm)
    return Bbar if H0 is None else torch.addcmul(Bbar, abar.unsqueeze(-1), H0.unsqueeze(1))
