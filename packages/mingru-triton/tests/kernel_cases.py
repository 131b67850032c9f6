"""Shared pieces of the kernel tests: device markers, random inputs and the tolerance rule.

Kernel tests run twice: on CPU tensors under the Triton interpreter (marked ``interpret``; nox sets
TRITON_INTERPRET=1 for that run) with small shapes, and on CUDA (marked ``cuda``) at real sizes.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from mingru.dispatch import interpret_requested

interpret = pytest.mark.interpret
"""Runs kernels on CPU tensors under the interpreter; the module-level skip below applies in other runs."""

needs_interpreter = pytest.mark.skipif(
    not interpret_requested(), reason="needs TRITON_INTERPRET=1 (nox sets it for the interpret run)"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
on_interpreter = [interpret, needs_interpreter]
"""``pytestmark``/decorator list for interpreter tests (CPU tensors)."""
on_cuda = [pytest.mark.cuda, needs_cuda]
"""``pytestmark``/decorator list for CUDA tests (real kernels)."""

HALF_TYPES = (torch.float16, torch.bfloat16)


def kernel_device() -> torch.device:
    """CUDA when present, else CPU (the interpreter run)."""
    return torch.device("cuda" if torch.cuda.is_available() and not interpret_requested() else "cpu")


def tolerance(dtype: torch.dtype, length: int = 1) -> tuple[float, float]:
    """(rtol, atol) for comparing a kernel output in ``dtype`` with a float64 reference over ``length`` steps.

    float64: 1e-10; float32: 1e-5 scaled by sqrt(length) past 1024 steps; half types: twice the rounding
    unit of the type (the kernel accumulates in float32 and rounds once).
    """
    if dtype == torch.float64:
        return 1e-10, 1e-10
    if dtype == torch.float32:
        scale = max(1.0, (length / 1024) ** 0.5)
        return 1e-5 * scale, 1e-5 * scale
    eps = torch.finfo(dtype).eps
    return 2 * eps, 2 * eps


def assert_close(
    actual: Tensor, expected: Tensor, dtype: torch.dtype, length: int = 1, what: str = ""
) -> None:
    """``actual`` against the float64 ``expected`` with :func:`tolerance`; names ``what`` on failure.

    The absolute tolerance is relative to the largest magnitude of ``expected`` (at least 1): a sum of many
    terms (a gradient over k + v products, say) is exact to the rounding of its largest terms, not of its own
    value where those cancel.
    """
    rtol, atol = tolerance(dtype, length)
    expected = expected.double()
    magnitude = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    actual = actual.double().to(expected.device)  # compared where the reference lives (fast on CUDA)
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=atol * magnitude, msg=lambda m: f"{what}: {m}"
    )


def gates(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    signed: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Coefficients with 0.5 <= |x| < 1 (a third negative when signed): long scans stay finite."""
    x = torch.rand(shape, generator=generator, dtype=torch.float64) * 0.5 + 0.5
    if signed:
        x = x * torch.where(torch.rand(shape, generator=generator) < 0.3, -1.0, 1.0).double()
    return x.to(device=device, dtype=dtype)


def marked(marks: list[pytest.MarkDecorator]):  # type: ignore[no-untyped-def]
    """Decorator applying every mark of ``marks`` (``on_interpreter`` or ``on_cuda``) to a test."""

    def apply(test):  # type: ignore[no-untyped-def]
        for mark in marks:
            test = mark(test)
        return test

    return apply
