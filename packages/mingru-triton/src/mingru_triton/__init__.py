"""Triton GPU kernels for the mingru scans, served to users as ``mingru.triton_scans``.

This release holds the availability probe, the fallback signal and the kernel registry. The
registry is empty, so the mingru dispatch runs the exact eager reference for every scan.
Importing this module does not import ``triton``; :func:`available` does, once per process.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

from mingru.dispatch import ScanFallback, interpret_requested
from mingru_triton._version import __version__

__all__ = ["SCAN_IMPLS", "ScanFallback", "__version__", "available"]

SCAN_IMPLS: dict[str, Callable[..., Any]] = {}
"""Kernel entry points by scan op name ("log", "linear", "affine", "diag"); empty in this release."""


@functools.cache
def _triton_import_error() -> str | None:
    """Try ``import triton`` once per process; return None on success, else why it failed."""
    try:
        importlib.import_module("triton")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


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
