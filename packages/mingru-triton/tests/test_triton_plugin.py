"""The plugin surface: the fallback signal from core, the registry, the entry point and the version."""

from __future__ import annotations

import importlib.metadata

import mingru.dispatch
import mingru_triton


def test_scan_fallback_is_the_core_class() -> None:
    assert mingru_triton.ScanFallback is mingru.dispatch.ScanFallback
    assert issubclass(mingru_triton.ScanFallback, Exception)


def test_scan_impls_is_an_empty_dict() -> None:
    assert type(mingru_triton.SCAN_IMPLS) is dict
    assert mingru_triton.SCAN_IMPLS == {}


def test_public_names() -> None:
    assert set(mingru_triton.__all__) == {"SCAN_IMPLS", "ScanFallback", "__version__", "available"}
    for name in mingru_triton.__all__:
        assert hasattr(mingru_triton, name), name


def test_entry_point_resolves_to_the_module() -> None:
    matches = importlib.metadata.entry_points(group="mingru.backends", name="triton")
    assert len(matches) == 1, f"expected one 'triton' entry point in group 'mingru.backends', got {matches}"
    (entry_point,) = matches
    assert entry_point.value == "mingru_triton"
    assert entry_point.load() is mingru_triton


def test_version_matches_the_installed_metadata() -> None:
    assert mingru_triton.__version__ == importlib.metadata.version("mingru-triton")


def test_core_serves_the_plugin_objects() -> None:
    import mingru.triton_scans as triton_scans

    assert triton_scans.available is mingru_triton.available
    assert triton_scans.SCAN_IMPLS is mingru_triton.SCAN_IMPLS
    assert triton_scans.ScanFallback is mingru.dispatch.ScanFallback
