"""Under TRITON_INTERPRET=1 the kernel path is open on a CPU-only machine: the plugin is available and a
Triton kernel runs on CPU tensors. Marked ``interpret``: nox runs these with the variable set."""

from __future__ import annotations

import pytest
import torch

import mingru
from mingru.dispatch import interpret_requested

pytestmark = [
    pytest.mark.interpret,
    pytest.mark.skipif(
        not interpret_requested(), reason="needs TRITON_INTERPRET=1 (nox sets it for this run)"
    ),
]


def test_available_under_the_interpreter() -> None:
    assert mingru.triton_scans.available() is True


def test_a_triton_kernel_runs_on_cpu_tensors() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def scale_by_two(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)

    x = torch.arange(11, dtype=torch.float32)
    y = torch.full_like(x, -1.0)
    scale_by_two[(triton.cdiv(x.numel(), 4),)](x, y, x.numel(), BLOCK=4)
    assert torch.equal(y, 2 * x)


def test_dispatch_reports_the_missing_kernels_under_the_interpreter() -> None:
    choice = mingru.explain_scan("linear", torch.rand(1, 3, 2), torch.rand(1, 3, 2))
    expected = "triton" if "linear" in mingru.triton_scans.SCAN_IMPLS else "eager"
    assert choice.impl == expected
    if expected == "eager":
        assert (choice.reason, choice.fallback) == (
            "no Triton kernel is registered for the 'linear' scan",
            True,
        )
