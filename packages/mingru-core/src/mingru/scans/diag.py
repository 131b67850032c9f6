"""Diagonal affine scan (matrix state, diagonal transition; the GLA / Mamba-2 / HGRN2 form): eager reference.

Shapes: a (B, T, n, k), Bm (B, T, n, k, v). Math: H_t = diag(a_t) H_{t-1} + B_t. Returns abar_t = a_t ... a_1
(B, T, n, k) and Bbar_t, the H_0 = 0 solution (B, T, n, k, v), so H_t = diag(abar_t) H_0 + Bbar_t.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mingru._checks import cast, check_float_tensor, check_same_device_dtype, check_shape, compute_dtype
from mingru.scans._scan import mul, mul_add, pair_scan_op, row_mul_add, scan_maps, shift_in, shift_out


def check_diag_inputs(a: object, Bm: object) -> None:
    """Raise TypeError/ValueError unless a is (B, T, n, k) and Bm (B, T, n, k, v), same dtype/device."""
    a = check_float_tensor("a", a, 4, "(B, T, n, k)")
    Bm = check_float_tensor("Bm", Bm, 5, "(B, T, n, k, v)")
    check_shape("Bm", Bm, (*a.shape, Bm.shape[-1]), "(B, T, n, k, v) matching a")
    check_same_device_dtype({"a": a, "Bm": Bm})


def diag_scan_fwd_ref(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Forward of the diagonal scan: (a, Bm) -> (abar (B, T, n, k), Bbar (B, T, n, k, v)).

    Outputs in the input dtype (half types accumulate in float32). Inputs are not validated here (the
    public scan validates them).
    """
    work = compute_dtype(a.dtype)
    abar, Bbar = scan_maps(a.to(work), Bm.to(work), mul, row_mul_add)
    return cast(abar, a.dtype), cast(Bbar, a.dtype)


def diag_scan_bwd_ref(
    a: Tensor, abar: Tensor, Bbar: Tensor, gabar: Tensor | None, gBbar: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Adjoint of the diagonal scan -> (da like a, dB like Bbar).

    With the reverse scans L_t = gBbar_t + diag(a_{t+1}) L_{t+1} and m_t = gabar_t + a_{t+1} m_{t+1}:
    dB_t = L_t and da_t = rowsum(L_t * Bbar_{t-1}) + m_t abar_{t-1} (Bbar_0 = 0, abar_0 = 1).
    """
    work = compute_dtype(a.dtype)
    coef = shift_out(a.to(work))
    da = torch.zeros_like(a, dtype=work)
    dB = torch.zeros_like(Bbar, dtype=work)
    if gBbar is not None:
        _, dB = scan_maps(coef, gBbar.to(work), mul, row_mul_add, reverse=True)
        da = da + (dB * shift_in(Bbar.to(work), torch.zeros_like(dB[:, :1]))).sum(-1)
    if gabar is not None:
        _, adj = scan_maps(coef, gabar.to(work), mul, mul_add, reverse=True)
        da = da + adj * shift_in(abar.to(work), torch.ones_like(da[:, :1]))
    return da.to(a.dtype), dB.to(a.dtype)


_diag_scan_op = pair_scan_op("diag", diag_scan_fwd_ref, diag_scan_bwd_ref)


def _diag_scan(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """diag_scan_ref without the input checks (the caller has run them)."""
    return _diag_scan_op(a, Bm)


def diag_scan_ref(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Differentiable eager diagonal scan: a (B, T, n, k), Bm (B, T, n, k, v) -> (abar, Bbar).

    H_t = diag(a_t) H_{t-1} + B_t from H_0 = 0; abar_t = a_t ... a_1. Outputs in the input dtype. The backward
    stores only a, abar and Bbar. Raises TypeError/ValueError on bad inputs.
    """
    check_diag_inputs(a, Bm)
    return _diag_scan(a, Bm)
