"""mingru: minGRU-family recurrent layers and the linear-recurrence scans under them.

``import mingru`` loads torch and this package only; ``mingru.triton_scans`` (the Triton kernels of the
``mingru-triton`` plugin) is imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mingru._version import __version__
from mingru.dispatch import ScanChoice, ScanFallback, explain_scan, scan_mode
from mingru.layers import MinGRU, MinGRUAngle, MinGRUDiag, MinGRULM, MinGRUMatrix, MinLSTM
from mingru.min_gru import (
    affine_recurrence,
    affine_scan,
    angle_scan,
    diag_recurrence,
    diag_scan,
    linear_recurrence,
    linear_scan,
    log_recurrence,
    parallel_scan_log,
)

if TYPE_CHECKING:
    from mingru import triton_scans

__all__ = [
    "MinGRU",
    "MinGRUAngle",
    "MinGRUDiag",
    "MinGRULM",
    "MinGRUMatrix",
    "MinLSTM",
    "ScanChoice",
    "ScanFallback",
    "__version__",
    "affine_recurrence",
    "affine_scan",
    "angle_scan",
    "diag_recurrence",
    "diag_scan",
    "explain_scan",
    "linear_recurrence",
    "linear_scan",
    "log_recurrence",
    "parallel_scan_log",
    "scan_mode",
    "triton_scans",
]


def __getattr__(name: str) -> Any:
    if name == "triton_scans":
        return importlib.import_module("mingru.triton_scans")
    raise AttributeError(f"module 'mingru' has no attribute {name!r}")
