"""The lazy ``mingru.triton_scans``: nothing heavy at ``import mingru``; the plugin or the stub after."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap

import pytest

import mingru
from mingru import triton_scans

PLUGIN_INSTALLED = any(
    ep.name == "triton" for ep in importlib.metadata.entry_points(group=triton_scans.ENTRY_POINT_GROUP)
)


def _fresh_python(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True, timeout=300
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_mingru_loads_nothing_heavy_and_the_shim_works_after():
    seen = _fresh_python(
        """
        import json, sys
        import torch
        before = set(sys.modules)
        import mingru
        added = sorted(set(sys.modules) - before)
        status = mingru.triton_scans.available()
        print(json.dumps({
            "added": added,
            "status": status if isinstance(status, str) else bool(status),
            "plugin_loaded": "mingru_triton" in sys.modules,
            "impls": sorted(mingru.triton_scans.SCAN_IMPLS),
            "same_fallback": mingru.triton_scans.ScanFallback is mingru.ScanFallback,
        }))
        """
    )
    assert all(name == "mingru" or name.startswith("mingru.") for name in seen["added"]), seen["added"]
    assert "mingru.triton_scans" not in seen["added"]
    assert seen["same_fallback"]
    if PLUGIN_INSTALLED:
        assert seen["plugin_loaded"]
    else:
        assert seen["status"] == triton_scans.NOT_INSTALLED
        assert seen["impls"] == []
        assert not seen["plugin_loaded"]


def test_import_statement_form_reaches_the_same_module():
    seen = _fresh_python(
        """
        import json, sys
        import mingru.triton_scans as ts
        import mingru
        print(json.dumps({"same": mingru.triton_scans is ts, "callable": callable(ts.available)}))
        """
    )
    assert seen == {"same": True, "callable": True}


@pytest.fixture
def no_backend(monkeypatch):
    monkeypatch.setattr(triton_scans, "_BACKEND", None)
    return monkeypatch


def test_stub_when_the_plugin_is_absent(no_backend):
    calls = []

    def no_entry_points(**kwargs):
        calls.append(kwargs)
        return []

    no_backend.setattr(triton_scans.importlib.metadata, "entry_points", no_entry_points)
    assert triton_scans.available() == "mingru-triton is not installed; pip install 'mingru-core[triton]'"
    assert triton_scans.SCAN_IMPLS == {}
    assert triton_scans.ScanFallback is mingru.ScanFallback
    assert calls == [{"group": "mingru.backends"}], "the entry-point lookup must run once and be cached"
    with pytest.raises(
        AttributeError, match=r"has no attribute 'linear_scan_fwd' \(served by mingru.triton_scans.stub\)"
    ):
        triton_scans.linear_scan_fwd  # noqa: B018


def test_stub_names_the_import_error_of_a_broken_plugin(no_backend):
    class BrokenEntryPoint:
        name = "triton"

        def load(self):
            raise ImportError("libcuda.so.1: cannot open shared object file")

    no_backend.setattr(triton_scans.importlib.metadata, "entry_points", lambda **kw: [BrokenEntryPoint()])
    assert triton_scans.available() == (
        "mingru-triton is installed but failed to import: "
        "ImportError: libcuda.so.1: cannot open shared object file"
    )


@pytest.mark.skipif(not PLUGIN_INSTALLED, reason="mingru-triton is not installed in this environment")
def test_plugin_objects_are_served_when_installed(no_backend):
    import mingru_triton

    assert triton_scans.available is mingru_triton.available
    assert triton_scans.SCAN_IMPLS is mingru_triton.SCAN_IMPLS
    assert mingru_triton.ScanFallback is mingru.ScanFallback
    assert "available" in dir(triton_scans)
