"""Triton kernels for the diagonal affine scan H_t = diag(a_t) H_{t-1} + B_t (matrix state k x v).

Shapes: a (B, T, n, k), Bm (B, T, n, k, v). Each of the n k state rows is a k = 1 scan over its v columns
that share one coefficient, so these ops run the linear scan kernels of :mod:`mingru_triton.linear` with
n k coefficient channels and v value columns per coefficient (``a`` is never expanded). Strategies and
heuristics are those of :func:`mingru_triton.linear.scan_plan`; one program holds all v columns of its rows
(so da sums over them without atomics), hence the limit v <= 512.
"""

from collections.abc import Sequence

from torch import Tensor
from torch.library import triton_op

from mingru._checks import check_float_tensor, check_same_device_dtype, check_shape
from mingru_triton._launch import eager_path, grad_or_zeros
from mingru_triton.linear import MAX_V, check_kernel_device, scan_backward, scan_forward

__all__ = [
    "diag_envelope",
    "diag_recurrence_bwd",
    "diag_recurrence_fwd",
    "diag_scan_bwd",
    "diag_scan_fwd",
    "recurrence",
    "scan",
]


def diag_envelope(a: Tensor, Bm: Tensor) -> str | None:
    """None when the diagonal kernels take ``a`` (B, T, n, k) and ``Bm`` (B, T, n, k, v), else the reason.

    Limits: T >= 1 and v <= 512 (one program holds the v columns of a state row). Reads shapes only.
    """
    if a.dim() != 4 or Bm.dim() != 5 or tuple(Bm.shape[:4]) != tuple(a.shape):
        return (
            "the diag kernel takes a (B, T, n, k) and Bm (B, T, n, k, v), "
            f"got {tuple(a.shape)} and {tuple(Bm.shape)}"
        )
    if a.shape[1] < 1:
        return f"T must be >= 1 for the diag kernel, got T={a.shape[1]}"
    if Bm.shape[4] > MAX_V:
        return f"v must be <= {MAX_V} for the diag kernel, got v={Bm.shape[4]}"
    return None


def _check(names: Sequence[str], tensors: Sequence[Tensor]) -> None:
    """Check the a-like (B, T, n, k) tensor first, then (B, T, n, k, v) ones; dtype, device, envelope."""
    a = check_float_tensor(names[0], tensors[0], 4, "(B, T, n, k)")
    a_like = (names[0], "abar", "gabar")
    first_v: Tensor | None = None
    for name, x in zip(names[1:], tensors[1:], strict=True):
        if name in a_like:
            check_float_tensor(name, x, 4, "(B, T, n, k)")
            check_shape(name, x, tuple(a.shape), f"like {names[0]} (B, T, n, k)")
            continue
        check_float_tensor(name, x, 5, "(B, T, n, k, v)")
        if first_v is None:
            first_v = x
        check_shape(name, x, (*a.shape, first_v.shape[4]), "(B, T, n, k, v) matching a")
    check_same_device_dtype(dict(zip(names, tensors, strict=True)))
    check_kernel_device(names[0], a)
    assert first_v is not None
    reason = diag_envelope(a, first_v)
    if reason is not None:
        raise ValueError(reason)


def _check_state(name: str, x: Tensor, Bm: Tensor) -> None:
    batch, _, n, k, v = Bm.shape
    check_float_tensor(name, x, 4, "(B, n, k, v)")
    check_shape(name, x, (batch, n, k, v), "(B, n, k, v)")
    check_same_device_dtype({"Bm": Bm, name: x})


def _flat(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """a as (B, T, n k) and a (B, T, n, k, v) tensor as (B, T, n k v), contiguous."""
    batch, length = a.shape[:2]
    return a.contiguous().view(batch, length, -1), Bm.contiguous().view(batch, length, -1)


@triton_op("mingru::diag_scan_fwd", mutates_args=())
def diag_scan_fwd(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Diagonal scan: a (B, T, n, k), Bm (B, T, n, k, v) -> (abar (B, T, n, k), Bbar (B, T, n, k, v)).

    abar_t = a_t ... a_1 and Bbar_t = diag(a_t) Bbar_{t-1} + B_t (Bbar_0 = 0), in the input dtype with fp32
    accumulation (fp64 for fp64). Raises TypeError/ValueError on bad inputs or outside :func:`diag_envelope`.
    """
    return _scan_fwd(a, Bm)


def _scan_fwd(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    _check(("a", "Bm"), (a, Bm))
    coef, u = _flat(a, Bm)
    abar, Bbar = scan_forward(coef, u, None, Bm.shape[4], True)
    assert abar is not None
    return abar.view(a.shape), Bbar.view(Bm.shape)


@triton_op("mingru::diag_scan_bwd", mutates_args=())
def diag_scan_bwd(
    a: Tensor, abar: Tensor, Bbar: Tensor, gabar: Tensor, gBbar: Tensor
) -> tuple[Tensor, Tensor]:
    """Adjoint of :func:`diag_scan_fwd` -> (da like a, dB like Bbar).

    L_t = gBbar_t + diag(a_{t+1}) L_{t+1}, m_t = gabar_t + a_{t+1} m_{t+1}; dB = L and
    da_t = sum_v L_t Bbar_{t-1} + m_t abar_{t-1} (Bbar_0 = 0, abar_0 = 1).
    """
    return _scan_bwd(a, abar, Bbar, gabar, gBbar)


def _scan_bwd(a: Tensor, abar: Tensor, Bbar: Tensor, gabar: Tensor, gBbar: Tensor) -> tuple[Tensor, Tensor]:
    _check(("a", "abar", "Bbar", "gabar", "gBbar"), (a, abar, Bbar, gabar, gBbar))
    coef, prev_h = _flat(a, Bbar)
    prev_x, grad_h = _flat(abar, gBbar)
    grad_x = gabar.contiguous().view(coef.shape)
    da, dB, _ = scan_backward(coef, grad_h, grad_x, prev_h, None, prev_x, Bbar.shape[4], False)
    return da.view(a.shape), dB.view(Bbar.shape)


def _recurrence_fwd(a: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    _check(("a", "Bm"), (a, Bm))
    _check_state("H0", H0, Bm)
    coef, u = _flat(a, Bm)
    init = H0.contiguous().view(H0.shape[0], -1)
    _, H = scan_forward(coef, u, init, Bm.shape[4], False)
    return H.view(Bm.shape)


@triton_op("mingru::diag_recurrence_fwd", mutates_args=())
def diag_recurrence_fwd(a: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    """H_t = diag(a_t) H_{t-1} + B_t from H0: a (B, T, n, k), Bm (B, T, n, k, v), H0 (B, n, k, v) -> H.

    H (B, T, n, k, v) in the input dtype; only H is written (the layer path). Raises as
    :func:`diag_scan_fwd`.
    """
    return _recurrence_fwd(a, Bm, H0)


def _recurrence_bwd(a: Tensor, H0: Tensor, H: Tensor, grad_H: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    _check(("a", "H", "grad_H"), (a, H, grad_H))
    _check_state("H0", H0, H)
    coef, prev_h = _flat(a, H)
    _, grad_h = _flat(a, grad_H)
    init = H0.contiguous().view(H0.shape[0], -1)
    da, dB, dH0 = scan_backward(coef, grad_h, None, prev_h, init, None, H.shape[4], True)
    assert dH0 is not None
    return da.view(a.shape), dB.view(H.shape), dH0.view(H0.shape)


@triton_op("mingru::diag_recurrence_bwd", mutates_args=())
def diag_recurrence_bwd(a: Tensor, H0: Tensor, H: Tensor, grad_H: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Adjoint of :func:`diag_recurrence_fwd` -> (da like a, dB like H, dH0 like H0).

    G_t = grad_H_t + diag(a_{t+1}) G_{t+1}; dB = G, da_t = sum_v G_t H_{t-1} (H_0 = H0), dH0 = diag(a_1) G_1.
    """
    return _recurrence_bwd(a, H0, H, grad_H)


def _setup_scan(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], *output)


def _backward_scan(ctx, gabar, gBbar):
    a, abar, Bbar = ctx.saved_tensors
    return diag_scan_bwd(a, abar, Bbar, grad_or_zeros(gabar, abar), grad_or_zeros(gBbar, Bbar))


def _setup_recurrence(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[2], output)


def _backward_recurrence(ctx, grad_H):
    a, H0, H = ctx.saved_tensors
    return diag_recurrence_bwd(a, H0, H, grad_or_zeros(grad_H, H))


diag_scan_fwd.register_autograd(_backward_scan, setup_context=_setup_scan)
diag_recurrence_fwd.register_autograd(_backward_recurrence, setup_context=_setup_recurrence)


scan = eager_path(
    "DiagScan", diag_scan_fwd, _scan_fwd, _scan_bwd, lambda x, out: (x[0], *out), zero_unused=True
)
"""``scan(a, Bm)``: :func:`diag_scan_fwd` for the dispatch (``SCAN_IMPLS``), eagerly without the op's dispatch
(:func:`~mingru_triton._launch.eager_path`)."""

recurrence = eager_path(
    "DiagRecurrence", diag_recurrence_fwd, _recurrence_fwd, _recurrence_bwd, lambda x, h: (x[0], x[2], h)
)
"""``recurrence(a, Bm, H0)``: :func:`diag_recurrence_fwd` for the layers, eagerly without the op's dispatch
(:func:`~mingru_triton._launch.eager_path`)."""
