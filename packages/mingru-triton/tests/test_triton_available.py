"""available(): True only with an importable triton and CUDA or the interpreter; a reason otherwise."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

import mingru_triton


@pytest.fixture(autouse=True)
def fresh_import_attempt() -> Iterator[None]:
    """Forget the cached ``import triton`` outcome before and after each test."""
    mingru_triton._triton_import_error.cache_clear()
    yield
    mingru_triton._triton_import_error.cache_clear()


@pytest.fixture
def triton_importable() -> None:
    """Skip the test where triton itself cannot be imported."""
    pytest.importorskip("triton")


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def broken_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import triton`` raise ImportError, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "triton", None)


@pytest.mark.usefixtures("triton_importable", "no_cuda")
@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_interpreter_makes_kernels_available_without_cuda(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert mingru_triton.available() is True


@pytest.mark.usefixtures("triton_importable", "no_cuda")
@pytest.mark.parametrize("value", [None, "0", "false", ""])
def test_no_cuda_and_no_interpreter_gives_reason(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert mingru_triton.available() == "CUDA not available"


@pytest.mark.usefixtures("triton_importable")
def test_cuda_device_makes_kernels_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert mingru_triton.available() is True


@pytest.mark.usefixtures("triton_importable", "no_cuda")
def test_environment_is_read_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mingru_triton.available() is True
    monkeypatch.delenv("TRITON_INTERPRET")
    assert mingru_triton.available() == "CUDA not available"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mingru_triton.available() is True


@pytest.mark.usefixtures("broken_triton")
@pytest.mark.parametrize("interpret", [False, True])
@pytest.mark.parametrize("cuda", [False, True])
def test_unimportable_triton_gives_reason(
    monkeypatch: pytest.MonkeyPatch, interpret: bool, cuda: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = mingru_triton.available()
    assert isinstance(reason, str)
    assert reason.startswith("triton not importable: ")
    assert "ImportError" in reason or "ModuleNotFoundError" in reason


@pytest.mark.usefixtures("no_cuda")
def test_import_attempt_is_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)
    first = mingru_triton.available()
    monkeypatch.delitem(sys.modules, "triton")
    assert mingru_triton.available() == first
    assert mingru_triton._triton_import_error.cache_info().misses == 1


def test_the_plugin_imports_without_triton_and_says_why() -> None:
    code = (
        "import sys\n"
        "sys.modules['triton'] = None  # as on a machine where triton is absent\n"
        "import mingru_triton\n"
        "assert mingru_triton.SCAN_IMPLS == {} and mingru_triton.RECURRENCE_IMPLS == {}\n"
        "reason = mingru_triton.available()\n"
        "assert isinstance(reason, str) and reason.startswith('triton not importable'), reason\n"
        "assert not hasattr(mingru_triton, 'linear_scan_fwd')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
