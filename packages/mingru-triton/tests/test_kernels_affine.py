"""The matrix affine kernels (mingru_triton.affine) against the float64 eager reference of mingru-core.

Interpreter tests (CPU tensors, small shapes) cover both strategies, odd and power-of-two k and v, T = 1,
long-ish T, non-contiguous and half inputs, None output grads, fp64 gradcheck and the envelope. CUDA tests
repeat the comparisons at real sizes and index past 2^31 elements.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch

pytest.importorskip("triton")

from kernel_cases import HALF_TYPES, assert_close, marked, on_cuda, on_interpreter
from torch import Tensor

from mingru.scans.affine import affine_scan_bwd_ref, affine_scan_ref
from mingru_triton import affine
from mingru_triton.affine import (
    _strategy,
    affine_envelope,
    affine_recurrence_bwd,
    affine_recurrence_fwd,
    affine_scan_bwd,
    affine_scan_fwd,
    force_strategy,
)

STRATEGIES = ("sequential", "chunked")


interpreted = marked(on_interpreter)
on_gpu = marked(on_cuda)


def _inputs(
    shape: tuple[int, int, int, int, int], dtype: torch.dtype, device: torch.device, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """A (B, T, n, k, k) with spectral radius about 0.9 (long scans stay finite), Bm (B, T, n, k, v), H0."""
    batch, steps, heads, k, v = shape
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(batch, steps, heads, k, k, generator=gen, dtype=torch.float64) * (0.9 / (2 * k**0.5))
    A = A + 0.45 * torch.eye(k, dtype=torch.float64)
    Bm = torch.randn(batch, steps, heads, k, v, generator=gen, dtype=torch.float64)
    H0 = torch.randn(batch, heads, k, v, generator=gen, dtype=torch.float64)
    return tuple(x.to(device=device, dtype=dtype) for x in (A, Bm, H0))  # type: ignore[return-value]


def _recurrence_ref(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    """H_t = A_t H_{t-1} + B_t from H0, through the core reference scan."""
    Abar, Bbar = affine_scan_ref(A, Bm)
    return Bbar + torch.matmul(Abar, H0.unsqueeze(1))


def _recurrence_bwd_ref(A: Tensor, H0: Tensor, H: Tensor, grad_H: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The recurrence adjoint as a float64 loop over the given (stored) states H."""
    A, H0, H, grad_H = (x.double() for x in (A, H0, H, grad_H))
    dA, dB = torch.empty_like(A), torch.empty_like(H)
    adj = torch.zeros_like(H0)
    for t in reversed(range(A.shape[1])):
        if t + 1 < A.shape[1]:
            adj = A[:, t + 1].transpose(-1, -2) @ adj
        adj = adj + grad_H[:, t]
        dB[:, t] = adj
        dA[:, t] = adj @ (H[:, t - 1] if t > 0 else H0).transpose(-1, -2)
    return dA, dB, A[:, 0].transpose(-1, -2) @ adj


def _run(fn: Callable[..., tuple[Tensor, ...]], inputs: tuple[Tensor, ...], weights: list[Tensor | None]):
    """Outputs of ``fn`` and the grads of the inputs for output grads ``weights`` (None: output unused)."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    outs = fn(*leaves)
    used = [(out, w) for out, w in zip(outs, weights, strict=True) if w is not None]
    grads = torch.autograd.grad([o for o, _ in used], leaves, [w for _, w in used], allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]
    return [out.detach() for out in outs], grads


def _compare(got: list[Tensor], want: list[Tensor], names: tuple[str, ...], dtype: torch.dtype, steps: int):
    for actual, expected, name in zip(got, want, names, strict=True):
        assert actual.dtype == dtype, name
        assert_close(actual, expected, dtype, steps, name)


def _weights(shapes: list[tuple[int, ...]], used: tuple[bool, ...], dtype: torch.dtype, device: torch.device):
    gen = torch.Generator().manual_seed(1)
    drawn = [torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype) for shape in shapes]
    return [w if keep else None for w, keep in zip(drawn, used, strict=True)]


def _check_scan(shape, dtype, device, used=(True, True)) -> None:
    """affine_scan_fwd and its backward against the float64 reference.

    Half types: the backward is compared with the float64 adjoint of the kernel's own stored outputs (it
    reads them, rounded to the input dtype), so that the tolerance is the rounding of the result.
    """
    A, Bm, _ = _inputs(shape, dtype, device)
    weights = _weights([(*shape[:4], shape[3]), shape], used, dtype, device)
    outs, grads = _run(affine_scan_fwd, (A, Bm), weights)
    wide = [None if w is None else w.double() for w in weights]
    want, want_grads = _run(affine_scan_ref, (A.double(), Bm.double()), wide)
    if dtype in HALF_TYPES:
        want_grads = list(affine_scan_bwd_ref(A.double(), outs[0].double(), outs[1].double(), *wide))
    _compare(outs + grads, want + want_grads, ("Abar", "Bbar", "dA", "dB"), dtype, shape[1])


def _check_recurrence(shape, dtype, device) -> None:
    """affine_recurrence_fwd and its backward against the float64 reference (half types as above)."""
    A, Bm, H0 = _inputs(shape, dtype, device)
    weights = _weights([shape], (True,), dtype, device)
    outs, grads = _run(lambda *x: (affine_recurrence_fwd(*x),), (A, Bm, H0), weights)
    wide = (A.double(), Bm.double(), H0.double())
    want, want_grads = _run(lambda *x: (_recurrence_ref(*x),), wide, [weights[0].double()])
    if dtype in HALF_TYPES:
        dA, dB, dH0 = _recurrence_bwd_ref(A, H0, outs[0], weights[0])
        want_grads = [dA, dB, dH0]
    _compare(outs + grads, want + want_grads, ("H", "dA", "dB", "dH0"), dtype, shape[1])


# ------------------------------------------------------------------------------------------ interpreter

SHAPES = [
    (2, 1, 3, 3, 2),  # T = 1
    (1, 7, 2, 1, 1),  # k = v = 1
    (2, 13, 1, 2, 5),  # T not a power of two, v != k
    (1, 9, 3, 4, 3),  # odd n and v
    (1, 6, 1, 8, 8),
    (1, 5, 1, 16, 16),  # tl.dot products
    (1, 5, 1, 16, 3),  # tl.dot for k x k, broadcast for k x v
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@interpreted
def test_scan_matches_reference(shape, strategy) -> None:
    with force_strategy(strategy, 2):
        _check_scan(shape, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("strategy", STRATEGIES)
@interpreted
def test_long_scan(strategy) -> None:
    with force_strategy(strategy):
        _check_scan((1, 300, 1, 2, 3), torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("shape", [(2, 1, 2, 3, 2), (2, 11, 3, 3, 2), (1, 8, 1, 16, 16)], ids=str)
@interpreted
def test_recurrence_matches_reference(shape, strategy) -> None:
    with force_strategy(strategy, 3):
        _check_recurrence(shape, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("used", [(True, False), (False, True)], ids=["only-Abar", "only-Bbar"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@interpreted
def test_scan_with_an_unused_output(used, strategy) -> None:
    with force_strategy(strategy, 3):
        _check_scan((2, 10, 2, 3, 2), torch.float32, torch.device("cpu"), used)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("strategy", STRATEGIES)
@interpreted
def test_half_inputs_on_the_dot_path(dtype, strategy) -> None:
    """bfloat16 / float16 inputs with k, v >= 16 multiply their float32 accumulators with tl.dot."""
    assert affine._config(16, 16, dtype)["DOT_KK"] == 1
    assert affine._config(16, 16, torch.float64)["DOT_KK"] == affine._config(16, 8, dtype)["DOT_KK"] == 0
    with force_strategy(strategy, 2):
        _check_scan((1, 5, 1, 16, 16), dtype, torch.device("cpu"))
        _check_recurrence((1, 5, 1, 16, 16), dtype, torch.device("cpu"))


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize(("strategy", "chunk", "steps"), [("sequential", None, 1), ("sequential", None, 2),
                                                          ("chunked", 3, 2), ("chunked", 4, 13),
                                                          ("chunked", 2, 9)])  # fmt: skip
@interpreted
def test_broadcast_prefetch(
    monkeypatch: pytest.MonkeyPatch, prefetch: int, strategy: str, chunk, steps: int
) -> None:
    """The broadcast path's step loops with their loads 0, 1 or 2 steps ahead, forward and adjoint of both
    ops, T down to below the distance (the loads past either end masked), chunked and not; bfloat16 for the
    scan, float32 for the recurrence."""
    monkeypatch.setattr(affine, "BROADCAST_PREFETCH", prefetch)
    cfg = {k: affine._config(k, 3, torch.bfloat16) for k in (2, 3, 5)}
    assert affine._prefetch(cfg[3], adjoint=True) == affine._prefetch(cfg[5], adjoint=False) == prefetch
    assert affine._prefetch(cfg[5], adjoint=True) == prefetch
    # 4 x 4 tiles load ahead in the adjoint only; 2 x 2 tiles and the tl.dot path load each step's own
    assert affine._prefetch(cfg[3], adjoint=False) == affine._prefetch(cfg[2], adjoint=True) == 0
    dot = affine._config(16, 16, torch.bfloat16)
    assert affine._prefetch(dot, adjoint=False) == affine._prefetch(dot, adjoint=True) == 0
    with force_strategy(strategy, chunk):
        for k in (3, 5):  # 4 x 4 tiles: the adjoint loads ahead; 8 x 8: both directions
            _check_scan((2, steps, 2, k, 2), torch.bfloat16, torch.device("cpu"))
            _check_recurrence((2, steps, 3, k, 3), torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("entries", [4, 32, 128])
@pytest.mark.parametrize("strategy", STRATEGIES)
@interpreted
def test_adjoint_row_groups(monkeypatch: pytest.MonkeyPatch, entries: int, strategy: str) -> None:
    """Adjoint programs of one to 32 rows (b, h) on the broadcast path, B * n = 11 rows (the last group
    part empty), both ops forward and adjoint against the reference."""
    monkeypatch.setattr(affine, "ADJOINT_GROUP_ENTRIES", entries)
    assert affine._adjoint_group(affine._config(2, 2, torch.float32)) == max(1, entries // 4)
    assert affine._adjoint_group(affine._config(8, 3, torch.float32)) == max(1, entries // 64)
    assert affine._adjoint_group(affine._config(16, 16, torch.float32)) == 1
    with force_strategy(strategy, 3):
        for k, v in ((2, 2), (3, 1), (8, 3)):
            _check_scan((1, 7, 11, k, v), torch.float32, torch.device("cpu"))
            _check_recurrence((1, 7, 11, k, v), torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float64, *HALF_TYPES], ids=str)
@pytest.mark.parametrize("strategy", STRATEGIES)
@interpreted
def test_dtypes(dtype, strategy) -> None:
    with force_strategy(strategy, 4):
        _check_scan((1, 12, 2, 3, 4), dtype, torch.device("cpu"))
        _check_recurrence((1, 12, 2, 3, 4), dtype, torch.device("cpu"))


@interpreted
def test_non_contiguous_inputs() -> None:
    A, Bm, H0 = _inputs((2, 9, 3, 3, 2), torch.float32, torch.device("cpu"))
    A_nc = A.transpose(1, 2).contiguous().transpose(1, 2)
    Bm_nc = Bm.transpose(-1, -2).contiguous().transpose(-1, -2)
    H0_nc = H0.transpose(0, 1).contiguous().transpose(0, 1)
    assert not (A_nc.is_contiguous() or Bm_nc.is_contiguous() or H0_nc.is_contiguous())
    Abar, Bbar = affine_scan_fwd(A_nc, Bm_nc)
    ref_Abar, ref_Bbar = affine_scan_ref(A.double(), Bm.double())
    assert_close(Abar, ref_Abar, torch.float32, what="Abar")
    assert_close(Bbar, ref_Bbar, torch.float32, what="Bbar")
    H = affine_recurrence_fwd(A_nc, Bm_nc, H0_nc)
    assert_close(H, _recurrence_ref(A.double(), Bm.double(), H0.double()), torch.float32, what="H")
    gBbar = torch.randn_like(Bbar).transpose(0, 1).contiguous().transpose(0, 1)
    dA, dB = affine_scan_bwd(A_nc, Abar, Bbar, None, gBbar)
    ref_dA, ref_dB = affine_scan_bwd(A, Abar, Bbar, None, gBbar.contiguous())
    torch.testing.assert_close((dA, dB), (ref_dA, ref_dB), rtol=0, atol=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
@interpreted
def test_gradcheck_fp64(strategy) -> None:
    A, Bm, H0 = (x.requires_grad_() for x in _inputs((1, 3, 2, 2, 3), torch.float64, torch.device("cpu")))
    with force_strategy(strategy, 2):
        assert torch.autograd.gradcheck(affine_scan_fwd, (A, Bm), fast_mode=True)
        assert torch.autograd.gradcheck(affine_recurrence_fwd, (A, Bm, H0), fast_mode=True)


@interpreted
def test_backward_ops_directly() -> None:
    """The backward ops take None grads (scan) and return zeros for what no grad reaches."""
    A, Bm, H0 = _inputs((1, 4, 1, 2, 2), torch.float32, torch.device("cpu"))
    Abar, Bbar = affine_scan_fwd(A, Bm)
    dA, dB = affine_scan_bwd(A, Abar, Bbar, None, None)
    assert torch.count_nonzero(dA) == 0 and torch.count_nonzero(dB) == 0
    H = affine_recurrence_fwd(A, Bm, H0)
    dA, dB, dH0 = affine_recurrence_bwd(A, H0, H, torch.zeros_like(H))
    assert dA.shape == A.shape and dB.shape == Bm.shape and dH0.shape == H0.shape
    assert torch.count_nonzero(dA) + torch.count_nonzero(dB) + torch.count_nonzero(dH0) == 0


@interpreted
def test_envelope() -> None:
    A, Bm, _ = _inputs((1, 2, 1, 33, 2), torch.float32, torch.device("cpu"))
    assert affine_envelope(A[..., :32, :32], Bm[..., :32, :]) is None
    assert affine_envelope(A, Bm) == "k must be in [1, 32] for the affine kernel, got k=33"
    with pytest.raises(ValueError, match="k must be in \\[1, 32\\] for the affine kernel, got k=33"):
        affine_scan_fwd(A, Bm)
    wide = torch.zeros(1, 2, 1, 2, 65)
    assert affine_envelope(A[..., :2, :2], wide) == "v must be in [1, 64] for the affine kernel, got v=65"
    with pytest.raises(ValueError, match="v must be in \\[1, 64\\] for the affine kernel, got v=65"):
        affine_recurrence_fwd(A[..., :2, :2], wide, torch.zeros(1, 1, 2, 65))
    assert "takes A (B, T, n, k, k)" in affine_envelope(A[0], Bm)


@interpreted
def test_input_errors() -> None:
    A, Bm, H0 = _inputs((1, 3, 2, 3, 2), torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="Bm must have shape"):
        affine_scan_fwd(A, Bm[:, :2])
    with pytest.raises(TypeError, match="Bm must have the same dtype as A"):
        affine_scan_fwd(A, Bm.double())
    with pytest.raises(ValueError, match="H0 must have shape"):
        affine_recurrence_fwd(A, Bm, H0[:, :1])
    Abar, Bbar = affine_scan_fwd(A, Bm)
    with pytest.raises(ValueError, match="gBbar must have shape"):
        affine_scan_bwd(A, Abar, Bbar, None, Bbar[:, :1])
    with pytest.raises(ValueError, match="Bbar must have shape"):
        affine_scan_bwd(A, Abar, Bbar[:, :1], None, None)
    with pytest.raises(ValueError, match="A must hold square k x k matrices"):
        affine_scan_fwd(A[..., :2], Bm)
    with pytest.raises(ValueError, match="grad_H must have shape"):
        affine_recurrence_bwd(A, H0, Bm, Bm[:, :1])
    with pytest.raises(ValueError, match="name must be one of"), force_strategy("parallel"):
        pass


def test_strategy_heuristic() -> None:
    assert _strategy(64, 4096) == ("chunked", 64)  # 64 chunks of 64 for tiles of KP <= 4
    assert _strategy(64, 4096, kp=8) == ("chunked", 128)
    assert _strategy(2111, 4096) == ("chunked", 64)
    assert _strategy(2112, 4096) == ("sequential", 4096)  # B * n alone gives 16 programs per SM
    assert _strategy(4, 127) == ("sequential", 127)  # shorter than two chunks
    assert _strategy(4, 128) == ("chunked", 64)
    assert _strategy(1, 2**20) == ("chunked", 1024)  # isqrt(T): phase 2 no longer than a chunk
    with force_strategy("chunked"):
        assert _strategy(1024, 10) == ("chunked", 3)
        assert _strategy(1024, 1) == ("sequential", 1)
    with force_strategy("chunked", 50):
        assert _strategy(1, 10) == ("chunked", 5)
    with force_strategy("sequential"):
        assert _strategy(1, 2**20) == ("sequential", 2**20)


# ------------------------------------------------------------------------------------------------- CUDA

CUDA_CASES = [
    ((4, 4096, 16, 16, 16), torch.float32),  # the speed target's shape: 2^26 state elements
    ((2, 8192, 8, 3, 5), torch.float32),
    ((4, 1024, 4, 32, 64), torch.float32),  # the envelope's edge
    ((32, 256, 16, 4, 4), torch.float32),  # B * n fills the GPU: sequential on its own
    ((2, 2048, 4, 8, 8), torch.bfloat16),
    ((2, 2048, 4, 16, 4), torch.float16),
    ((2, 1024, 4, 16, 16), torch.bfloat16),  # half inputs on the tl.dot path
    ((2, 256, 2, 32, 32), torch.float16),
    ((2, 512, 2, 4, 4), torch.float64),
    # short cases around (k = 16, v = 4, float16), which gave a wrong dA on the H200 (not under the
    # interpreter): which of the dtype, k and v is at fault
    ((2, 64, 2, 16, 4), torch.float32),
    ((2, 64, 2, 16, 4), torch.bfloat16),
    ((2, 64, 2, 16, 4), torch.float16),
    ((2, 64, 2, 8, 8), torch.float16),
    ((2, 64, 2, 16, 16), torch.float16),
    ((2, 64, 2, 4, 16), torch.float16),
]


@pytest.mark.parametrize("strategy", [None, *STRATEGIES], ids=["auto", *STRATEGIES])
@pytest.mark.parametrize(("shape", "dtype"), CUDA_CASES, ids=str)
@on_gpu
def test_cuda_matches_reference(shape, dtype, strategy) -> None:
    device = torch.device("cuda")
    with force_strategy(strategy) if strategy else contextlib.nullcontext():
        _check_scan(shape, dtype, device)
        _check_recurrence(shape, dtype, device)


@pytest.mark.parametrize("strategy", STRATEGIES)
@on_gpu
def test_cuda_gradcheck_fp64(strategy) -> None:
    device = torch.device("cuda")
    A, Bm, H0 = (x.requires_grad_() for x in _inputs((2, 9, 2, 3, 2), torch.float64, device))
    with force_strategy(strategy, 4):
        assert torch.autograd.gradcheck(affine_scan_fwd, (A, Bm))
        assert torch.autograd.gradcheck(affine_recurrence_fwd, (A, Bm, H0))


@on_gpu
def test_cuda_compiles_into_one_graph() -> None:
    A, Bm, H0 = (x.requires_grad_() for x in _inputs((2, 64, 2, 4, 3), torch.float32, torch.device("cuda")))

    def loss(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
        Abar, Bbar = affine_scan_fwd(A, Bm)
        return Abar.square().sum() + Bbar.sum() + affine_recurrence_fwd(A, Bm, H0).square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    want = torch.autograd.grad(loss(A, Bm, H0), (A, Bm, H0))
    got = torch.autograd.grad(compiled(A, Bm, H0), (A, Bm, H0))
    torch.testing.assert_close(got, want)


@pytest.mark.gpu_memory
@on_gpu
def test_cuda_indexes_past_2_31_elements() -> None:
    """A holds 2 * (2^20 + 64) * 32 * 32 > 2^31 elements: identities, then 8 random matrices at the end of
    the second row. Checked against a float64 loop over the last steps (Bbar is a plain sum before them)."""
    batch, steps, k, tail = 2, 2**20 + 64, 32, 8
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    try:
        A = torch.eye(k, device=device, dtype=torch.bfloat16).expand(batch, steps, 1, k, k).contiguous()
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a tensor of 2^31 elements")
    assert A.numel() > 2**31
    A[1, -tail:, 0] = (torch.randn(tail, k, k, device=device, generator=gen) / k**0.5).to(A.dtype)
    Bm = torch.randn(batch, steps, 1, k, 1, device=device, generator=gen).to(torch.bfloat16)
    Abar, Bbar = affine_scan_fwd(A, Bm)
    state = Bm[1, : steps - tail, 0].double().sum(0)
    prod = torch.eye(k, device=device, dtype=torch.float64)
    for i in range(tail):
        t = steps - tail + i
        state = A[1, t, 0].double() @ state + Bm[1, t, 0].double()
        prod = A[1, t, 0].double() @ prod
        assert_close(Bbar[1, t, 0], state, torch.bfloat16, what=f"Bbar[1, {t}]")
        assert_close(Abar[1, t, 0], prod, torch.bfloat16, what=f"Abar[1, {t}]")
    assert_close(Bbar[0, -1, 0], Bm[0, :, 0].double().sum(0), torch.bfloat16, what="Bbar[0, -1]")
    assert torch.equal(Abar[0, -1, 0], A[0, 0, 0])


@on_gpu
def test_cuda_multiply_and_sum_products_never_use_tensor_cores() -> None:
    """The multiply + sum products (k = 16, v = 4: no tl.dot) compile to plain FMA, not to a TF32 mma.

    Triton 3.6 rewrote ``sum(a[:, :, None] * b[None, :, :], 1)`` with M, N >= 16 into a TF32 dot on tensor
    cores, which gave a wrong dA for v = 4 on the H200; ``_mm`` writes the product so that it does not match.
    """
    from mingru_triton import affine

    _check_scan((2, 64, 2, 16, 4), torch.float32, torch.device("cuda"))
    _check_recurrence((2, 64, 2, 16, 4), torch.float32, torch.device("cuda"))
    compiled = 0
    for kernel in (affine._fwd_kernel, affine._bwd_kernel, affine._carry_kernel):
        for cache in kernel.device_caches.values():
            for binary in cache[0].values():
                ptx = binary.asm["ptx"]
                compiled += 1
                assert "tf32" not in ptx, f"{kernel.__name__}: a TF32 instruction in the compiled kernel"
    assert compiled > 0, "no compiled affine kernel found in Triton's cache"
