"""Log-space scan (the minGRU paper's positive states): exact eager reference.

Shapes: log_coeffs (B, T, D), log_values (B, T+1, D) -> h (B, T, D). Slot 0 of log_values is log(h_0), slots
1..T are log(b_t); h_t = a_t h_{t-1} + b_t with a_t = exp(log_coeffs_t). -inf entries (b_t = 0, h_0 = 0,
a_t = 0) give no NaN, forward or backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mingru._checks import cast, check_float_tensor, check_same_device_dtype, check_shape, compute_dtype
from mingru.scans._scan import add, fresh, log_mul_add, mul, mul_add, scan_maps, shift_out


def check_log_inputs(log_coeffs: object, log_values: object) -> None:
    """Raise TypeError/ValueError unless log_coeffs is (B, T, D), log_values (B, T+1, D), one dtype/device."""
    log_coeffs = check_float_tensor("log_coeffs", log_coeffs, 3, "(B, T, D)")
    log_values = check_float_tensor("log_values", log_values, 3, "(B, T+1, D)")
    batch, steps, width = log_coeffs.shape
    check_shape("log_values", log_values, (batch, steps + 1, width), "(B, T+1, D)")
    check_same_device_dtype({"log_coeffs": log_coeffs, "log_values": log_values})


def parallel_scan_log_fwd_ref(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """Forward of the log-space scan: log h_t = logaddexp(log_coeffs_t + log h_{t-1}, log_values_t).

    log_coeffs (B, T, D), log_values (B, T+1, D) -> h (B, T, D) in the input dtype (half types accumulate in
    float32). Inputs are not validated here (the
    public scan validates them).
    """
    work = compute_dtype(log_coeffs.dtype)
    coef = torch.cat((torch.zeros_like(log_values[:, :1], dtype=work), log_coeffs.to(work)), dim=1)
    _, log_h = scan_maps(coef, log_values.to(work), add, log_mul_add)
    return cast(log_h[:, 1:].exp(), log_coeffs.dtype)


def parallel_scan_log_bwd_ref(
    log_coeffs: Tensor, log_values: Tensor, h: Tensor, grad_h: Tensor
) -> tuple[Tensor, Tensor]:
    """Adjoint of the log-space scan, computed in linear space so that -inf inputs give zeros, never NaN.

    With a_t = exp(log_coeffs_t) and lam_t = grad_h_t + a_{t+1} lam_{t+1} (lam_0 = a_1 lam_1):
    d log_coeffs_t = lam_t a_t h_{t-1} and d log_values_t = lam_t exp(log_values_t) for t = 0..T.
    Returns (d_log_coeffs (B, T, D), d_log_values (B, T+1, D)) in the input dtype.
    """
    work = compute_dtype(log_coeffs.dtype)
    coeffs = log_coeffs.to(work).exp()
    _, lam = scan_maps(shift_out(coeffs), grad_h.to(work), mul, mul_add, reverse=True)
    lam0 = coeffs[:, :1] * lam[:, :1]
    values = log_values.to(work).exp()
    h_prev = torch.cat((values[:, :1], h[:, :-1].to(work)), dim=1)
    d_log_coeffs = lam * coeffs * h_prev
    d_log_values = torch.cat((lam0, lam), dim=1) * values
    return d_log_coeffs.to(log_coeffs.dtype), d_log_values.to(log_values.dtype)


@torch.library.custom_op("mingru_ref::parallel_scan_log_fwd", mutates_args=())
def _log_scan_op(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """parallel_scan_log_fwd_ref as a custom op: one opaque node under torch.compile whatever T is."""
    return fresh(parallel_scan_log_fwd_ref(log_coeffs, log_values), log_coeffs, log_values)


@torch.library.custom_op("mingru_ref::parallel_scan_log_bwd", mutates_args=())
def _log_scan_bwd_op(
    log_coeffs: Tensor, log_values: Tensor, h: Tensor, grad_h: Tensor
) -> tuple[Tensor, Tensor]:
    """parallel_scan_log_bwd_ref as a custom op."""
    inputs = (log_coeffs, log_values, h, grad_h)
    d_log_coeffs, d_log_values = parallel_scan_log_bwd_ref(*inputs)
    return fresh(d_log_coeffs, *inputs), fresh(d_log_values, *inputs)


@_log_scan_op.register_fake
def _(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    return log_coeffs.new_empty(log_coeffs.shape)


@_log_scan_bwd_op.register_fake
def _(log_coeffs: Tensor, log_values: Tensor, h: Tensor, grad_h: Tensor) -> tuple[Tensor, Tensor]:
    return log_coeffs.new_empty(log_coeffs.shape), log_values.new_empty(log_values.shape)


def _log_setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs, output)


def _log_backward(ctx: Any, grad_h: Tensor) -> tuple[Tensor, Tensor]:
    log_coeffs, log_values, h = ctx.saved_tensors
    return _log_scan_bwd_op(log_coeffs, log_values, h, grad_h)


_log_scan_op.register_autograd(_log_backward, setup_context=_log_setup_context)


def _parallel_scan_log(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """parallel_scan_log_ref without the input checks (the caller has run them)."""
    return _log_scan_op(log_coeffs, log_values)


def parallel_scan_log_ref(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """Differentiable eager log-space scan: (B, T, D), (B, T+1, D) -> h (B, T, D).

    h_t = exp(log_coeffs_t) h_{t-1} + exp(log_values_t), h_0 = exp(log_values_0). NaN-free for -inf entries,
    forward and backward. Outputs in the input dtype. Raises TypeError/ValueError on bad inputs.
    """
    check_log_inputs(log_coeffs, log_values)
    return _parallel_scan_log(log_coeffs, log_values)


class _SafeLog(torch.autograd.Function):
    # forward and setup_context apart, so that torch.func transforms (vjp, grad, vmap) accept it
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return torch.where(x > 0, x, torch.zeros_like(x)).log()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        positive = x > 0
        return torch.where(positive, grad / torch.where(positive, x, torch.ones_like(x)), torch.zeros_like(x))


def safe_log(x: Tensor) -> Tensor:
    """log(x) where x > 0 and -inf elsewhere, with gradient 1/x where x > 0 and 0 elsewhere (never NaN)."""
    return _SafeLog.apply(x)
