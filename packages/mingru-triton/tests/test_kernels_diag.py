"""The diagonal affine scan kernels (diag_scan_fwd/_bwd, diag_recurrence_fwd/_bwd) against the float64 eager
references, under the Triton interpreter (small shapes) and on CUDA (real sizes), with both strategies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from kernel_cases import HALF_TYPES, assert_close, gates, kernel_device, marked, on_cuda, on_interpreter
from torch import Tensor

from mingru.scans.diag import diag_scan_bwd_ref, diag_scan_ref

diag = pytest.importorskip("mingru_triton.diag")
linear = pytest.importorskip("mingru_triton.linear")

Shape = tuple[int, int, int, int, int]
STRATEGIES = ("sequential", "chunked")


@contextlib.contextmanager
def strategy(name: str, length: int = 32) -> Iterator[None]:
    """Force ``name``; chunked rows get chunks that end mid-tile and span tiles."""
    if name == "sequential":
        with linear.force_strategy(name):
            yield
        return
    chunk, block_t = (12, 8) if length < 100 else (96, 32)
    with linear.force_strategy(name, chunk, block_t):
        yield


def _inputs(shape: Shape, dtype: torch.dtype, seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = gates(shape[:4], dtype, kernel_device(), generator=gen)
    Bm = torch.randn(shape, generator=gen, dtype=torch.float64).to(kernel_device(), dtype)
    return a, Bm


def _check_scan(shape: Shape, dtype: torch.dtype) -> None:
    """Forward and both input gradients of diag_scan_fwd against autograd of the float64 reference."""
    a, Bm = _inputs(shape, dtype)
    a.requires_grad_(True)
    Bm.requires_grad_(True)
    abar, Bbar = diag.diag_scan_fwd(a, Bm)
    assert abar.dtype == dtype and Bbar.dtype == dtype
    assert abar.shape == a.shape and Bbar.shape == Bm.shape
    a64 = a.detach().double().requires_grad_(True)
    B64 = Bm.detach().double().requires_grad_(True)
    abar64, Bbar64 = diag_scan_ref(a64, B64)
    T = shape[1]
    assert_close(abar, abar64, dtype, T, "abar")
    assert_close(Bbar, Bbar64, dtype, T, "Bbar")
    gabar, gBbar = torch.randn_like(abar), torch.randn_like(Bbar)
    da, dB = torch.autograd.grad((abar, Bbar), (a, Bm), (gabar, gBbar))
    if dtype in HALF_TYPES:
        # The adjoint reads the stored (rounded) abar and Bbar: compare with the float64 adjoint of those.
        args = (abar.double(), Bbar.double(), gabar.double(), gBbar.double())
        da64, dB64 = diag_scan_bwd_ref(a64.detach(), *args)
    else:
        da64, dB64 = torch.autograd.grad((abar64, Bbar64), (a64, B64), (gabar.double(), gBbar.double()))
    # da sums v products per step: scale the tolerance by T v.
    assert_close(da, da64, dtype, T * shape[4], "da")
    assert_close(dB, dB64, dtype, T, "dB")


def diag_recurrence(a: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    """The eager reference H_t = diag(a_t) H_{t-1} + B_t = Bbar_t + diag(abar_t) H0 (never a kernel: under
    the interpreter ``mingru.min_gru.diag_recurrence`` would dispatch to the kernels under test)."""
    abar, Bbar = diag_scan_ref(a, Bm)
    return Bbar + abar.unsqueeze(-1) * H0.unsqueeze(1)


def _check_recurrence(shape: Shape, dtype: torch.dtype) -> None:
    """diag_recurrence_fwd and its gradients (a, Bm, H0) against the float64 reference recurrence."""
    a, Bm = _inputs(shape, dtype, seed=1)
    H0 = torch.randn(shape[0], *shape[2:], dtype=torch.float64).to(a.device, dtype)
    leaves = [x.requires_grad_(True) for x in (a, Bm, H0)]
    H = diag.diag_recurrence_fwd(*leaves)
    assert H.dtype == dtype and H.shape == Bm.shape
    leaves64 = [x.detach().double().requires_grad_(True) for x in leaves]
    H64 = diag_recurrence(*leaves64)
    T = shape[1]
    assert_close(H, H64, dtype, T, "H")
    gH = torch.randn_like(H)
    grads = torch.autograd.grad(H, leaves, gH)
    if dtype in HALF_TYPES:
        grads64 = diag.diag_recurrence_bwd(*(x.detach().double() for x in (a, H0, H, gH)))
    else:
        grads64 = torch.autograd.grad(H64, leaves64, gH.double())
    for name, g, g64 in zip(("da", "dB", "dH0"), grads, grads64, strict=True):
        assert_close(g, g64, dtype, T * shape[4], name)


# ---------------------------------------------------------------------------------------------------------
# Interpreter (CPU tensors, small shapes)
# ---------------------------------------------------------------------------------------------------------

CASES = [
    pytest.param((2, 1, 1, 2, 3), torch.float32, id="B2-T1-n1-k2-v3-float32"),
    pytest.param((1, 29, 2, 3, 5), torch.float64, id="B1-T29-n2-k3-v5-float64"),
    pytest.param((1, 33, 1, 2, 4), torch.float32, id="B1-T33-n1-k2-v4-float32"),
]


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(("shape", "dtype"), CASES)
@marked(on_interpreter)
def test_scan_matches_reference(shape: Shape, dtype: torch.dtype, name: str) -> None:
    with strategy(name, shape[1]):
        _check_scan(shape, dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(("shape", "dtype"), CASES)
@marked(on_interpreter)
def test_recurrence_matches_reference(shape: Shape, dtype: torch.dtype, name: str) -> None:
    with strategy(name, shape[1]):
        _check_recurrence(shape, dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@marked(on_interpreter)
def test_half_inputs_give_half_outputs(dtype: torch.dtype, name: str) -> None:
    with strategy(name):
        _check_scan((1, 21, 1, 2, 3), dtype)
        _check_recurrence((1, 21, 1, 2, 3), dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_interpreter)
def test_gradcheck_fp64(name: str) -> None:
    a, Bm = _inputs((1, 4, 1, 2, 2), torch.float64)
    H0 = torch.randn(1, 1, 2, 2, dtype=torch.float64)
    a, Bm, H0 = (x.requires_grad_(True) for x in (a, Bm, H0))
    with linear.force_strategy(name, 3, 2):
        assert torch.autograd.gradcheck(diag.diag_scan_fwd, (a, Bm), fast_mode=True)
        assert torch.autograd.gradcheck(diag.diag_recurrence_fwd, (a, Bm, H0), fast_mode=True)


@marked(on_interpreter)
def test_non_contiguous_inputs() -> None:
    a, Bm = _inputs((2, 12, 2, 2, 3), torch.float32)
    a_t = a.transpose(2, 3).contiguous().transpose(2, 3)
    B_t = Bm.transpose(3, 4).contiguous().transpose(3, 4)
    assert not a_t.is_contiguous() and not B_t.is_contiguous()
    abar, Bbar = diag.diag_scan_fwd(a_t, B_t)
    abar64, Bbar64 = diag_scan_ref(a.double(), Bm.double())
    assert_close(abar, abar64, torch.float32, 12, "abar")
    assert_close(Bbar, Bbar64, torch.float32, 12, "Bbar")
    H0 = torch.randn(2, 2, 3, 2).transpose(2, 3)
    H = diag.diag_recurrence_fwd(a_t, B_t, H0)
    assert_close(H, diag_recurrence(a.double(), Bm.double(), H0.double()), torch.float32, 12, "H")


@marked(on_interpreter)
def test_envelope_and_input_errors() -> None:
    a, Bm = _inputs((1, 3, 1, 2, 3), torch.float32)
    assert diag.diag_envelope(a, Bm) is None
    wide = torch.zeros(1, 3, 1, 2, 513)
    assert diag.diag_envelope(a, wide) == "v must be <= 512 for the diag kernel, got v=513"
    with pytest.raises(ValueError, match="v must be <= 512 for the diag kernel, got v=513"):
        diag.diag_scan_fwd(a, wide)
    with pytest.raises(ValueError, match="T must be >= 1 for the diag kernel, got T=0"):
        diag.diag_scan_fwd(a[:, :0], Bm[:, :0])
    with pytest.raises(ValueError, match=r"Bm must have shape \(B, T, n, k, v\) matching a"):
        diag.diag_scan_fwd(a, Bm[:, :, :, :1])
    with pytest.raises(TypeError, match="Bm must have the same dtype as a"):
        diag.diag_scan_fwd(a, Bm.double())
    with pytest.raises(ValueError, match=r"H0 must have shape \(B, n, k, v\) = \(1, 1, 2, 3\)"):
        diag.diag_recurrence_fwd(a, Bm, torch.zeros(1, 1, 2, 4))


# ---------------------------------------------------------------------------------------------------------
# CUDA (real sizes)
# ---------------------------------------------------------------------------------------------------------

CUDA_SHAPES = [(2, 2048, 4, 32, 64), (1, 1 << 16, 2, 16, 32), (3, 1000, 3, 5, 7), (1, 40_000, 1, 4, 128)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "B{}-T{}-n{}-k{}-v{}".format(*s))
@marked(on_cuda)
def test_cuda_matches_reference(shape: Shape, dtype: torch.dtype) -> None:
    _check_scan(shape, dtype)
    _check_recurrence(shape, dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_cuda)
def test_cuda_both_strategies(name: str) -> None:
    with strategy(name, 3001):
        _check_scan((2, 3001, 2, 8, 16), torch.float32)
        _check_recurrence((2, 3001, 2, 8, 16), torch.float16)


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_cuda)
def test_cuda_gradcheck_fp64(name: str) -> None:
    a, Bm = _inputs((2, 9, 2, 2, 3), torch.float64)
    H0 = torch.randn(2, 2, 2, 3, dtype=torch.float64, device=a.device)
    a, Bm, H0 = (x.requires_grad_(True) for x in (a, Bm, H0))
    with linear.force_strategy(name, 4, 2):
        assert torch.autograd.gradcheck(diag.diag_scan_fwd, (a, Bm))
        assert torch.autograd.gradcheck(diag.diag_recurrence_fwd, (a, Bm, H0))
