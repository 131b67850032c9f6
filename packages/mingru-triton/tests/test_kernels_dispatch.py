"""The dispatch with the real kernels under the interpreter: the kernels run where they can; an envelope
violation is a ScanFallback, which MINGRU_SCAN=triton turns into RuntimeError and auto into one warning and
the reference."""

from __future__ import annotations

import warnings

import pytest
import torch
from kernel_cases import on_interpreter

import mingru
from mingru import dispatch
from mingru.min_gru import affine_recurrence, affine_scan, angle_scan, linear_scan, parallel_scan_log
from mingru.scans import affine_scan_ref, angle_scan_ref, default_angle_layout, linear_scan_ref
from mingru_triton import SCAN_IMPLS, ScanFallback, angle_scan_impl

pytestmark = on_interpreter


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "_WARNED", set())
    monkeypatch.delenv("MINGRU_SCAN", raising=False)


def _too_wide(k: int = 33) -> tuple[torch.Tensor, torch.Tensor]:
    """An affine problem with k one past the kernel's envelope."""
    torch.manual_seed(0)
    return torch.randn(1, 3, 1, k, k) / k, torch.randn(1, 3, 1, k, 2)


def test_every_scan_runs_its_kernel_and_matches_the_reference() -> None:
    a, b = torch.rand(2, 7, 3, dtype=torch.float64), torch.randn(2, 7, 3, dtype=torch.float64)
    assert mingru.explain_scan("linear", a, b).impl == "triton"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "mingru: ", RuntimeWarning)
        got = linear_scan(a, b)
    for x, y in zip(got, linear_scan_ref(a, b), strict=True):
        torch.testing.assert_close(x, y)
    log_values = torch.randn(2, 8, 3, dtype=torch.float64)
    log_values[:, 0] = float("-inf")
    torch.testing.assert_close(
        parallel_scan_log(-a, log_values), mingru.scans.parallel_scan_log_ref(-a, log_values)
    )


def test_envelope_violation_is_a_scan_fallback_naming_the_limit() -> None:
    with pytest.raises(ScanFallback, match="k must be in \\[1, 32\\] for the affine kernel, got k=33"):
        SCAN_IMPLS["affine"](*_too_wide())


def test_auto_warns_once_and_runs_the_reference_outside_the_envelope() -> None:
    A, Bm = _too_wide()
    with pytest.warns(RuntimeWarning, match="the 'affine' scan runs its eager reference: k must be in"):
        got = affine_scan(A, Bm)
    for x, y in zip(got, affine_scan_ref(A, Bm), strict=True):
        torch.testing.assert_close(x, y)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "mingru: ", RuntimeWarning)
        affine_scan(A, Bm)
        affine_recurrence(A, Bm, torch.zeros(1, 1, 33, 2))  # the same reason: no second warning


def test_triton_mode_raises_outside_the_envelope(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    A, Bm = _too_wide()
    with pytest.raises(
        RuntimeError, match="MINGRU_SCAN=triton: the Triton 'affine' scan declined the call: k must"
    ):
        affine_scan(A, Bm)
    with pytest.raises(RuntimeError, match="the Triton 'affine' recurrence declined the call: k must"):
        affine_recurrence(A, Bm, torch.zeros(1, 1, 33, 2))


def _angle_inputs(k: int, rotations: int = 1) -> tuple:
    torch.manual_seed(0)
    perm, sgn, p2p = default_angle_layout(k, rotations)
    theta = torch.randn(1, 2, 1, rotations, k // 2)
    gates = torch.rand(1, 2, 1)
    return theta, gates, gates, torch.randn(1, 2, 1, k), torch.randn(1, 1, k), perm, sgn, p2p


def test_angle_scan_impl_turns_every_refusal_into_scan_fallback() -> None:
    theta, scale, gamma, b, h0, perm, sgn, p2p = _angle_inputs(4)
    with pytest.raises(ScanFallback, match="h0 must have shape"):
        angle_scan_impl(theta, scale, gamma, b, h0[:, :, :2], perm, sgn, p2p, has_scale=1, has_decay=1)
    with pytest.raises(ScanFallback, match="k must be <= 128 for the angle kernel, got k=130"):
        angle_scan_impl(*_angle_inputs(130), has_scale=1, has_decay=1)


def test_angle_dispatch_outside_the_envelope(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _angle_inputs(130)
    with pytest.warns(RuntimeWarning, match="the 'angle' scan runs its eager reference: k must be <= 128"):
        got = angle_scan(*inputs, has_scale=True, has_decay=False)
    torch.testing.assert_close(got, angle_scan_ref(*inputs, has_scale=True, has_decay=False))
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    with pytest.raises(RuntimeError, match="the Triton 'angle' scan declined the call: k must be <= 128"):
        angle_scan(*inputs, has_scale=True, has_decay=False)
