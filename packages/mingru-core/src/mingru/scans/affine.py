"""Matrix affine scan (k x k transitions, k x v states): exact eager reference.

Shapes: A (B, T, n, k, k), Bm (B, T, n, k, v). Math: Abar_t = A_t A_{t-1} ... A_1 (newest on the left) and
Bbar_t = A_t Bbar_{t-1} + B_t with Bbar_0 = 0, so H_t = Abar_t H_0 + Bbar_t.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mingru._checks import cast, check_float_tensor, check_same_device_dtype, check_shape, compute_dtype
from mingru.scans._scan import matmul_add, pair_scan_op, scan_maps, shift_in, shift_out


def check_affine_inputs(A: object, Bm: object) -> None:
    """Raise TypeError/ValueError unless A is (B, T, n, k, k) and Bm (B, T, n, k, v), same dtype/device."""
    A = check_float_tensor("A", A, 5, "(B, T, n, k, k)")
    Bm = check_float_tensor("Bm", Bm, 5, "(B, T, n, k, v)")
    batch, steps, heads, rows, cols = A.shape
    if rows != cols:
        raise ValueError(f"A must hold square k x k matrices (B, T, n, k, k), got shape {tuple(A.shape)}")
    check_shape("Bm", Bm, (batch, steps, heads, rows, Bm.shape[-1]), "(B, T, n, k, v) matching A")
    check_same_device_dtype({"A": A, "Bm": Bm})


def affine_scan_fwd_ref(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Forward of the matrix affine scan: (A, Bm) -> (Abar (B, T, n, k, k), Bbar (B, T, n, k, v)).

    Outputs in the input dtype (half types accumulate in float32). Inputs are not validated here (the
    public scan validates them).
    """
    work = compute_dtype(A.dtype)
    Abar, Bbar = scan_maps(A.to(work), Bm.to(work), torch.matmul, matmul_add)
    return cast(Abar, A.dtype), cast(Bbar, A.dtype)


def affine_scan_bwd_ref(
    A: Tensor, Abar: Tensor, Bbar: Tensor, gAbar: Tensor | None, gBbar: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Adjoint of the matrix affine scan -> (dA like A, dB like Bbar).

    With the reverse scans L_t = gBbar_t + A_{t+1}^T L_{t+1} and M_t = gAbar_t + A_{t+1}^T M_{t+1}:
    dB_t = L_t and dA_t = L_t Bbar_{t-1}^T + M_t Abar_{t-1}^T (Bbar_0 = 0, Abar_0 = I). None grads count as 0.
    """
    work = compute_dtype(A.dtype)
    coef = shift_out(A.to(work).transpose(-1, -2))
    dA = torch.zeros_like(A, dtype=work)
    dB = torch.zeros_like(Bbar, dtype=work)
    if gBbar is not None:
        _, dB = scan_maps(coef, gBbar.to(work), torch.matmul, matmul_add, reverse=True)
        Bbar_prev = shift_in(Bbar.to(work), torch.zeros_like(dB[:, :1]))
        dA = dA + torch.matmul(dB, Bbar_prev.transpose(-1, -2))
    if gAbar is not None:
        _, adj = scan_maps(coef, gAbar.to(work), torch.matmul, matmul_add, reverse=True)
        eye = torch.eye(A.shape[-1], dtype=work, device=A.device).expand_as(dA[:, :1])
        dA = dA + torch.matmul(adj, shift_in(Abar.to(work), eye).transpose(-1, -2))
    return dA.to(A.dtype), dB.to(A.dtype)


_affine_scan_op = pair_scan_op("affine", affine_scan_fwd_ref, affine_scan_bwd_ref)


def _affine_scan(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """affine_scan_ref without the input checks (the caller has run them)."""
    return _affine_scan_op(A, Bm)


def affine_scan_ref(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Differentiable eager matrix affine scan: A (B, T, n, k, k), Bm (B, T, n, k, v) -> (Abar, Bbar).

    Abar_t = A_t ... A_1, Bbar_t = A_t Bbar_{t-1} + B_t. Outputs in the input dtype. The backward stores only
    A, Abar and Bbar. Raises TypeError/ValueError on bad inputs.
    """
    check_affine_inputs(A, Bm)
    return _affine_scan(A, Bm)
