"""Linear (k = 1, signed) scan: exact eager reference.

Shapes: a, b (B, T, D). Math: A_t = a_t a_{t-1} ... a_1 and Bc_t = a_t Bc_{t-1} + b_t with Bc_0 = 0, so the
state from an initial h_0 is h_t = A_t h_0 + Bc_t. Any sign of a and b is allowed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mingru._checks import cast, check_float_tensor, check_same_device_dtype, check_shape, compute_dtype
from mingru.scans._scan import mul, mul_add, pair_scan_op, scan_maps, shift_in, shift_out


def check_linear_inputs(a: object, b: object) -> None:
    """Raise TypeError/ValueError unless a and b are floating (B, T, D) tensors of one shape/dtype/device."""
    a = check_float_tensor("a", a, 3, "(B, T, D)")
    b = check_float_tensor("b", b, 3, "(B, T, D)")
    check_shape("b", b, tuple(a.shape), "like a (B, T, D)")
    check_same_device_dtype({"a": a, "b": b})


def linear_scan_fwd_ref(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Forward of the linear scan. a, b (B, T, D) -> (A, Bc) (B, T, D), in the input dtype.

    Half inputs are computed in float32. Inputs are not validated here (the
    public scan validates them).
    """
    work = compute_dtype(a.dtype)
    A, Bc = scan_maps(a.to(work), b.to(work), mul, mul_add)
    return cast(A, a.dtype), cast(Bc, a.dtype)


def linear_scan_bwd_ref(
    a: Tensor, A: Tensor, Bc: Tensor, gA: Tensor | None, gBc: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Adjoint of the linear scan: reads a, the outputs A, Bc and their grads -> (da, db), all (B, T, D).

    With lam_t = gBc_t + a_{t+1} lam_{t+1} and mu_t = gA_t + a_{t+1} mu_{t+1} (reverse scans):
    db_t = lam_t and da_t = lam_t Bc_{t-1} + mu_t A_{t-1} (Bc_0 = 0, A_0 = 1). A None grad counts as zero.
    """
    work = compute_dtype(a.dtype)
    a_next = shift_out(a.to(work))
    da = torch.zeros_like(a, dtype=work)
    db = torch.zeros_like(a, dtype=work)
    if gBc is not None:
        _, lam = scan_maps(a_next, gBc.to(work), mul, mul_add, reverse=True)
        db = lam
        da = da + lam * shift_in(Bc.to(work), torch.zeros_like(da[:, :1]))
    if gA is not None:
        _, mu = scan_maps(a_next, gA.to(work), mul, mul_add, reverse=True)
        da = da + mu * shift_in(A.to(work), torch.ones_like(da[:, :1]))
    return da.to(a.dtype), db.to(a.dtype)


_linear_scan_op = pair_scan_op("linear", linear_scan_fwd_ref, linear_scan_bwd_ref)


def _linear_scan(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """linear_scan_ref without the input checks (the caller has run them)."""
    return _linear_scan_op(a, b)


def linear_scan_ref(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Differentiable eager linear scan: a, b (B, T, D) -> (A, Bc) (B, T, D).

    A_t = prod_{s<=t} a_s, Bc_t = a_t Bc_{t-1} + b_t (Bc_0 = 0). Outputs in the input dtype (half types
    accumulate in float32). The backward stores only a, A and Bc. Raises TypeError/ValueError on bad inputs.
    """
    check_linear_inputs(a, b)
    return _linear_scan(a, b)
