"""On a CUDA device: the references give the CPU answers, and auto dispatch says why no kernel ran."""

from __future__ import annotations

import warnings

import pytest
import torch

from mingru import dispatch, explain_scan, linear_scan, parallel_scan_log, triton_scans
from mingru.scans import affine_scan_ref, angle_scan_ref, default_angle_layout, diag_scan_ref

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_references_on_cuda_match_cpu():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(2, 37, 3, 4, 4, generator=g, dtype=torch.float64) / 2
    Bm = torch.randn(2, 37, 3, 4, 5, generator=g, dtype=torch.float64)
    a = torch.rand(2, 37, 3, 4, generator=g, dtype=torch.float64)
    for fn, args in ((affine_scan_ref, (A, Bm)), (diag_scan_ref, (a, Bm))):
        cpu = fn(*args)
        gpu = fn(*(x.cuda() for x in args))
        torch.testing.assert_close([x.cpu() for x in gpu], list(cpu))
    perm, sgn, p2p = default_angle_layout(4, 2)
    theta = torch.randn(2, 37, 3, 2, 2, generator=g, dtype=torch.float64)
    gates = torch.rand(2, 37, 3, generator=g, dtype=torch.float64)
    b = torch.randn(2, 37, 3, 4, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    args = (theta, gates, gates, b, h0, perm, sgn, p2p)
    cpu = angle_scan_ref(*args, has_scale=True, has_decay=True)
    gpu = angle_scan_ref(*(x.cuda() for x in args), has_scale=True, has_decay=True)
    torch.testing.assert_close(gpu.cpu(), cpu)


def test_auto_dispatch_on_cuda_runs_a_kernel_or_warns_once_why_not(monkeypatch):
    monkeypatch.delenv("MINGRU_SCAN", raising=False)
    monkeypatch.setattr(dispatch, "_WARNED", set())
    a = torch.rand(2, 64, 8, device="cuda")
    b = torch.randn(2, 64, 8, device="cuda")
    choice = explain_scan("linear", a, b)
    if choice.impl == "triton":
        pytest.skip("a Triton kernel is registered: the kernel tests cover this path")
    assert choice.fallback
    with pytest.warns(RuntimeWarning, match=choice.reason):
        linear_scan(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear_scan(a, b)
    status = triton_scans.available()
    assert status is True or isinstance(status, str)
    h = parallel_scan_log(torch.zeros(1, 3, 2, device="cuda"), torch.zeros(1, 4, 2, device="cuda"))
    torch.testing.assert_close(h.cpu(), torch.arange(2.0, 5.0)[None, :, None].expand(1, 3, 2))
