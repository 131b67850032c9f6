"""The plugin surface: the fallback signal from core, the registry, the entry point and the version."""

from __future__ import annotations

import importlib.metadata

import mingru.dispatch
import mingru_triton


def test_scan_fallback_is_the_core_class() -> None:
    assert mingru_triton.ScanFallback is mingru.dispatch.ScanFallback
    assert issubclass(mingru_triton.ScanFallback, Exception)


SEED_OPS = {
    "linear_scan_fwd",
    "linear_scan_bwd",
    "parallel_scan_log_fwd",
    "affine_scan_fwd",
    "affine_scan_bwd",
    "angle_scan_fwd",
    "angle_scan_bwd",
}


def test_scan_impls_holds_one_entry_per_dispatched_scan_op() -> None:
    assert type(mingru_triton.SCAN_IMPLS) is dict
    assert (
        set(mingru_triton.SCAN_IMPLS) == set(mingru.dispatch.SCAN_OPS) == {"log", "linear", "affine", "diag"}
    )
    assert all(callable(impl) for impl in mingru_triton.SCAN_IMPLS.values())
    assert set(mingru_triton.RECURRENCE_IMPLS) == set(mingru.dispatch.SCAN_OPS)


def test_public_names() -> None:
    expected = {
        "SCAN_IMPLS",
        "RECURRENCE_IMPLS",
        "ScanFallback",
        "__version__",
        "available",
        "angle_scan_impl",
    }
    assert expected | SEED_OPS <= set(mingru_triton.__all__)
    for name in mingru_triton.__all__:
        assert hasattr(mingru_triton, name), name


def test_every_op_is_a_torch_library_op_in_the_mingru_namespace() -> None:
    import torch

    ops = [name for name in mingru_triton.__all__ if name.endswith(("_fwd", "_bwd"))]
    assert set(ops) >= SEED_OPS
    for name in ops:
        assert hasattr(torch.ops.mingru, name), f"torch.ops.mingru.{name} is not registered"


def test_seed_signatures() -> None:
    import inspect

    import torch

    def params(name: str) -> list[str]:
        schema = getattr(torch.ops.mingru, name).default._schema
        return [argument.name for argument in schema.arguments]

    assert params("linear_scan_fwd") == ["a", "b"]
    assert params("linear_scan_bwd") == ["a", "A", "Bc", "gA", "gBc"]
    assert params("parallel_scan_log_fwd") == ["log_coeffs", "log_values"]
    assert params("affine_scan_fwd") == ["A", "Bm"]
    assert params("affine_scan_bwd") == ["A", "Abar", "Bbar", "gAbar", "gBbar"]
    angle = ["theta", "scale", "gamma", "b", "h0", "perm", "sgn", "p2p", "has_scale", "has_decay"]
    assert params("angle_scan_fwd") == angle
    assert params("angle_scan_bwd") == [*angle[:5], "out", "grad_out", *angle[5:]]
    impl = inspect.signature(mingru_triton.angle_scan_impl).parameters
    assert list(impl) == angle
    assert all(impl[flag].kind is inspect.Parameter.KEYWORD_ONLY for flag in ("has_scale", "has_decay"))


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
