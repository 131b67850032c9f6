"""Triton GPU kernels for the mingru scans, served to users as ``mingru.triton_scans``.

- :func:`available`: whether the kernels can run here (``True``) or why not (a reason string).
- ``SCAN_IMPLS``: the four kernel entry points core's dispatch calls ("log", "linear", "affine", "diag");
  ``RECURRENCE_IMPLS``: the layers' fused-initial-state path; ``GATED_IMPLS``: MinGRU's and MinLSTM's
  gates fused into the scan, ``GATED_ADJOINTS`` their adjoints without autograd (the recomputed chunks);
  :func:`angle_scan_impl`: the angle kernel.
- The ``torch.library`` ops (namespace ``mingru``), forward and backward of every scan, differentiable and
  traceable by ``torch.compile``: ``linear_scan_fwd``/``_bwd``, ``parallel_scan_log_fwd``/``_bwd``,
  ``affine_scan_fwd``/``_bwd``, ``diag_scan_fwd``/``_bwd``, ``angle_scan_fwd``/``_bwd``, and the
  ``*_recurrence_fwd``/``_bwd`` variants with the initial state fused, and ``gated_recurrence_fwd``/``_bwd``
  (MinGRU's and MinLSTM's gates and scan in one kernel).

The kernels need ``triton``; where it does not import, this module still imports with empty registries and
``available()`` says why.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

from mingru.dispatch import ScanFallback, interpret_requested
from mingru_triton._version import __version__


@functools.cache
def _triton_import_error() -> str | None:
    """Try ``import triton`` once per process; return None on success, else why it failed."""
    try:
        importlib.import_module("triton")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


SCAN_IMPLS: dict[str, Callable[..., Any]] = {}
"""Kernel entry points by scan op name ("log", "linear", "affine", "diag"); empty where triton is absent."""
RECURRENCE_IMPLS: dict[str, Callable[..., Any]] = {}
"""Fused-initial-state kernels ``(coefficients, values, h0) -> states``; empty where triton is absent."""
GATED_IMPLS: dict[str, Callable[..., Any]] = {}
"""MinGRU/MinLSTM kernels with the gates fused, ``(pre, h0) -> states or None``; empty without triton."""
GATED_ADJOINTS: dict[str, Callable[..., Any]] = {}
"""Their adjoints, ``(pre, h0, h, grad_h, d_final) -> (d pre, d h0)``; empty without triton."""

if _triton_import_error() is None:
    # `name as name`: explicit re-exports (the names are listed in __all__ below)
    from mingru_triton.affine import affine_recurrence_bwd as affine_recurrence_bwd
    from mingru_triton.affine import affine_recurrence_fwd as affine_recurrence_fwd
    from mingru_triton.affine import affine_scan_bwd as affine_scan_bwd
    from mingru_triton.affine import affine_scan_fwd as affine_scan_fwd
    from mingru_triton.angle import angle_scan_bwd as angle_scan_bwd
    from mingru_triton.angle import angle_scan_fwd as angle_scan_fwd
    from mingru_triton.diag import diag_recurrence_bwd as diag_recurrence_bwd
    from mingru_triton.diag import diag_recurrence_fwd as diag_recurrence_fwd
    from mingru_triton.diag import diag_scan_bwd as diag_scan_bwd
    from mingru_triton.diag import diag_scan_fwd as diag_scan_fwd
    from mingru_triton.gated import gated_recurrence_bwd as gated_recurrence_bwd
    from mingru_triton.gated import gated_recurrence_fwd as gated_recurrence_fwd
    from mingru_triton.impls import GATED_ADJOINTS as _GATED_ADJOINTS
    from mingru_triton.impls import GATED_IMPLS as _GATED_IMPLS
    from mingru_triton.impls import RECURRENCE_IMPLS as _RECURRENCE_IMPLS
    from mingru_triton.impls import SCAN_IMPLS as _SCAN_IMPLS
    from mingru_triton.impls import angle_scan_impl as angle_scan_impl
    from mingru_triton.linear import linear_recurrence_bwd as linear_recurrence_bwd
    from mingru_triton.linear import linear_recurrence_fwd as linear_recurrence_fwd
    from mingru_triton.linear import linear_scan_bwd as linear_scan_bwd
    from mingru_triton.linear import linear_scan_fwd as linear_scan_fwd
    from mingru_triton.log import log_recurrence_bwd as log_recurrence_bwd
    from mingru_triton.log import log_recurrence_fwd as log_recurrence_fwd
    from mingru_triton.log import parallel_scan_log_bwd as parallel_scan_log_bwd
    from mingru_triton.log import parallel_scan_log_fwd as parallel_scan_log_fwd

    SCAN_IMPLS.update(_SCAN_IMPLS)
    RECURRENCE_IMPLS.update(_RECURRENCE_IMPLS)
    GATED_IMPLS.update(_GATED_IMPLS)
    GATED_ADJOINTS.update(_GATED_ADJOINTS)
    _KERNEL_NAMES: tuple[str, ...] = (
        "affine_recurrence_bwd",
        "affine_recurrence_fwd",
        "affine_scan_bwd",
        "affine_scan_fwd",
        "angle_scan_bwd",
        "angle_scan_fwd",
        "angle_scan_impl",
        "diag_recurrence_bwd",
        "diag_recurrence_fwd",
        "diag_scan_bwd",
        "diag_scan_fwd",
        "gated_recurrence_bwd",
        "gated_recurrence_fwd",
        "linear_recurrence_bwd",
        "linear_recurrence_fwd",
        "linear_scan_bwd",
        "linear_scan_fwd",
        "log_recurrence_bwd",
        "log_recurrence_fwd",
        "parallel_scan_log_bwd",
        "parallel_scan_log_fwd",
    )
else:
    _KERNEL_NAMES = ()

__all__ = [
    "GATED_ADJOINTS", "GATED_IMPLS", "RECURRENCE_IMPLS", "SCAN_IMPLS", "ScanFallback", "__version__",
    "available",
    *_KERNEL_NAMES,
]  # fmt: skip


def available() -> bool | str:
    """Whether the Triton scan kernels can run in this process.

    Kernels can run when ``triton`` imports and either a CUDA device is present or the Triton
    interpreter is requested with ``TRITON_INTERPRET=1`` (then CPU tensors are accepted). The
    import is attempted once per process; the environment and the device are read on every call.

    Returns:
        ``True`` when the kernels can run, otherwise a reason string, for example
        ``"triton not importable: ModuleNotFoundError: No module named 'triton'"`` or
        ``"CUDA not available"``. Treat anything other than ``True`` as unavailable.
    """
    import_error = _triton_import_error()
    if import_error is not None:
        return f"triton not importable: {import_error}"
    if interpret_requested() or torch.cuda.is_available():
        return True
    return "CUDA not available"
