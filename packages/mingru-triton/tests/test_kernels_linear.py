"""The k = 1 linear scan kernels (linear_scan_fwd/_bwd, linear_recurrence_fwd/_bwd) against the float64 eager
references, under the Triton interpreter (small shapes) and on CUDA (real sizes), with every strategy."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from kernel_cases import HALF_TYPES, assert_close, gates, kernel_device, marked, on_cuda, on_interpreter
from torch import Tensor

from mingru.scans.linear import linear_scan_bwd_ref, linear_scan_ref

linear = pytest.importorskip("mingru_triton.linear")
_launch = pytest.importorskip("mingru_triton._launch")


STRATEGIES = tuple(name for name in linear.STRATEGIES if name != "split")
"""Forced over the k = 1 ops; "split" serves only the log scan's forwards (their tests: test_kernels_log.py,
the plain k = 1 forward of the split walk: :func:`test_split_walk_matches_reference`)."""


@contextlib.contextmanager
def strategy(name: str, length: int = 32) -> Iterator[None]:
    """Force ``name``; chunked rows of ``length`` steps get chunks that end mid-tile and span tiles, the
    single-pass kernel and the pipelined walk get short tiles, so a row spans many tiles and the last one is
    partial, and the segment kernel short segments of several tiles."""
    if name in ("lookback", "pipelined"):
        with linear.force_strategy(name, None, 4 if length < 100 else 16):
            yield
        return
    if name == "sequential":
        with linear.force_strategy(name):
            yield
        return
    if name == "segment":
        with linear.force_strategy(name, *((8, 4) if length < 100 else (48, 16))):
            yield
        return
    chunk, block_t = (24, 16) if length < 100 else (96, 32)
    with linear.force_strategy(name, chunk, block_t):
        yield


def _inputs(shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = gates(shape, dtype, kernel_device(), generator=gen)
    b = torch.randn(shape, generator=gen, dtype=torch.float64).to(kernel_device(), dtype)
    return a, b


def linear_recurrence(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """The eager reference recurrence h_t = a_t h_{t-1} + b_t = Bc_t + A_t h0 (never a kernel: under the
    interpreter ``mingru.min_gru.linear_recurrence`` would dispatch to the kernels under test)."""
    A, Bc = linear_scan_ref(a, b)
    return Bc + A * h0.unsqueeze(1)


def _check_scan(shape: tuple[int, int, int], dtype: torch.dtype) -> None:
    """Forward and both input gradients of linear_scan_fwd against autograd of the float64 reference."""
    a, b = _inputs(shape, dtype)
    a.requires_grad_(True)
    b.requires_grad_(True)
    A, Bc = linear.linear_scan_fwd(a, b)
    assert A.dtype == dtype and Bc.dtype == dtype
    a64 = a.detach().double().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True)
    A64, Bc64 = linear_scan_ref(a64, b64)
    T = shape[1]
    assert_close(A, A64, dtype, T, "A")
    assert_close(Bc, Bc64, dtype, T, "Bc")
    gA, gBc = torch.randn_like(A), torch.randn_like(Bc)
    da, db = torch.autograd.grad((A, Bc), (a, b), (gA, gBc))
    if dtype in HALF_TYPES:
        # The adjoint reads the stored (rounded) A and Bc: compare with the float64 adjoint of those.
        da64, db64 = linear_scan_bwd_ref(a64.detach(), A.double(), Bc.double(), gA.double(), gBc.double())
    else:
        da64, db64 = torch.autograd.grad((A64, Bc64), (a64, b64), (gA.double(), gBc.double()))
    assert_close(da, da64, dtype, T, "da")
    assert_close(db, db64, dtype, T, "db")


def _check_recurrence(shape: tuple[int, int, int], dtype: torch.dtype) -> None:
    """linear_recurrence_fwd and its gradients (a, b, h0) against the float64 reference recurrence."""
    a, b = _inputs(shape, dtype, seed=1)
    h0 = torch.randn(shape[0], shape[2], dtype=torch.float64).to(a.device, dtype)
    leaves = [x.requires_grad_(True) for x in (a, b, h0)]
    h = linear.linear_recurrence_fwd(*leaves)
    assert h.dtype == dtype
    leaves64 = [x.detach().double().requires_grad_(True) for x in leaves]
    h64 = linear_recurrence(*leaves64)
    T = shape[1]
    assert_close(h, h64, dtype, T, "h")
    gh = torch.randn_like(h)
    grads = torch.autograd.grad(h, leaves, gh)
    if dtype in HALF_TYPES:
        grads64 = linear.linear_recurrence_bwd(*(x.detach().double() for x in (a, h0, h, gh)))
    else:
        grads64 = torch.autograd.grad(h64, leaves64, gh.double())
    for name, g, g64 in zip(("da", "db", "dh0"), grads, grads64, strict=True):
        assert_close(g, g64, dtype, T, name)


# ---------------------------------------------------------------------------------------------------------
# Interpreter (CPU tensors, small shapes)
# ---------------------------------------------------------------------------------------------------------

SCAN_CASES = [
    pytest.param((2, 1, 3), torch.float32, id="B2-T1-D3-float32"),
    pytest.param((2, 37, 5), torch.float64, id="B2-T37-D5-float64"),
    pytest.param((1, 300, 2), torch.float32, id="B1-T300-D2-float32"),
]
RECURRENCE_CASES = [
    pytest.param((2, 1, 3), torch.float64, id="B2-T1-D3-float64"),
    pytest.param((2, 37, 5), torch.float32, id="B2-T37-D5-float32"),
    pytest.param((1, 150, 1), torch.float64, id="B1-T150-D1-float64"),
]


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(("shape", "dtype"), SCAN_CASES)
@marked(on_interpreter)
def test_scan_matches_reference(shape: tuple[int, int, int], dtype: torch.dtype, name: str) -> None:
    with strategy(name, shape[1]):
        _check_scan(shape, dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(("shape", "dtype"), RECURRENCE_CASES)
@marked(on_interpreter)
def test_recurrence_matches_reference(shape: tuple[int, int, int], dtype: torch.dtype, name: str) -> None:
    with strategy(name, shape[1]):
        _check_recurrence(shape, dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@marked(on_interpreter)
def test_half_inputs_give_half_outputs(dtype: torch.dtype, name: str) -> None:
    with strategy(name):
        _check_scan((1, 45, 3), dtype)
        _check_recurrence((1, 45, 3), dtype)


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_interpreter)
def test_gradcheck_fp64(name: str) -> None:
    a, b = _inputs((1, 5, 2), torch.float64)
    h0 = torch.randn(1, 2, dtype=torch.float64)
    a, b, h0 = (x.requires_grad_(True) for x in (a, b, h0))
    with linear.force_strategy(name, 3, 2):
        assert torch.autograd.gradcheck(linear.linear_scan_fwd, (a, b), fast_mode=True)
        assert torch.autograd.gradcheck(linear.linear_recurrence_fwd, (a, b, h0), fast_mode=True)


@marked(on_interpreter)
def test_non_contiguous_inputs() -> None:
    a, b = _inputs((2, 20, 3), torch.float32)
    a_t, b_t = a.transpose(0, 2).contiguous().transpose(0, 2), b[:, :, :]
    a_s, b_s = a[:, ::2], b[:, 1::2]
    assert not a_t.is_contiguous() and not a_s.is_contiguous()
    for x, y in ((a_t, b_t), (a_s, b_s)):
        A, Bc = linear.linear_scan_fwd(x, y)
        A64, Bc64 = linear_scan_ref(x.double(), y.double())
        assert_close(A, A64, torch.float32, x.shape[1], "A")
        assert_close(Bc, Bc64, torch.float32, x.shape[1], "Bc")
    h0 = torch.randn(2, 6, dtype=torch.float32)[:, ::2]
    h = linear.linear_recurrence_fwd(a, b, h0)
    assert_close(h, linear_recurrence(a.double(), b.double(), h0.double()), torch.float32, 20, "h")


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_interpreter)
def test_zero_coefficients_and_one_sided_grads(name: str) -> None:
    """a may be 0 (no division by a); a loss on A alone or Bc alone gives the reference gradients."""
    a, b = _inputs((2, 30, 2), torch.float64)
    a[:, 5] = 0.0
    a[1, 17, 1] = 0.0
    a.requires_grad_(True)
    b.requires_grad_(True)
    with strategy(name):
        A, Bc = linear.linear_scan_fwd(a, b)
        A64, Bc64 = linear_scan_ref(a, b)
        for out, out64 in ((A, A64), (Bc, Bc64)):
            g = torch.autograd.grad(out.sum(), (a, b), allow_unused=True, retain_graph=True)
            g64 = torch.autograd.grad(out64.sum(), (a, b), allow_unused=True, retain_graph=True)
            for x, x64 in zip(g, g64, strict=True):
                x = torch.zeros_like(a) if x is None else x
                x64 = torch.zeros_like(a) if x64 is None else x64
                assert torch.isfinite(x).all()
                assert_close(x, x64, torch.float64, 30, "grad")


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_interpreter)
def test_reverse_time_kernels(name: str) -> None:
    """The kernels' reverse direction equals the forward scan of time-flipped inputs, forward and adjoint."""
    a, b = _inputs((2, 29, 2), torch.float64)
    h0 = torch.randn(2, 2, dtype=torch.float64)
    with strategy(name):
        _, h = linear.scan_forward(a, b, h0, 1, False, reverse=True)
        expected = linear_recurrence(a.flip(1), b.flip(1), h0).flip(1)
        assert_close(h, expected, torch.float64, 29, "h")
        gh = torch.randn_like(h)
        da, db, dh0 = linear.scan_backward(a, gh, None, h, h0, None, 1, True, reverse=True)
        leaves = [x.clone().requires_grad_(True) for x in (a, b, h0)]
        out = linear_recurrence(leaves[0].flip(1), leaves[1].flip(1), leaves[2]).flip(1)
        expected_grads = torch.autograd.grad(out, leaves, gh)
    for got, want, what in zip((da, db, dh0), expected_grads, ("da", "db", "dh0"), strict=True):
        assert_close(got, want, torch.float64, 29, what)


@pytest.mark.parametrize("every", [3, 21])
@marked(on_interpreter)
def test_lookback_combines_summaries(every: int) -> None:
    """Tiles that publish no final state: the look-back replays the summaries after the nearest one that
    did (up to 20 of them, several replay steps), and gets the same bits as when every tile publishes."""
    with _launch.sparse_final_states(every), linear.force_strategy("lookback", None, 2):
        _check_recurrence((2, 60, 3), torch.float64)
    a, b = _inputs((1, 60, 2), torch.float32)
    h0 = torch.randn(1, 2).to(a.device)
    gh = torch.randn_like(b)
    runs = []
    for sparse in (1, every):
        with _launch.sparse_final_states(sparse), linear.force_strategy("lookback", None, 2):
            h = linear.linear_recurrence_fwd(a, b, h0)
            runs.append((h, *linear.linear_recurrence_bwd(a, h0, h, gh)))
    for x, y in zip(*runs, strict=True):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="every must be >= 1, got 0"), _launch.sparse_final_states(0):
        pass


@pytest.mark.parametrize("every", [1, 4])
@marked(on_interpreter)
def test_segments_combine_summaries_on_a_persistent_grid(every: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment kernel, forward and reversed: segments that publish no final state make the look-back
    replay the summaries in between; a persistent grid (two programs taking all the segments) and one
    program per segment give the same bits, and the plan's segment is whole tiles."""
    with linear.force_strategy("segment", 6, 4):
        plan = linear.scan_plan(1, 50, 70, 1, 4, max_block_t=64, single_pass=True)
        assert (plan.strategy, plan.chunk, plan.num_chunks, plan.block_t, plan.num_jblocks) == (
            "segment", 8, 7, 4, 3)  # fmt: skip
        assert linear.scan_plan(1, 50, 70, 1, 4, single_pass=True, backward=True).strategy != "segment"
        assert linear.scan_plan(1, 50, 70, 1, 4, single_pass=False).strategy != "segment"
    a, b = _inputs((2, 50, 70), torch.float32)
    h0 = torch.randn(2, 70, dtype=torch.float64).to(a.device, a.dtype)
    ref = linear_recurrence(a.double(), b.double(), h0.double())
    ref_rev = linear_recurrence(a.double().flip(1), b.double().flip(1), h0.double()).flip(1)
    runs = []
    for sms in (132, 1):
        monkeypatch.setattr(linear, "num_sms", lambda device, sms=sms: sms)
        with _launch.sparse_final_states(every), linear.force_strategy("segment", 8, 4):
            h = linear.linear_recurrence_fwd(a, b, h0)
            h_rev = linear.scan_forward(a, b, h0, 1, False, reverse=True)[1]
        assert_close(h, ref, torch.float32, 50, f"every {every}, {sms} SMs")
        assert_close(h_rev, ref_rev, torch.float32, 50, f"reversed, every {every}, {sms} SMs")
        runs.append((h, h_rev))
    for x, y in zip(*runs, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("columns", [0, 2])
@marked(on_interpreter)
def test_pipelined_tiles_fold_or_not(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every walk tile with channels per thread (the carry folded into a tile's first step) or without (the
    carry applied after the tile's scan), for the recurrence and the running product, both directions:
    the heuristic picks only some of these pairings (the running product's adjoint never folds)."""
    monkeypatch.setattr(linear, "_pipelined_tile", lambda *args: (8, 4, 1, 2, columns))
    linear._cached_plan.cache_clear()
    try:
        with linear.force_strategy("pipelined"):
            plan = linear.scan_plan(1, 37, 10, 1, 4, max_block_t=64, pipelined=True, backward=True)
            assert (plan.strategy, plan.block_j, plan.block_t, plan.columns) == ("pipelined", 8, 4, columns)
            _check_scan((2, 37, 10), torch.float32)
            _check_recurrence((2, 37, 10), torch.float32)
    finally:
        linear._cached_plan.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@marked(on_interpreter)
def test_pipelined_heuristic_tiles(dtype: torch.dtype) -> None:
    """The pipelined walk with the heuristic's own tiles (no forced steps): forward 64 channels (the second
    block mostly masked) x 32 steps (64 for 2-byte types; float32, whose 16-channel chains here fit in one
    wave, 16 x 128, 16 x 64 off CUDA, five full channel blocks) with two channels per thread and the carry
    folded into a tile's first step; backward 32 x 64 for float32 (4 stages; its chains of 32 channels fit
    in one wave) and 2-byte types (3 stages), float64 64 x 64; four tiles per row of 64 steps, seven of 32,
    the last partial. The same forward for the running product (A, Bc); its adjoint's 32 x 64 tiles (float32
    with the carry folded and 4 stages: its chains of 32 channels fit in one wave) leave the third channel
    block mostly masked."""
    shape = (1, 200, 80)
    itemsize = torch.empty((), dtype=dtype).element_size()
    with linear.force_strategy("pipelined"):
        fwd = linear.scan_plan(*shape, 1, itemsize, max_block_t=64, single_pass=True, pipelined=True)
        bwd = linear.scan_plan(
            *shape, 1, itemsize, max_block_t=64, single_pass=True, pipelined=True, backward=True
        )
        steps = 64 if itemsize == 2 else 32
        fwd_tile = (16, 64) if itemsize == 4 else (64, steps)  # float32: 5 chains of 16 channels
        assert (fwd.strategy, fwd.block_j, fwd.block_t, fwd.num_warps, fwd.num_stages, fwd.columns) == (
            "pipelined", *fwd_tile, 1, 4, 2)  # fmt: skip
        bwd_tile = (32, 64, 4, 0) if itemsize == 4 else (32 if itemsize == 2 else 64, 64, 3, 0)
        assert (bwd.strategy, bwd.block_j, bwd.block_t, bwd.num_stages, bwd.columns) == (
            "pipelined", *bwd_tile)  # fmt: skip
        _check_recurrence(shape, dtype)
        # the running product: the same forward tiles; backward 32 channels x 64 steps, the carry folded in
        # float32 (4 stages)
        xf = linear.scan_plan(*shape, 1, itemsize, max_block_t=64, pipelined=True)
        xb = linear.scan_plan(*shape, 1, itemsize, max_block_t=64, pipelined=True, backward=True)
        assert (xf.strategy, xf.block_j, xf.block_t, xf.num_warps, xf.columns) == (
            "pipelined", *fwd_tile, 1, 2)  # fmt: skip
        x_tile = (32, 64, 4, 4) if itemsize == 4 else (32, 64, 3, 0)
        assert (xb.strategy, xb.block_j, xb.block_t, xb.num_warps, xb.num_stages, xb.columns) == (
            "pipelined", *x_tile[:2], 4, *x_tile[2:])  # fmt: skip
        _check_scan(shape, dtype)


@pytest.mark.parametrize(
    ("sms", "fwd_tile", "bwd_tile"), [(1, (64, 32), (64, 32, 4)), (5, (64, 32), (64, 64, 3))]
)  # the running product's adjoint: 32 x 32 tiles (one SM), 64 x 64 (five), the carry folded in
@marked(on_interpreter)
def test_pipelined_float32_tiles_on_many_chains(
    sms: int, fwd_tile: tuple[int, int], bwd_tile: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float32 recurrence's walk tiles where its chains outnumber the SMs (here made few): forward 64 x 32
    on one warp; adjoint 64 x 32 on 4 stages from 7/8 of the SMs' worth of 64-channel chains (4 chains for
    one SM), 64 x 64 on 3 stages below (4 for five SMs, whose 6 chains of 32 channels make two waves). The
    adjoint with the running product: 32 x 32 from 7/8, 64 x 64 below, both on 3 stages."""
    monkeypatch.setattr(linear, "num_sms", lambda device: sms)
    shape = (2, 200, 80)
    with linear.force_strategy("pipelined"):
        fwd = linear._plan_for(torch.empty(shape), 1, single_pass=True, pipelined=True)
        bwd = linear._plan_for(torch.empty(shape), 1, single_pass=True, pipelined=True, backward=True)
        assert (fwd.strategy, fwd.block_j, fwd.block_t, fwd.num_warps) == ("pipelined", *fwd_tile, 1)
        assert (bwd.strategy, bwd.block_j, bwd.block_t, bwd.num_stages) == ("pipelined", *bwd_tile)
        xb = linear._plan_for(torch.empty(shape), 1, pipelined=True, backward=True)
        x_tile = (32, 32) if sms == 1 else (64, 64)
        assert (xb.strategy, xb.block_j, xb.block_t, xb.num_stages, xb.columns) == (
            "pipelined", *x_tile, 3, 4)  # fmt: skip
        _check_recurrence(shape, torch.float32)
        _check_scan(shape, torch.float32)


@pytest.mark.parametrize(
    ("dtype", "tile"),
    [(torch.float32, (32, 64, 4)), (torch.bfloat16, (16, 64, 4)), (torch.float64, (64, 16, 1))],
    ids=str,
)
@marked(on_interpreter)
def test_lookback_heuristic_tiles(dtype: torch.dtype, tile: tuple[int, int, int]) -> None:
    """The single pass with the heuristic's own tile (no forced steps) on a few-chains shape: 32 channels
    (16 for 2-byte types; the last block partly masked) x 64 steps off CUDA (128-256 on CUDA), four warps,
    four tiles per row, the last partial; float64 keeps 64 x 16 tiles."""
    shape = (1, 200, 40)
    itemsize = torch.empty((), dtype=dtype).element_size()
    with linear.force_strategy("lookback"):
        plan = linear.scan_plan(*shape, 1, itemsize, max_block_t=64, single_pass=True)
        assert (plan.strategy, plan.block_j, plan.block_t, plan.num_warps) == ("lookback", *tile)
        assert plan.num_chunks == -(-200 // tile[1])
        _check_recurrence(shape, dtype)


@marked(on_interpreter)
def test_envelope_and_input_errors() -> None:
    a, b = _inputs((2, 4, 3), torch.float32)
    assert linear.linear_envelope(a, b) is None
    empty = a[:, :0]
    assert linear.linear_envelope(empty, empty) == "T must be >= 1 for the linear kernel, got T=0"
    with pytest.raises(ValueError, match="T must be >= 1 for the linear kernel, got T=0"):
        linear.linear_scan_fwd(empty, empty)
    with pytest.raises(
        ValueError, match=r"b must have shape like a \(B, T, D\) = \(2, 4, 3\), got \(2, 4, 2\)"
    ):
        linear.linear_scan_fwd(a, b[..., :2])
    with pytest.raises(TypeError, match="b must have the same dtype as a"):
        linear.linear_scan_fwd(a, b.double())
    with pytest.raises(ValueError, match=r"h0 must have shape \(B, D\) = \(2, 3\), got \(2, 4\)"):
        linear.linear_recurrence_fwd(a, b, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="a must have 3 dims"):
        linear.linear_scan_fwd(a[0], b[0])
    with pytest.raises(ValueError, match="strategy must be"), linear.force_strategy("parallel"):
        pass


def test_host_helpers_match_triton() -> None:
    """The plans' plain-Python cdiv/next_pow2 give triton.cdiv/next_power_of_2's answers for n >= 1."""
    import triton

    from mingru_triton._launch import cdiv, next_pow2

    for n in [*range(1, 300), 2**20 - 1, 2**20, 2**20 + 1, 2**31 + 5]:
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 7, 16, 132, 528):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)
    assert cdiv(0, 7) == 0


def test_strategy_heuristic() -> None:
    """Single pass for enough rows x channel blocks and long T where no running product is needed;
    otherwise sequential when rows x channel blocks fill the GPU or T is short, chunked for long T and few
    rows."""
    assert linear._strategy(64, 4096, 1024, 1, 4) == "sequential"
    assert linear._strategy(1, 1000, 16, 1, 4) == "sequential"
    assert linear._strategy(1, 1 << 20, 16, 1, 4) == "chunked"
    plan = linear.scan_plan(1, 1 << 20, 256, 1, 2)
    assert plan.strategy == "chunked" and (plan.block_j, plan.block_t, plan.num_warps) == (32, 64, 4)
    assert plan.chunk >= 1024 and plan.num_chunks * plan.num_jblocks >= 4 * 132
    # the running product's forward: one warp from 32 chains of 32 channels (not backward), with chunks of
    # at least 128 steps, the longest that still give 32 x SMs programs
    chunked = linear.scan_plan(1, 1 << 16, 1024, 1, 2)
    assert (chunked.strategy, chunked.block_j, chunked.block_t, chunked.num_warps) == ("chunked", 32, 64, 1)
    assert (chunked.chunk, chunked.num_chunks) == (256, 256)  # 32 x 256 programs >= 32 x 132
    assert linear.scan_plan(1, 1 << 20, 1024, 1, 2).chunk == 4096
    assert linear.scan_plan(1, 4096, 1024, 1, 2).chunk == 128  # the shortest
    backward = linear.scan_plan(1, 1 << 16, 1024, 1, 2, backward=True)
    assert (backward.num_warps, backward.chunk) == (4, 2048)  # 32 x 32 programs >= 4 x 132
    four = linear.scan_plan(1, 1 << 16, 992, 1, 2)  # 31 chains
    assert (four.num_warps, four.chunk) == (4, 2048)
    # k = 1 with enough rows x channels: narrow single-warp tiles of 2048 elements, 32-byte rows
    for itemsize, block_j in ((4, 8), (2, 16), (8, 8)):
        plan = linear.scan_plan(8, 16384, 1024, 1, itemsize)
        assert plan.strategy == "sequential" and plan.num_warps == 1
        assert (plan.block_j, plan.block_t) == (block_j, 2048 // block_j)
    assert linear.scan_plan(1, 8192, 2048, 1, 4).strategy == "chunked"  # 256 narrow programs < 2 x 132

    # the single-pass kernel, for scans without a running product: (channels, steps, warps) per tile
    def tile(
        rows: int, length: int, dj: int, itemsize: int, backward: bool = False
    ) -> tuple[str, int, int, int]:
        plan = linear.scan_plan(rows, length, dj, 1, itemsize, single_pass=True, backward=backward)
        if plan.strategy == "lookback":
            assert plan.num_chunks == -(-length // plan.block_t)
            assert plan.num_jblocks == -(-dj // plan.block_j)
        return plan.strategy, plan.block_j, plan.block_t, plan.num_warps

    assert tile(8, 16384, 1024, 4) == ("lookback", 128, 16, 1)  # 64 chains of 128 channels
    assert tile(8, 16384, 1024, 2) == ("lookback", 32, 64, 1)  # 2-byte types: 64 steps forward,
    assert tile(8, 16384, 1024, 2, backward=True) == ("lookback", 32, 32, 1)  # 32 backward
    assert tile(8, 16384, 1024, 8) == ("lookback", 64, 16, 1)
    assert tile(1, 8192, 1024, 8) == ("lookback", 64, 16, 1)  # 16 chains of 64 channels
    assert tile(1, 65536, 512, 8)[0] == "chunked"  # float64: 8 chains of 64 channels
    assert tile(1, 8192, 2048, 4) == ("lookback", 32, 64, 2)  # 16 chains of 128 channels
    assert tile(2, 65536, 1024, 4) == ("lookback", 32, 64, 2)
    assert tile(1, 8192, 2048, 2) == ("lookback", 32, 64, 1)
    assert tile(1, 65536, 256, 4) == ("lookback", 32, 256, 4)  # 8 chains of 32 channels
    assert tile(1, 65535, 256, 4) == ("lookback", 32, 128, 4)  # float32: 256 steps from T = 65536
    assert tile(1, 65536, 512, 2) == ("lookback", 16, 256, 4)  # 16 (16 channels wide)
    assert tile(1, 65536, 544, 2) == ("lookback", 32, 64, 1)  # 17
    assert tile(1, 65536, 224, 4)[0] == "chunked"  # 7 chains
    assert tile(7, 4096, 32, 4)[0] == "chunked"
    assert tile(8, 2048, 32, 4) == ("lookback", 32, 128, 4)
    assert tile(8, 2048, 1024, 2)[0] == "lookback"
    assert tile(8, 4096, 5, 4) == ("lookback", 8, 128, 4)  # block_j <= next_pow2(D)
    assert linear.scan_plan(1, 65536, 256, 1, 4, max_block_t=64, single_pass=True).block_t == 64  # CPU
    assert linear.scan_plan(8, 1024, 1024, 1, 4, single_pass=True).strategy == "lookback"
    assert linear.scan_plan(8, 1023, 1024, 1, 4, single_pass=True).strategy == "sequential"  # short T
    assert linear.scan_plan(8, 16384, 1024, 4, 4, single_pass=True).strategy == "sequential"  # v > 1
    assert linear.scan_plan(1, 8, 3, 1, 4)[1:5] == (256, 4, 1, 1)  # block_j <= next_pow2(D)
    assert linear.scan_plan(8, 16384, 1024, 1, 4, max_block_t=64).block_t == 64  # CPU tensors
    diag = linear.scan_plan(4, 100, 8, 48, 4)
    assert (diag.block_v, diag.block_j) == (64, 1)
    assert diag.block_t * diag.block_j * diag.block_v <= 4096


def test_pipelined_heuristic() -> None:
    """The pipelined walk, for the callers that can run it (the k = 1 scans with or without the running
    product and their adjoints, not the log scan's single pass): from 7/8 of the SMs' worth of 64-channel
    chains (the recurrence's forward and its float32 adjoint from 7/16, the running product's forward and
    adjoint from 3/16), T >= 1024, 2- and 4-byte types; (channels, steps, warps, stages, channels per
    thread) per direction."""

    def walk(
        rows: int,
        length: int,
        dj: int,
        itemsize: int,
        backward: bool = False,
        sms: int = 132,
        x: bool = False,
    ) -> tuple:
        plan = linear.scan_plan(
            rows, length, dj, 1, itemsize, sms, single_pass=not x, pipelined=True, backward=backward
        )
        if plan.strategy != "pipelined":
            return (plan.strategy,)
        assert (plan.num_chunks, plan.chunk, plan.num_jblocks) == (1, length, -(-dj // plan.block_j))
        return plan.strategy, plan.block_j, plan.block_t, plan.num_warps, plan.num_stages, plan.columns

    assert walk(8, 4096, 1024, 4) == ("pipelined", 64, 32, 1, 4, 2)  # 128 chains for 132 SMs
    assert walk(8, 4096, 1024, 2) == ("pipelined", 64, 64, 1, 4, 2)
    for itemsize in (4, 2):
        assert walk(8, 1024, 1024, itemsize)[0] == "pipelined"
    assert walk(8, 4096, 1024, 4, backward=True) == ("pipelined", 64, 32, 4, 4, 0)
    assert walk(8, 4096, 1024, 2, backward=True) == ("pipelined", 32, 64, 4, 3, 0)  # 256 chains of 32 <= 264
    assert walk(16, 4096, 1024, 2, backward=True) == ("pipelined", 64, 64, 4, 3, 0)  # 512 > 264
    assert walk(8, 2048, 1030, 2, backward=True)[1] == 32  # 8 x 33 = 264 chains of 32 channels
    assert walk(8, 2048, 1060, 2, backward=True)[1] == 64  # 8 x 34 = 272
    assert walk(116, 4096, 64, 2, backward=True)[0] == "pipelined"  # 116 >= 7/8 of 132 = 115.5
    assert walk(115, 4096, 64, 2, backward=True) == ("lookback",)
    # the float32 recurrence's adjoint: 32 x 64 from 7/16 of 132 = 57.75 chains while chains of 32 fit in
    # one wave; with more, 64 x 64 on 3 stages from 3/4 of 132 = 99 chains, 64 x 32 on 4 from 7/8
    assert walk(116, 4096, 64, 4, backward=True) == ("pipelined", 64, 32, 4, 4, 0)
    assert walk(115, 4096, 64, 4, backward=True) == ("pipelined", 64, 64, 4, 3, 0)
    assert walk(7, 16384, 1024, 4, backward=True) == ("pipelined", 64, 64, 4, 3, 0)
    assert walk(99, 4096, 64, 4, backward=True) == ("pipelined", 64, 64, 4, 3, 0)
    assert walk(98, 4096, 64, 4, backward=True) == ("lookback",)
    assert walk(6, 4096, 1024, 4, backward=True) == ("lookback",)  # 96 chains, 192 of 32
    assert walk(5, 4096, 1024, 4, backward=True) == ("lookback",)
    assert walk(4, 4096, 1024, 4, backward=True) == ("pipelined", 32, 64, 4, 4, 0)  # 128 chains of 32
    assert walk(58, 4096, 64, 4, backward=True) == ("pipelined", 32, 64, 4, 4, 0)  # 116 chains of 32
    assert walk(57, 4096, 64, 4, backward=True) == ("lookback",)
    assert walk(3, 4096, 1024, 4, backward=True) == ("lookback",)  # 48 chains
    assert walk(6, 4096, 1024, 2, backward=True) == ("lookback",)  # 96 chains
    assert walk(128, 4096, 16, 4)[1] == 16  # block_j <= next_pow2(D)
    # the recurrence's forward from 7/16 of 132 = 57.75 chains; float32 takes 32-channel programs while
    # they number at most the SMs, 16-channel programs of 128 steps while those do
    assert walk(58, 4096, 64, 2) == ("pipelined", 64, 64, 1, 4, 2)
    assert walk(57, 4096, 64, 2) == ("lookback",)
    assert walk(3, 4096, 1024, 4) == ("lookback",)  # 48 chains
    assert walk(4, 4096, 1024, 4) == ("pipelined", 32, 64, 1, 4, 2)  # 128 chains of 32 channels
    assert walk(4, 4096, 1024, 2) == ("pipelined", 64, 64, 1, 4, 2)
    assert walk(5, 4096, 1024, 4) == ("pipelined", 64, 32, 1, 4, 2)  # 160 chains of 32 channels > 132
    assert walk(116, 4096, 64, 4) == ("pipelined", 64, 32, 1, 4, 2)  # 232 > 132
    assert walk(66, 4096, 32, 4) == ("pipelined", 16, 128, 1, 4, 2)  # 132 chains of 16: one wave
    assert walk(67, 4096, 32, 4) == ("pipelined", 32, 64, 1, 4, 2)  # 134 chains of 16, 67 of 32
    assert walk(66, 4096, 32, 2) == ("pipelined", 32, 64, 1, 4, 2)  # 2-byte types keep their tiles
    assert walk(4, 4096, 1024, 2, backward=True) == ("lookback",)
    assert walk(4, 4096, 1024, 2, backward=True, sms=64)[0] == "pipelined"
    assert walk(8, 1023, 1024, 4) == ("sequential",)  # short T
    assert walk(8, 4096, 1024, 8) == ("lookback",)  # float64: not timed
    assert (
        linear.scan_plan(8, 4096, 1024, 4, 4, single_pass=True, pipelined=True).strategy == "sequential"
    )  # v > 1
    assert linear.scan_plan(8, 4096, 1024, 1, 4, single_pass=True).strategy == "lookback"  # the log scan
    assert linear.scan_plan(8, 4096, 1024, 1, 4).strategy == "sequential"  # running product, no walk asked
    # the running product (linear_scan_fwd / _bwd): the forward tiles of the recurrence on one warp; two value
    # columns backward on four warps, float32 with the carry folded into 32 x 32 tiles
    assert walk(8, 4096, 1024, 4, x=True) == ("pipelined", 64, 32, 1, 4, 2)
    assert walk(8, 4096, 1024, 2, x=True) == ("pipelined", 64, 64, 1, 4, 2)
    assert walk(8, 4096, 1024, 4, backward=True, x=True) == ("pipelined", 32, 32, 4, 3, 4)
    assert walk(8, 4096, 1024, 2, backward=True, x=True) == ("pipelined", 32, 64, 4, 3, 0)
    # its forward from 3/16 of 132 = 24.75 chains (no single pass for X), 2-byte types from T = 4096 from
    # 3/8 = 49.5 chains
    assert walk(4, 4096, 1024, 4, x=True) == ("pipelined", 32, 64, 1, 4, 2)  # 128 chains of 32 channels
    assert walk(2, 16384, 1024, 4, x=True) == ("pipelined", 16, 128, 1, 4, 2)  # 128 chains of 16
    assert walk(1, 8192, 2048, 4, x=True) == ("pipelined", 16, 128, 1, 4, 2)
    assert walk(1, 8192, 2112, 4, x=True)[1:3] == (16, 128)  # 132 chains of 16
    assert walk(1, 8192, 2128, 4, x=True)[1:3] == (32, 64)  # 133
    # its adjoint from 3/16 as well; float32 32 x 64 on 4 stages while chains of 32 fit in one wave, 64 x
    # 64 on 3 below 7/8 of 132 = 115.5 chains of 64
    assert walk(2, 16384, 1024, 4, backward=True, x=True) == ("pipelined", 32, 64, 4, 4, 4)
    assert walk(1, 8192, 2048, 4, backward=True, x=True) == ("pipelined", 32, 64, 4, 4, 4)
    assert walk(4, 4096, 1024, 4, backward=True, x=True) == ("pipelined", 32, 64, 4, 4, 4)  # 128 of 32
    assert walk(5, 4096, 1024, 4, backward=True, x=True) == ("pipelined", 64, 64, 4, 3, 4)  # 160 of 32
    assert walk(7, 16384, 1024, 4, backward=True, x=True) == ("pipelined", 64, 64, 4, 3, 4)  # 112 of 64
    assert walk(116, 4096, 64, 4, backward=True, x=True) == ("pipelined", 32, 32, 4, 3, 4)
    assert walk(115, 4096, 64, 4, backward=True, x=True) == ("pipelined", 64, 64, 4, 3, 4)
    assert walk(4, 16384, 1024, 2, backward=True, x=True) == ("pipelined", 32, 64, 4, 3, 0)
    assert walk(25, 4096, 64, 2, backward=True, x=True)[0] == "pipelined"
    assert walk(24, 4096, 64, 2, backward=True, x=True)[0] == "chunked"
    assert walk(1, 65536, 256, 4, backward=True, x=True)[0] == "chunked"  # 4 chains
    assert walk(1, 1023, 8192, 4, backward=True, x=True)[0] == "sequential"  # short T
    assert walk(2, 4095, 1024, 2, x=True) == ("pipelined", 64, 64, 1, 4, 2)
    assert walk(2, 4096, 1024, 2, x=True)[0] == "chunked"
    assert walk(50, 4096, 64, 2, x=True)[0] == "pipelined"
    assert walk(49, 8192, 64, 2, x=True)[0] == "chunked"
    assert walk(25, 4096, 64, 4, x=True)[0] == "pipelined"
    assert walk(24, 4096, 64, 4, x=True)[0] == "chunked"
    assert walk(1, 65536, 1024, 4, x=True)[0] == "chunked"  # 16 chains
    with linear.force_strategy("pipelined"):
        assert linear.scan_plan(8, 4096, 1024, 4, 4, pipelined=True).strategy == "sequential"  # v > 1
        assert walk(1, 8, 3, 8)[:3] == ("pipelined", 4, 32)
        assert walk(1, 8, 3, 4, backward=True, x=True)[:3] == ("pipelined", 4, 64)
    with linear.force_strategy("pipelined", None, 8):
        assert walk(8, 4096, 1024, 4)[2] == 8
    assert (
        linear.scan_plan(8, 4096, 1024, 1, 4, max_block_t=16, single_pass=True, pipelined=True).block_t == 16
    )


def test_split_plan() -> None:
    """The split walk (asked for by the log scan's forwards) where the pipelined walk would run: float32
    eight warps of 16 steps, 3 stages; 2-byte types four warps of 16 steps, 4 stages; 64 channels, two per
    thread. Not for the adjoint, few chains or short T; a forced tile length sets the steps per warp."""

    def split(rows: int, length: int, dj: int, itemsize: int, max_block_t: int = 256, **kw: bool) -> tuple:
        plan = linear.scan_plan(
            rows, length, dj, 1, itemsize, max_block_t=max_block_t, single_pass=True, split=True, **kw
        )
        if plan.strategy != "split":
            return (plan.strategy,)
        assert (plan.num_chunks, plan.chunk, plan.num_jblocks) == (1, length, -(-dj // plan.block_j))
        return plan.strategy, plan.block_j, plan.block_t, plan.num_warps, plan.num_stages, plan.columns

    assert split(8, 4096, 1024, 4) == ("split", 64, 128, 8, 3, 2)
    assert split(8, 4096, 1024, 2) == ("split", 64, 64, 4, 4, 2)
    assert split(8, 4096, 1024, 4, max_block_t=64) == ("split", 64, 64, 8, 3, 2)  # off CUDA: 8 steps each
    assert split(128, 4096, 16, 4)[1] == 16
    assert split(4, 4096, 1024, 4) == ("lookback",)  # 64 chains
    assert split(8, 1023, 1024, 4) == ("sequential",)  # short T
    assert split(8, 4096, 1024, 4, backward=True) == ("lookback",)
    assert split(8, 4096, 1024, 8) == ("lookback",)  # float64: not timed
    with linear.force_strategy("split", None, 4):
        assert split(1, 8, 3, 4) == ("split", 4, 4, 4, 3, 2)  # four warps of one step
        assert split(1, 8, 3, 8)[:3] == ("split", 4, 4)
        assert linear.scan_plan(1, 8, 3, 1, 4, single_pass=True).strategy != "split"  # not asked for
    with linear.force_strategy("split"):
        assert split(8, 4096, 1024, 4, backward=True) == ("lookback",)  # the heuristic's plan


def _split_forward(a: Tensor, b: Tensor, h0: Tensor, block_t: int | None) -> Tensor:
    """The split walk's plain k = 1 forward (no exps), forced, with the heuristic's tile or ``block_t``."""
    with linear.force_strategy("split", None, block_t):
        plan = linear._plan_for(a, 1, single_pass=True, split=True)
    assert plan.strategy == "split"
    h = torch.empty_like(b)
    assert linear._run_split(plan, {"coef": a, "u": b, "init": h0, "hout": h}, HAS_INIT=1) is None
    return h


@pytest.mark.parametrize("block_t", [None, 8], ids=["tile", "t8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@marked(on_interpreter)
def test_split_walk_matches_reference(dtype: torch.dtype, block_t: int | None) -> None:
    """The split walk without exps against the float64 recurrence: 70 steps (two tiles of 64 or nine of
    8, the last partial), 70 channels (a second, mostly masked 64-channel block), T = 1."""
    for shape in ((2, 70, 70), (3, 1, 5)):
        a, b = _inputs(shape, dtype, seed=2)
        h0 = torch.randn(shape[0], shape[2], dtype=torch.float64).to(a.device, dtype)
        h = _split_forward(a, b, h0, block_t)
        assert_close(h, linear_recurrence(a.double(), b.double(), h0.double()), dtype, shape[1], f"{shape}")


# ---------------------------------------------------------------------------------------------------------
# CUDA (real sizes)
# ---------------------------------------------------------------------------------------------------------

CUDA_SHAPES = [
    (8, 4096, 512),
    (4, 5000, 1030),
    (8, 2048, 1030),
    (2, 1 << 16, 257),
    (1, 1 << 20, 16),
    (1, 100_003, 64),
    (1, 4096, 1024),
]
"""(8, 2048, 1030) runs the pipelined walk, for the recurrence and for the running product alike (136 chains
of 64 channels, the last mostly masked; the adjoints of bfloat16 and of the running product on 32-channel
tiles); (8, 4096, 512) and (4, 5000, 1030) (64 and 68 chains) run it for the forwards alone, float32 on
32-channel programs (the last of (4, 5000, 1030) mostly masked); (1, 4096, 1024) (16 chains) the chunked
plan of the running product's forward on one warp (32 chains of 32 channels); the others the single pass or
the sequential and chunked plans."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "B{}-T{}-D{}".format(*s))
@marked(on_cuda)
def test_cuda_scan_matches_reference(shape: tuple[int, int, int], dtype: torch.dtype) -> None:
    _check_scan(shape, dtype)
    _check_recurrence(shape, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@marked(on_cuda)
def test_cuda_split_walk_matches_reference(dtype: torch.dtype) -> None:
    """The split walk's plain k = 1 forward on its own tiles: (8, 4097, 1030) (136 chains of 64 channels,
    the last mostly masked, a last tile of one step) and a forced short tile; same bits over repeated
    calls."""
    a, b = _inputs((8, 4097, 1030), dtype, seed=3)
    h0 = torch.randn(8, 1030, dtype=torch.float64).to(a.device, dtype)
    ref = linear_recurrence(a.double(), b.double(), h0.double())
    for block_t in (None, 16):
        h = _split_forward(a, b, h0, block_t)
        assert_close(h, ref, dtype, 4097, f"block_t {block_t}")
        assert torch.equal(h, _split_forward(a, b, h0, block_t))


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_cuda)
def test_cuda_both_strategies(name: str) -> None:
    with strategy(name):
        _check_scan((4, 3001, 130), torch.float32)
        _check_recurrence((4, 3001, 130), torch.float16)


@pytest.mark.parametrize("name", STRATEGIES)
@marked(on_cuda)
def test_cuda_gradcheck_fp64(name: str) -> None:
    a, b = _inputs((2, 19, 5), torch.float64)
    h0 = torch.randn(2, 5, dtype=torch.float64, device=a.device)
    a, b, h0 = (x.requires_grad_(True) for x in (a, b, h0))
    with linear.force_strategy(name, 4, 2):
        assert torch.autograd.gradcheck(linear.linear_scan_fwd, (a, b))
        assert torch.autograd.gradcheck(linear.linear_recurrence_fwd, (a, b, h0))


@marked(on_cuda)
def test_cuda_lookback_is_repeatable() -> None:
    """The single-pass kernel's results do not depend on which tiles finished first: repeated calls on
    many in-flight tiles (gates near 1, so carries matter) give the same bits, forward and backward."""
    shape = (8, 16384, 1024)
    assert linear.scan_plan(8, 16384, 1024, 1, 4, single_pass=True).strategy == "lookback"
    with linear.force_strategy("lookback"):
        _repeat_recurrence(shape)


def _repeat_recurrence(shape: tuple[int, int, int]) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = 1 - 1e-3 * torch.rand(shape, device="cuda", generator=gen)
    b = torch.randn(shape, device="cuda", generator=gen)
    h0 = torch.randn(shape[0], shape[2], device="cuda", generator=gen)
    gh = torch.randn(shape, device="cuda", generator=gen)
    first = None
    for _ in range(5):
        h = linear.linear_recurrence_fwd(a, b, h0)
        run = (h, *linear.linear_recurrence_bwd(a, h0, h, gh))
        if first is None:
            first = run
        else:
            for x, y in zip(first, run, strict=True):
                assert torch.equal(x, y)


@marked(on_cuda)
def test_cuda_segments_are_repeatable() -> None:
    """The segment kernel on few chains (8 chains of 32 channels, 128 segments on a persistent grid) matches
    the float64 reference and gives the same bits over repeated calls (gates near 1, so carries matter)."""
    with linear.force_strategy("segment"):
        plan = linear._plan_for(torch.empty((1, 65536, 256), device="cuda"), 1, single_pass=True)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        assert plan.strategy == "segment" and plan.num_chunks * plan.num_jblocks > plan.per_sm * sms
        _check_recurrence((1, 65536, 256), torch.float32)
        _repeat_recurrence((1, 65536, 256))


@marked(on_cuda)
def test_cuda_pipelined_plan() -> None:
    """The layers' shape (8, 4096, 1024) takes the pipelined walk in both directions on an H200-sized GPU,
    and the walk's results are the same bits over repeated calls."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if linear.PIPELINED_MIN_FILL * sms > 8 * 16:
        pytest.skip(f"{sms} SMs: 128 chains are too few for the pipelined walk on this GPU")
    for backward in (False, True):
        plan = linear.scan_plan(8, 4096, 1024, 1, 4, sms, single_pass=True, pipelined=True, backward=backward)
        assert plan.strategy == "pipelined"
    _repeat_recurrence((8, 4096, 1024))


@pytest.mark.gpu_memory
@marked(on_cuda)
def test_cuda_more_than_2_31_elements() -> None:
    """B T D > 2^31 (bf16): the last row's last channels match a float64 scan of those channels alone."""
    B, T, D = 2, 1 << 20, 1032
    assert B * T * D > 2**31
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.empty(B, T, D, dtype=torch.bfloat16, device="cuda").uniform_(0.5, 1.0, generator=gen)
    b = torch.empty(B, T, D, dtype=torch.bfloat16, device="cuda").uniform_(-1.0, 1.0, generator=gen)
    A, Bc = linear.linear_scan_fwd(a, b)
    channels = torch.tensor([0, D // 2, D - 2, D - 1], device="cuda")
    A64, Bc64 = linear_scan_ref(a[-1:, :, channels].double(), b[-1:, :, channels].double())
    assert_close(A[-1:, -4096:, channels], A64[:, -4096:], torch.bfloat16, T, "A")
    assert_close(Bc[-1:, -4096:, channels], Bc64[:, -4096:], torch.bfloat16, T, "Bc")
    del A, Bc
    h0 = torch.zeros(B, D, dtype=torch.bfloat16, device="cuda")
    h = linear.linear_recurrence_fwd(a, b, h0)
    assert_close(h[-1:, -4096:, channels], Bc64[:, -4096:], torch.bfloat16, T, "h")
