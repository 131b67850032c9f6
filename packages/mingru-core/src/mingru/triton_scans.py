"""``mingru.triton_scans``: the Triton kernels of the ``mingru-triton`` plugin, loaded on first use.

Touching any name of this module finds the plugin through the ``mingru.backends`` entry point (named
``triton``), imports it once and serves its objects: ``available()``, ``ScanFallback``, ``SCAN_IMPLS``,
``angle_scan_impl`` and the kernel ops. Where the plugin is not installed (or fails to import), a stub answers
instead: ``available()`` returns the reason, ``SCAN_IMPLS`` is empty and ``ScanFallback`` is the core class.
"""

from __future__ import annotations

import importlib.metadata
import types
from typing import Any

from mingru.dispatch import ScanFallback

ENTRY_POINT_GROUP = "mingru.backends"
ENTRY_POINT_NAME = "triton"
NOT_INSTALLED = "mingru-triton is not installed; pip install 'mingru-core[triton]'"

_BACKEND: types.ModuleType | None = None


def _stub(reason: str) -> types.ModuleType:
    stub = types.ModuleType("mingru.triton_scans.stub", "Stand-in for an absent mingru-triton plugin.")

    def available() -> bool | str:
        """Always the reason why no Triton kernel can run."""
        return reason

    stub.available = available  # type: ignore[attr-defined]
    stub.ScanFallback = ScanFallback  # type: ignore[attr-defined]
    stub.SCAN_IMPLS = {}  # type: ignore[attr-defined]
    stub.__all__ = ["SCAN_IMPLS", "ScanFallback", "available"]  # type: ignore[attr-defined]
    return stub


def _find_backend() -> types.ModuleType:
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    found = [ep for ep in entry_points if ep.name == ENTRY_POINT_NAME]
    if not found:
        return _stub(NOT_INSTALLED)
    try:
        return found[0].load()
    except Exception as exc:
        return _stub(f"mingru-triton is installed but failed to import: {type(exc).__name__}: {exc}")


def load_backend() -> types.ModuleType:
    """The plugin module (or the stub), looked up once through the entry point and cached."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = _find_backend()
    return _BACKEND


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    backend = load_backend()
    try:
        return getattr(backend, name)
    except AttributeError:
        raise AttributeError(
            f"module {__name__!r} has no attribute {name!r} (served by {backend.__name__})"
        ) from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(getattr(load_backend(), "__all__", ())))
