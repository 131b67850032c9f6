"""The entry points mingru's dispatch calls: envelope checks, then the kernel op; ``ScanFallback`` on refusal.

- ``SCAN_IMPLS``: one differentiable wrapper per scan op that core dispatches ("log", "linear", "affine",
  "diag"), taking and returning what the eager reference does.
- ``RECURRENCE_IMPLS``: the layers' path, ``(coefficients, values, h0) -> states`` with the initial state
  fused into the kernel and only the states written.
- ``GATED_IMPLS``: MinGRU's and MinLSTM's path, ``(pre, h0) -> states`` with the gates fused into the scan
  as well, or None for shapes left to the unfused path (few chains, long T); ``GATED_ADJOINTS`` their
  adjoints for callers that run them without autograd (the layers' recomputed chunks).
- :func:`angle_scan_impl`: the angle-fused kernel behind ``mingru.min_gru._dispatch_angle_scan``.

Each wrapper raises ``ScanFallback`` with the reason when the inputs are outside the kernel's envelope
(device, dtype, sizes) or when the launch fails, so that the dispatch can warn and run the reference
(``MINGRU_SCAN=auto``) or raise (``MINGRU_SCAN=triton``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from mingru.dispatch import ScanFallback
from mingru.scans.angle import check_angle_inputs
from mingru_triton import affine, angle, diag, gated, linear, log
from mingru_triton._launch import FLOAT_DTYPES, common_case, num_sms, on_kernel_device

__all__ = ["GATED_ADJOINTS", "GATED_IMPLS", "RECURRENCE_IMPLS", "SCAN_IMPLS", "angle_scan_impl"]


def _common_envelope(op: str, tensors: dict[str, Tensor]) -> str | None:
    """Why a kernel cannot take ``tensors`` (device, dtype, emptiness), or None."""
    for name, x in tensors.items():
        if not on_kernel_device(x):
            return (
                f"the {op} kernel needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1); "
                f"{name} is on {x.device}"
            )
        if x.dtype not in FLOAT_DTYPES:
            return f"the {op} kernel takes float16, bfloat16, float32 or float64; {name} is {x.dtype}"
        if x.numel() == 0:
            return f"the {op} kernel needs non-empty inputs; {name} has shape {tuple(x.shape)}"
    return None


def _run(op: str, reason: str | None, call: Callable[[], Any]) -> Any:
    """Raise ``ScanFallback(reason)`` when ``reason`` is set, else ``call()``; a failing launch becomes a
    ``ScanFallback`` that names the exception."""
    if reason is not None:
        raise ScanFallback(reason)
    try:
        return call()
    except ScanFallback:
        raise
    except Exception as exc:
        detail = exc.args[0] if exc.args else ""
        raise ScanFallback(f"the Triton {op} kernel failed: {type(exc).__name__}: {detail}") from exc


def _first(*reasons: str | None) -> str | None:
    for reason in reasons:
        if reason is not None:
            return reason
    return None


# -- the four scan ops ------------------------------------------------------------------------------------


def _log_impl(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    reason = _first(
        _common_envelope("log", {"log_coeffs": log_coeffs, "log_values": log_values}),
        log.log_envelope(log_coeffs, log_values),
    )
    return _run("log", reason, lambda: log.parallel_scan_log_fwd(log_coeffs, log_values))


def _linear_impl(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    reason = _first(_common_envelope("linear", {"a": a, "b": b}), linear.linear_envelope(a, b))
    return _run("linear", reason, lambda: linear.scan(a, b))


def _affine_impl(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    reason = _first(_common_envelope("affine", {"A": A, "Bm": Bm}), affine.affine_envelope(A, Bm))
    return _run("affine", reason, lambda: affine.scan(A, Bm))


def _diag_impl(a: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    reason = _first(_common_envelope("diag", {"a": a, "Bm": Bm}), diag.diag_envelope(a, Bm))
    return _run("diag", reason, lambda: diag.scan(a, Bm))


SCAN_IMPLS: dict[str, Callable[..., Any]] = {
    "log": _log_impl,
    "linear": _linear_impl,
    "affine": _affine_impl,
    "diag": _diag_impl,
}
"""Kernel entry point per scan op, called by ``mingru.dispatch`` with the reference's arguments."""


# -- the layers' path: initial state fused, only the states written ---------------------------------------


def _plain_k1(first: Tensor, second: Tensor, h0: Tensor) -> bool:
    """Whether (first, second, h0) are non-empty CUDA float tensors (B, T >= 1, D), (B, T, D), (B, D) of one
    dtype and device: then the common envelope holds and the k = 1 kernel takes them (one cheap test on
    the layers' hot path instead of the checks that name what is wrong)."""
    return common_case(first, (second,), h0) and first.numel() > 0


def _log_recurrence_impl(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    if _plain_k1(log_coeffs, log_b, h0):
        reason = log.log_envelope(log_coeffs, log_b)
    else:
        reason = _first(
            _common_envelope("log", {"log_coeffs": log_coeffs, "log_b": log_b, "h0": h0}),
            log.log_envelope(log_coeffs, log_b),
        )
    return _run("log", reason, lambda: log.recurrence(log_coeffs, log_b, h0))


def _linear_recurrence_impl(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    if _plain_k1(a, b, h0):
        reason = None
    else:
        reason = _first(_common_envelope("linear", {"a": a, "b": b, "h0": h0}), linear.linear_envelope(a, b))
    return _run("linear", reason, lambda: linear.recurrence(a, b, h0))


def _affine_recurrence_impl(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    reason = _first(_common_envelope("affine", {"A": A, "Bm": Bm, "H0": H0}), affine.affine_envelope(A, Bm))
    return _run("affine", reason, lambda: affine.recurrence(A, Bm, H0))


def _diag_recurrence_impl(a: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    reason = _first(_common_envelope("diag", {"a": a, "Bm": Bm, "H0": H0}), diag.diag_envelope(a, Bm))
    return _run("diag", reason, lambda: diag.recurrence(a, Bm, H0))


RECURRENCE_IMPLS: dict[str, Callable[..., Tensor]] = {
    "log": _log_recurrence_impl,
    "linear": _linear_recurrence_impl,
    "affine": _affine_recurrence_impl,
    "diag": _diag_recurrence_impl,
}
"""Fused-initial-state kernels, ``(coefficients, values, h0) -> states``: what the layers run on CUDA."""


# -- MinGRU and MinLSTM: gates and scan in one walk --------------------------------------------------------


def _gated_impl(kind: int) -> Callable[[Tensor, Tensor], Tensor | None]:
    op = "log" if gated.KINDS[gated.KIND_NAMES[kind]][1] else "linear"

    def run(pre: Tensor, h0: Tensor) -> Tensor | None:
        if gated._common_case(pre, h0, kind, {}):  # one cheap test on the hot path
            reason = None
        else:
            reason = _first(_common_envelope(op, {"pre": pre, "h0": h0}), gated.gated_envelope(pre, h0, kind))
        if reason is None:
            rows, length, width = pre.shape
            if gated.leaves_to_unfused(rows, length, width // gated.branches(kind), num_sms(pre.device)):
                return None
        return _run(op, reason, lambda: gated.recurrence(kind, pre, h0))

    run.__name__ = run.__qualname__ = f"gated_{gated.KIND_NAMES[kind].replace('-', '_')}_impl"
    return run


GATED_IMPLS: dict[str, Callable[[Tensor, Tensor], Tensor | None]] = {
    name: _gated_impl(kind) for kind, name in enumerate(gated.KIND_NAMES)
}
"""The fused MinGRU/MinLSTM recurrences by kind ("gru-log", "gru-linear", "gru-negative", "lstm-log",
"lstm-linear"): ``(pre (B, T, G H), h0 (B, H) in the state dtype) -> h (B, T, H)``, or None for shapes left
to the unfused path (:func:`mingru_triton.gated.leaves_to_unfused`); ``ScanFallback``
outside the envelope or on a failed launch."""


def _gated_adjoint(kind: int) -> Callable[..., tuple[Tensor, Tensor]]:
    op = "log" if gated.KINDS[gated.KIND_NAMES[kind]][1] else "linear"

    def run(
        pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor, d_final: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        return _run(op, None, lambda: gated.adjoint(kind, pre, h0, h, grad_h, d_final))

    run.__name__ = run.__qualname__ = f"gated_{gated.KIND_NAMES[kind].replace('-', '_')}_adjoint"
    return run


GATED_ADJOINTS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    name: _gated_adjoint(kind) for kind, name in enumerate(gated.KIND_NAMES)
}
"""The adjoints of :data:`GATED_IMPLS` for callers that run them without autograd (the layers' recomputed
chunks): ``(pre, h0, h, grad_h, d_final) -> (d pre, d h0)``, ``grad_h`` in the state dtype or pre's,
``d_final`` (B, H) or None added at the last step (:func:`mingru_triton.gated.adjoint`); ``ScanFallback`` on
bad inputs or a failed launch."""


# -- the angle scan ---------------------------------------------------------------------------------------


def angle_scan_impl(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    *,
    has_scale: int,
    has_decay: int,
) -> Tensor:
    """The angle-fused kernel behind the dispatch: every shape invariant is checked before any launch, then
    the op's bodies run eagerly where they may (:func:`mingru_triton.angle.scan`), else the op.

    theta (B, T, n, R, k/2); scale, gamma (B, T, n); b (B, T, n, k); h0 (B, n, k); perm, sgn, p2p (R, k).
    Returns h (B, T, n, k), differentiable. Raises ``ScanFallback`` (and only that) when the inputs do not
    fit the kernel (shapes, devices, dtypes, k or R outside its envelope) or when the launch fails.
    The layout's values (involution, signs) are the caller's to validate (the layers do it once).
    """
    reason = None
    if not angle._common_case(theta, scale, gamma, b, h0, perm, sgn, p2p):  # one test on CUDA
        try:
            check_angle_inputs(theta, scale, gamma, b, h0, perm, sgn, p2p)
        except (TypeError, ValueError) as exc:
            raise ScanFallback(f"the angle kernel cannot take these inputs: {exc.args[0]}") from exc
        floats = {"theta": theta, "scale": scale, "gamma": gamma, "b": b, "h0": h0}
        # (check_angle_inputs has checked that perm, sgn and p2p are on b's device)
        reason = _first(_common_envelope("angle", floats), angle.angle_envelope(theta, b))
    flags = (int(bool(has_scale)), int(bool(has_decay)))
    args = (theta, scale, gamma, b, h0, perm, sgn, p2p, *flags)
    return _run("angle", reason, lambda: angle.scan(*args))
