"""Choosing between the Triton kernels and the eager references, controlled by ``MINGRU_SCAN``.

``MINGRU_SCAN`` is read each time a scan is dispatched (under torch.compile: when the graph is traced):

- ``auto`` (default, also unset or empty): the kernel where the plugin is available, the tensors are on CUDA
  (or ``TRITON_INTERPRET=1``) and the op is registered; otherwise the reference. A fallback on CUDA tensors
  (or a ``ScanFallback`` from the kernel) warns once per (op, reason); CPU tensors use the reference silently.
- ``triton``: the kernel or a ``RuntimeError`` naming why not. Never a silent downgrade.
- ``eager``: always the reference.

The decision uses only static facts (env, device, plugin state), so a compiled graph makes it at trace time.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import torch
from torch import Tensor

from mingru._checks import compute_dtype
from mingru.scans.affine import _affine_scan, check_affine_inputs
from mingru.scans.angle import _angle_scan, check_angle_inputs
from mingru.scans.diag import _diag_scan, check_diag_inputs
from mingru.scans.linear import _linear_scan, check_linear_inputs
from mingru.scans.log import _parallel_scan_log, check_log_inputs

ENV_VAR = "MINGRU_SCAN"
MODES = ("auto", "triton", "eager")
SCAN_OPS = ("log", "linear", "affine", "diag")
"""The ops of ``SCAN_IMPLS``; the angle scan ("angle") is dispatched apart, through ``angle_scan_impl``."""

_REFERENCES: dict[str, tuple[Callable[..., None], Callable[..., Any]]] = {
    "log": (check_log_inputs, _parallel_scan_log),
    "linear": (check_linear_inputs, _linear_scan),
    "affine": (check_affine_inputs, _affine_scan),
    "diag": (check_diag_inputs, _diag_scan),
    "angle": (check_angle_inputs, _angle_scan),
}
_WARNED: set[tuple[str, str]] = set()


def _constant_under_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as torch.compiler.assume_constant_result does, without importing torch._dynamo at import.

    Dynamo then runs ``fn`` at trace time and bakes its (constant) result into the graph.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


class ScanFallback(Exception):
    """Raised by a kernel entry point that declines a call (inputs outside its envelope, or a failed launch).

    The dispatcher catches it: ``MINGRU_SCAN=auto`` warns once and runs the reference, ``MINGRU_SCAN=triton``
    raises ``RuntimeError``. The first argument is the reason, shown to the user.
    """


@dataclass(frozen=True)
class ScanChoice:
    """Which implementation a scan call would use, and why.

    ``impl`` is "triton" or "eager"; ``fallback`` is True when a kernel was wanted but cannot run (``auto``
    then warns, ``triton`` raises); ``reason`` says why in words.
    """

    op: str
    impl: Literal["triton", "eager"]
    reason: str
    fallback: bool = False


def scan_mode() -> str:
    """The current ``MINGRU_SCAN`` value (auto, triton or eager). Raises ValueError for any other value."""
    raw = os.environ.get(ENV_VAR, "")
    mode = raw.strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(MODES)} (unset means auto), got {raw!r}")
    return mode


def interpret_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` holds a value Triton reads as true ("1", "true" or "on")."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on")


@_constant_under_compile
def _backend_status() -> bool | str:
    """Load the plugin (outside any graph: traced as a constant) and return its ``available()``."""
    from mingru import triton_scans

    return triton_scans.load_backend().available()


def _backend() -> ModuleType:
    from mingru import triton_scans

    backend = triton_scans._BACKEND
    if backend is None:
        raise RuntimeError("the mingru.triton_scans backend is used before it was loaded")
    return backend


def _kernel_for(op: str) -> Callable[..., Any] | None:
    backend = _backend()
    if op == "angle":
        return getattr(backend, "angle_scan_impl", None)
    return backend.SCAN_IMPLS.get(op)


def _recurrence_kernel_for(op: str) -> Callable[..., Any] | None:
    """The plugin's fused-initial-state kernel for ``op`` (``RECURRENCE_IMPLS``; optional in a plugin)."""
    impls = getattr(_backend(), "RECURRENCE_IMPLS", None)
    return impls.get(op) if isinstance(impls, dict) else None


@_constant_under_compile
def _warn_once(op: str, reason: str, what: str = "") -> bool:
    """Warn once per (op, reason) that a scan runs its reference (or ``what`` happens instead); runs at trace
    time under torch.compile."""
    if (op, reason) in _WARNED:
        return False
    _WARNED.add((op, reason))
    what = what or f"the {op!r} scan runs its eager reference"
    warnings.warn(f"mingru: {what}: {reason}", RuntimeWarning, stacklevel=4)
    return True


def _choose(op: str, device_type: str, mode: str) -> ScanChoice:
    if mode == "eager":
        return ScanChoice(op, "eager", f"{ENV_VAR}=eager")
    interpreting = interpret_requested()
    if device_type != "cuda" and not interpreting:
        reason = (
            f"the tensors are on {device_type}; the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)"
        )
        return ScanChoice(op, "eager", reason, fallback=mode == "triton")
    status = _backend_status()
    if status is not True:
        return ScanChoice(op, "eager", str(status), fallback=True)
    if _kernel_for(op) is None:
        return ScanChoice(op, "eager", f"no Triton kernel is registered for the {op!r} scan", fallback=True)
    where = "the Triton interpreter (TRITON_INTERPRET=1)" if interpreting else "CUDA"
    reason = f"Triton kernel on {where}; it may still decline inputs outside its envelope"
    return ScanChoice(op, "triton", reason)


def _check_op(op: object) -> str:
    if op not in _REFERENCES:
        raise ValueError(f"op must be one of {', '.join(map(repr, _REFERENCES))}, got {op!r}")
    return op


def explain_scan(op: str, *inputs: Tensor) -> ScanChoice:
    """Report which implementation a call of scan ``op`` on ``inputs`` would run, and why; runs nothing.

    ``op`` is one of "log", "linear", "affine", "diag", "angle"; ``inputs`` are that scan's tensor arguments
    in order (for "angle": theta, scale, gamma, b, h0, perm, sgn, p2p). Raises ValueError for an unknown op or
    ``MINGRU_SCAN`` value and TypeError/ValueError for inputs the scan would reject.
    """
    op = _check_op(op)
    check, _ = _REFERENCES[op]
    check(*inputs)
    device = inputs[3].device if op == "angle" else inputs[0].device
    return _choose(op, device.type, scan_mode())


def _run(op: str, device: torch.device, args: tuple[Any, ...], flags: dict[str, bool]) -> Any:
    _, reference = _REFERENCES[op]
    mode = scan_mode()
    choice = _choose(op, device.type, mode)
    if choice.impl == "triton":
        kernel = _kernel_for(op)
        assert kernel is not None
        kernel_flags = {name: int(value) for name, value in flags.items()}
        try:
            return kernel(*args, **kernel_flags)
        except ScanFallback as exc:
            _declined(op, "scan", mode, exc)
    elif mode == "triton":
        raise RuntimeError(f"{ENV_VAR}=triton: the {op!r} scan cannot run its Triton kernel: {choice.reason}")
    elif choice.fallback:
        _warn_once(op, choice.reason)
    return reference(*args, **flags)


def _declined(op: str, what: str, mode: str, exc: ScanFallback) -> None:
    """A kernel declined a call: ``RuntimeError`` under ``MINGRU_SCAN=triton``, else warn once (the caller
    then runs the reference)."""
    reason = exc.args[0] if exc.args else "the kernel declined the call"
    if mode == "triton":
        message = f"{ENV_VAR}=triton: the Triton {op!r} {what} declined the call: {reason}"
        raise RuntimeError(message) from exc
    _warn_once(op, reason)


def _dispatch_scan(op: str, *args: Tensor) -> Any:
    """Run scan ``op`` ("log", "linear", "affine" or "diag") on ``args`` with the implementation chosen by
    ``MINGRU_SCAN``; returns what the reference returns. Inputs are validated before any choice is made."""
    if op not in SCAN_OPS:
        raise ValueError(f"op must be one of {', '.join(map(repr, SCAN_OPS))}, got {op!r}")
    check, _ = _REFERENCES[op]
    check(*args)
    return _run(op, args[0].device, args, {})


def _dispatch_recurrence(
    op: str, compose: Callable[..., Tensor], coeffs: Tensor, values: Tensor, h0: Tensor | None
) -> Tensor:
    """The states of recurrence ``op`` from an initial state: the layers' path.

    Where the scan ``op`` would run its kernel and the plugin has a fused kernel for the recurrence
    (``RECURRENCE_IMPLS[op](coeffs, values, h0)``, the initial state inside the kernel and only the states
    written), that kernel runs; otherwise ``compose(scan, coeffs, values, h0)`` builds the states from the
    dispatched scan ``scan``. ``MINGRU_SCAN`` rules as for the scans: a ``ScanFallback`` of the fused kernel
    warns once (``auto``) and composes from the eager reference, or raises ``RuntimeError`` (``triton``).
    The inputs must already be validated; ``h0`` None means zeros.
    """
    mode = scan_mode()
    choice = _choose(op, coeffs.device.type, mode)
    kernel = _recurrence_kernel_for(op) if choice.impl == "triton" else None
    if kernel is None:
        return compose(lambda *args: _run(op, coeffs.device, args, {}), coeffs, values, h0)
    state = h0 if h0 is not None else values.new_zeros(_state_shape(op, values))
    try:
        return kernel(coeffs, values, state)
    except ScanFallback as exc:
        _declined(op, "recurrence", mode, exc)
    return compose(_REFERENCES[op][1], coeffs, values, h0)


def _gated_entry(registry: str, kind: str) -> Callable[..., Any] | None:
    """The plugin's entry for recurrence ``kind`` in its dict ``registry`` (``GATED_IMPLS``: the fused-gates
    kernel, ``GATED_ADJOINTS``: its adjoint; both optional in a plugin)."""
    impls = getattr(_backend(), registry, None)
    return impls.get(kind) if isinstance(impls, dict) else None


def _gated_kernel_for(kind: str) -> Callable[..., Any] | None:
    """The plugin's fused-gates kernel for recurrence ``kind`` (``GATED_IMPLS``; optional in a plugin)."""
    return _gated_entry("GATED_IMPLS", kind)


def _gated_state(kind: str, pre: Tensor, h0: Tensor | None) -> Tensor:
    """The initial state the fused kernels take: ``h0``, or zeros (B, H) in the state dtype of ``pre``."""
    if h0 is not None:
        return h0
    g = 3 if kind.startswith("lstm") else 2
    return pre.new_zeros((pre.shape[0], pre.shape[2] // g), dtype=compute_dtype(pre.dtype))


def _dispatch_gated(
    op: str, kind: str, unfused: Callable[[Tensor, Tensor | None], Tensor], pre: Tensor, h0: Tensor | None
) -> Tensor:
    """The states of a MinGRU/MinLSTM recurrence from its pre-activations ``pre`` (B, T, G H): the layers'
    path.

    Where the scan ``op`` ("log" or "linear") would run its kernel and the plugin fuses recurrence ``kind``
    (``GATED_IMPLS[kind](pre, h0)``: the gates formed inside the scan kernel, only the states written), that
    kernel runs; otherwise, or where it returns None (shapes it leaves to the unfused path),
    ``unfused(pre, h0)``: the layer's gates, then the dispatched recurrence (kernel or reference by the usual
    rules). A ``ScanFallback`` of the fused kernel raises ``RuntimeError`` under ``MINGRU_SCAN=triton``;
    under ``auto`` it warns once and the unfused path runs. ``h0`` None means zeros.
    """
    mode = scan_mode()
    kernel = _gated_kernel_for(kind) if _choose(op, pre.device.type, mode).impl == "triton" else None
    if kernel is None:
        return unfused(pre, h0)
    state = _gated_state(kind, pre, h0)
    try:
        h = kernel(pre, state)
    except ScanFallback as exc:
        if mode == "triton":
            _declined(op, f"fused {kind} recurrence", mode, exc)
        what = f"the fused {kind} recurrence declined, its gates and scan run unfused"
        _warn_once(f"gated {kind}", exc.args[0] if exc.args else "the kernel declined the call", what)
        h = None
    return unfused(pre, h0) if h is None else h


def _gated_without_autograd(
    op: str, kind: str, pre: Tensor, h0: Tensor | None
) -> tuple[Tensor, Tensor, Callable[..., tuple[Tensor, Tensor]]] | None:
    """``(h, state, adjoint)`` where :func:`_dispatch_gated` would run the plugin's fused-gates kernel and the
    plugin also gives its adjoint (``GATED_ADJOINTS[kind](pre, state, h, grad_h, d_final) -> (d pre,
    d state)``): the states from that kernel without a graph, the initial state it took (zeros for None)
    and the adjoint, for a caller that differentiates by hand (the layers' recomputed chunks). None
    elsewhere, and where the kernel leaves the shape to the unfused path or declines (the caller then runs
    :func:`_dispatch_gated` under autograd, which warns or raises as the mode says)."""
    if _choose(op, pre.device.type, scan_mode()).impl != "triton":
        return None
    kernel, adjoint = _gated_kernel_for(kind), _gated_entry("GATED_ADJOINTS", kind)
    if kernel is None or adjoint is None:
        return None
    state = _gated_state(kind, pre, h0)
    try:
        with torch.no_grad():
            h = kernel(pre, state)
    except ScanFallback:
        return None
    return None if h is None else (h, state, adjoint)


def _state_shape(op: str, values: Tensor) -> tuple[int, ...]:
    """The initial-state shape of recurrence ``op`` for its ``values`` input: (B, D) or (B, n, k, v)."""
    if op in ("log", "linear"):
        return (values.shape[0], values.shape[2])
    return (values.shape[0], *values.shape[2:])


def _dispatch_angle_scan(
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
    """Run the angle scan with the implementation chosen by ``MINGRU_SCAN`` (kernel: ``angle_scan_impl``)."""
    args = (theta, scale, gamma, b, h0, perm, sgn, p2p)
    check_angle_inputs(*args)
    return _run("angle", b.device, args, {"has_scale": bool(has_scale), "has_decay": bool(has_decay)})
