"""The angle-fused scan kernels (``mingru::angle_scan_fwd`` / ``_bwd``) against the float64 eager reference.

Interpreter tests (CPU tensors, small shapes) cover every strategy (the single pass of R = 1 with look-backs
over unpublished tiles), every flag combination, reflections, random layouts, int32/int64 layouts, bf16,
non-contiguous inputs, gradcheck and the envelope; CUDA tests repeat the comparisons at real sizes, including
one input past 2^31 elements, and check that the single pass repeats its bits.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from kernel_cases import assert_close, gates, on_cuda, on_interpreter
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

from mingru.dispatch import ScanFallback
from mingru.scans.angle import angle_scan_ref, default_angle_layout, validate_angle_layout
from mingru_triton import _launch, angle
from mingru_triton.angle import (
    _pair_tile,
    _plan,
    _strategy,
    _summary_tile,
    angle_envelope,
    angle_scan_bwd,
    angle_scan_fwd,
    force_strategy,
)
from mingru_triton.impls import angle_scan_impl

STRATEGIES = ("sequential", "chunked")
Layout = tuple[Tensor, Tensor, Tensor]


def random_layout(k: int, layers: int, seed: int) -> Layout:
    """A random valid layout: per layer a random fixed-point-free involution, a random angle numbering of
    its pairs and random signs."""
    rng = random.Random(seed)
    perm = torch.empty(layers, k, dtype=torch.int64)
    p2p = torch.empty(layers, k, dtype=torch.int64)
    sgn = torch.empty(layers, k)
    for r in range(layers):
        positions = list(range(k))
        rng.shuffle(positions)
        numbers = list(range(k // 2))
        rng.shuffle(numbers)
        for m in range(k // 2):
            i, j = positions[2 * m], positions[2 * m + 1]
            perm[r, i], perm[r, j] = j, i
            p2p[r, i] = p2p[r, j] = numbers[m]
        sgn[r] = torch.tensor([rng.choice((1.0, -1.0)) for _ in range(k)])
    validate_angle_layout(perm, sgn, p2p)
    return perm, sgn, p2p


def make_inputs(
    batch: int,
    steps: int,
    heads: int,
    k: int,
    layers: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> list[Tensor]:
    """theta, scale, gamma, b, h0 in float64 on ``device`` (cast later); |scale|, gamma in [0.5, 1)."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(batch, steps, heads, layers, k // 2, generator=gen, dtype=torch.float64) * 2
    scale = gates((batch, steps, heads), torch.float64, torch.device("cpu"), generator=gen)
    gamma = gates((batch, steps, heads), torch.float64, torch.device("cpu"), signed=False, generator=gen)
    b = torch.randn(batch, steps, heads, k, generator=gen, dtype=torch.float64)
    h0 = torch.randn(batch, heads, k, generator=gen, dtype=torch.float64)
    return [x.to(device=device, dtype=dtype) for x in (theta, scale, gamma, b, h0)]


def reference(
    inputs: list[Tensor], grad: Tensor, layout: Layout, has_scale: int, has_decay: int
) -> tuple[Tensor, list[Tensor]]:
    """Float64 forward of the reference and the gradients of <h, grad> (zeros for unused inputs)."""
    wide = [x.detach().double().requires_grad_() for x in inputs]
    perm, sgn, p2p = (t.to(wide[0].device) for t in layout)
    h = angle_scan_ref(*wide, perm, sgn, p2p, has_scale=bool(has_scale), has_decay=bool(has_decay))
    grads = torch.autograd.grad(h, wide, grad.double(), allow_unused=True)
    return h.detach(), [torch.zeros_like(x) if g is None else g for x, g in zip(wide, grads, strict=True)]


def run_kernel(
    inputs: list[Tensor], grad: Tensor, layout: Layout, has_scale: int, has_decay: int
) -> tuple[Tensor, list[Tensor]]:
    leaves = [x.detach().requires_grad_() for x in inputs]
    perm, sgn, p2p = (t.to(leaves[0].device) for t in layout)
    h = angle_scan_fwd(*leaves, perm, sgn, p2p, has_scale, has_decay)
    grads = torch.autograd.grad(h, leaves, grad.to(h.dtype))
    return h.detach(), list(grads)


def assert_close_scaled(got: Tensor, want: Tensor, dtype: torch.dtype, steps: int, what: str) -> None:
    """assert_close relative to the reference's largest magnitude (at least 1): states and adjoints grow
    along T without decay, and a float32 sum of such terms is exact only to that magnitude."""
    size = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    assert_close(got / size, want / size, dtype, steps, what)


def check_against_reference(
    inputs: list[Tensor], layout: Layout, has_scale: int, has_decay: int, seed: int = 0
) -> None:
    dtype = inputs[0].dtype
    steps = inputs[3].shape[1]
    grad = torch.randn(inputs[3].shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    grad = grad.to(inputs[0].device)
    if dtype in (torch.float16, torch.bfloat16):
        grad = grad.to(dtype)
    h, grads = run_kernel(inputs, grad, layout, has_scale, has_decay)
    h_ref, grads_ref = reference(inputs, grad, layout, has_scale, has_decay)
    assert h.dtype == dtype
    assert_close_scaled(h, h_ref, dtype, steps, "h")
    for name, got, want, x in zip(
        ("dtheta", "dscale", "dgamma", "db", "dh0"), grads, grads_ref, inputs, strict=True
    ):
        assert got.dtype == dtype and got.shape == x.shape, name
        assert_close_scaled(got, want, dtype, steps, name)


# (k, R, has_scale, has_decay, layout kind, T)
CASES = [
    (2, 1, 1, 1, "default", 37),
    (4, 2, 1, 0, "reflect", 13),
    (6, 3, 0, 1, "random", 13),
    (8, 3, 1, 1, "random", 23),
    (16, 2, 0, 0, "reflect", 13),
    (8, 1, 1, 1, "default", 1),
    (6, 2, 1, 1, "reflect", 1),
]


def layout_for(kind: str, k: int, layers: int, seed: int = 0) -> Layout:
    if kind == "random":
        return random_layout(k, layers, seed)
    return default_angle_layout(k, layers, reflect=kind == "reflect")


def flat_grad(inputs: list[Tensor], layout: Layout, has_scale: int, has_decay: int) -> None:
    """fp64 gradcheck of the kernel op (fast mode under the interpreter)."""
    perm, sgn, p2p = (t.to(inputs[0].device) for t in layout)
    leaves = [x.detach().requires_grad_() for x in inputs]
    fast = inputs[0].device.type == "cpu"
    assert torch.autograd.gradcheck(
        lambda *xs: angle_scan_fwd(*xs, perm, sgn, p2p, has_scale, has_decay), leaves, fast_mode=fast
    )


class TestInterpreted:
    pytestmark = on_interpreter

    @pytest.mark.parametrize("strategy", STRATEGIES)
    @pytest.mark.parametrize(("k", "layers", "has_scale", "has_decay", "kind", "steps"), CASES)
    def test_matches_reference(
        self, k: int, layers: int, has_scale: int, has_decay: int, kind: str, steps: int, strategy: str
    ) -> None:
        inputs = make_inputs(1, steps, 2, k, layers, torch.float32, torch.device("cpu"), seed=k + layers)
        with force_strategy(strategy):
            check_against_reference(inputs, layout_for(kind, k, layers, seed=k), has_scale, has_decay)

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_bf16_inputs(self, strategy: str) -> None:
        inputs = make_inputs(1, 13, 2, 8, 2, torch.bfloat16, torch.device("cpu"), seed=3)
        with force_strategy(strategy):
            check_against_reference(inputs, layout_for("reflect", 8, 2), 1, 1)

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_gradcheck_fp64(self, strategy: str) -> None:
        inputs = make_inputs(1, 3, 2, 4, 2, torch.float64, torch.device("cpu"), seed=5)
        with force_strategy(strategy):
            flat_grad(inputs, random_layout(4, 2, seed=1), 1, 1)

    def test_fp64_is_exact(self) -> None:
        inputs = make_inputs(1, 11, 2, 6, 3, torch.float64, torch.device("cpu"), seed=6)
        check_against_reference(inputs, random_layout(6, 3, seed=2), 1, 0)

    @pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
    def test_layout_dtypes(self, index_dtype: torch.dtype) -> None:
        perm, sgn, p2p = random_layout(8, 2, seed=4)
        layout = (perm.to(index_dtype), sgn.to(torch.float16), p2p.to(index_dtype))
        inputs = make_inputs(1, 9, 2, 8, 2, torch.float32, torch.device("cpu"), seed=7)
        check_against_reference(inputs, layout, 1, 1)

    def test_non_contiguous_inputs(self) -> None:
        inputs = make_inputs(2, 7, 2, 4, 2, torch.float32, torch.device("cpu"), seed=8)
        theta, scale, gamma, b, h0 = inputs
        views = [
            theta.transpose(0, 2).contiguous().transpose(0, 2),
            scale.transpose(1, 2).contiguous().transpose(1, 2),
            torch.stack((gamma, gamma), -1)[..., 0],
            b.transpose(1, 2).contiguous().transpose(1, 2),
            h0.transpose(0, 1).contiguous().transpose(0, 1),
        ]
        assert not any(v.is_contiguous() for v in views)
        check_against_reference(views, layout_for("reflect", 4, 2), 1, 1)

    def test_no_rotation_layers(self) -> None:
        inputs = make_inputs(1, 7, 2, 4, 0, torch.float32, torch.device("cpu"), seed=9)
        check_against_reference(inputs, layout_for("default", 4, 0), 1, 1)

    def test_backward_op_directly(self) -> None:
        inputs = make_inputs(1, 5, 2, 4, 1, torch.float64, torch.device("cpu"), seed=10)
        perm, sgn, p2p = layout_for("default", 4, 1)
        out = angle_scan_fwd(*inputs, perm, sgn, p2p, 0, 1)
        grad = torch.randn_like(out)
        dtheta, dscale, dgamma, db, dh0 = angle_scan_bwd(*inputs, out, grad, perm, sgn, p2p, 0, 1)
        assert torch.equal(dscale, torch.zeros_like(dscale))
        _, grads = reference(inputs, grad, (perm, sgn, p2p), 0, 1)
        for got, want in zip(
            (dtheta, dgamma, db, dh0), (grads[0], grads[2], grads[3], grads[4]), strict=True
        ):
            assert_close(got, want, torch.float64)

    def test_strategy_heuristic(self) -> None:
        cpu = torch.device("cpu")  # counts as 132 SMs
        assert _strategy(8, 4096, 16, 16, 2, cpu) == ("chunked", 64)
        assert _strategy(8, 4096, 16, 32, 4, cpu) == ("chunked", 64)
        assert _strategy(8, 4096, 16, 64, 1, cpu) == ("chunked", 64)
        assert _strategy(8, 4096, 16, 64, 2, cpu)[0] == "sequential"  # k > 32 with R > 1
        assert _strategy(8, 4096, 16, 34, 8, cpu)[0] == "sequential"
        assert _strategy(8, 4096, 16, 66, 1, cpu)[0] == "sequential"  # k > MAX_CHUNKED_K
        assert _strategy(1, 1 << 16, 4, 16, 1, cpu) == ("chunked", 256)  # isqrt(T): 256 chunks of 256
        assert _strategy(132, 4096, 16, 16, 1, cpu)[0] == "sequential"  # 16 rows per SM
        assert _strategy(131, 4096, 16, 16, 1, cpu)[0] == "chunked"
        assert _strategy(1, 127, 4, 16, 1, cpu)[0] == "sequential"  # shorter than two chunks
        assert _strategy(1, 128, 4, 16, 1, cpu) == ("chunked", 64)

    def test_plan(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cpu = torch.device("cpu")
        # (strategy, chunk, vector-path heads, stages, unroll, (summary heads, columns, warps),
        #  (pair-summary heads, warps) for R = 1, steps per pair-loop iteration, steps loaded ahead)
        assert _plan(8, 4096, 16, 8, 1, cpu) == ("chunked", 64, 4, 3, 2, (4, 8, 1), (8, 1), 4, 0)  # k <= 16
        assert _plan(8, 4096, 16, 32, 1, cpu) == ("chunked", 64, 1, 3, 1, (1, 32, 1), (2, 1), 4, 0)  # pairs
        with monkeypatch.context() as patched:  # the vector path at k * R < 64: one stage
            patched.setattr(angle, "PAIR_SUMMARIES", False)
            assert _plan(8, 4096, 16, 32, 1, cpu) == ("chunked", 64, 1, 1, 1, (1, 32, 1), None, 1, 0)
        assert _plan(8, 4096, 16, 32, 2, cpu) == ("chunked", 64, 1, 3, 1, (1, 32, 1), None, 1, 0)
        assert _plan(8, 4096, 16, 16, 4, cpu) == ("chunked", 64, 2, 3, 2, (2, 16, 1), None, 1, 0)
        one_head = ("chunked", 64, 1, 3, 2, (1, 16, 1), None, 1, 0)
        assert _plan(8, 4096, 1, 16, 4, cpu) == one_head  # only one head
        assert _plan(8, 4096, 16, 64, 1, cpu) == ("chunked", 64, 1, 3, 1, (1, 64, 2), (1, 1), 4, 0)
        sequential = ("sequential", 4096, 1, 3, 1, (1, 1, 1), None, 1, 0)
        assert _plan(8, 4096, 16, 64, 2, cpu) == sequential  # pipelined
        assert _plan(8, 4096, 16, 64, 2, cpu, 2) == (*sequential[:-1], 2)  # 2-byte loads two steps ahead
        # pair kernels with 2-byte inputs: half the chunk length up to k = 16, loads a tile ahead up to k = 8
        assert _plan(8, 4096, 16, 16, 1, cpu, 2) == ("chunked", 32, 2, 3, 2, (2, 16, 1), (4, 1), 4, 0)
        assert _plan(8, 4096, 16, 8, 1, cpu, 2) == ("chunked", 32, 4, 3, 2, (4, 8, 1), (8, 1), 4, 1)
        assert _plan(8, 4096, 16, 8, 1, cpu, 4).prefetch == 0
        assert _plan(8, 4096, 16, 32, 1, cpu, 2).chunk == 64
        assert _plan(8, 4096, 16, 16, 2, cpu, 2).chunk == 64
        with force_strategy("chunked"):
            assert _strategy(64, 1 << 16, 16, 64, 4, cpu)[0] == "chunked"
        # the single pass: the pair kernels' heads, a warp per 256 (step, pair) entries of a 16-step tile
        with force_strategy("lookback"):
            assert _plan(8, 4096, 16, 8, 1, cpu) == ("lookback", 16, 8, 1, 1, (1, 1, 1), (8, 2), 1, 0)
            assert _plan(8, 4096, 16, 128, 1, cpu).pairs == (1, 4)
            assert _plan(1, 7, 3, 2, 1, cpu).pairs == (4, 1)
        with pytest.raises(ValueError, match="strategy must be one of"), force_strategy("parallel"):
            pass

    def test_summary_tile(self) -> None:
        # 32 rows per warp: 32 // k heads for k <= 16; columns split where a row would not fit registers
        assert _summary_tile(16, 2, 1) == (16, 2, 1)
        assert _summary_tile(3, 6, 2) == (4, 8, 1)
        assert _summary_tile(16, 32, 8) == (1, 32, 1)
        assert _summary_tile(16, 32, 9) == (1, 16, 1)
        tiles = [_summary_tile(16, 64, r) for r in (1, 2, 3, 4, 16)]
        assert tiles == [(1, 64, 2), (1, 32, 2), (1, 32, 2), (1, 32, 2), (1, 32, 2)]
        assert _summary_tile(16, 128, 1) == (1, 32, 4)

    def test_pair_tile(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # whole heads up to PAIR_TILE pairs, one pair per thread (1 to 4 warps)
        assert [_pair_tile(16, k) for k in (2, 8, 16, 32, 64, 128)] == [
            (16, 1), (8, 1), (4, 1), (2, 1), (1, 1), (1, 2)
        ]  # fmt: skip
        assert _pair_tile(3, 6) == (4, 1)
        assert _pair_tile(40, 2) == (32, 1)
        monkeypatch.setattr(angle, "PAIR_SUMMARIES", False)
        assert _plan(8, 4096, 16, 8, 1, torch.device("cpu")).pairs is None

    @pytest.mark.parametrize(
        ("pairs", "replays", "rows"), [(True, True, 1), (True, True, 8), (True, False, 2), (False, False, 1)]
    )
    @pytest.mark.parametrize(
        ("batch", "heads", "k", "kind", "steps", "has_scale", "has_decay"),
        [
            (1, 3, 6, "random", 23, 1, 1),  # 3 heads in a pair block of 4, 8 lanes for k = 6
            (2, 2, 8, "reflect", 19, 1, 0),
            (1, 5, 2, "random", 30, 0, 1),
            (1, 1, 64, "random", 9, 1, 1),
            (2, 2, 4, "default", 2, 0, 0),
        ],
    )
    def test_one_layer_summaries(
        self,
        monkeypatch: pytest.MonkeyPatch,
        pairs: bool,
        replays: bool,
        rows: int,
        batch: int,
        heads: int,
        k: int,
        kind: str,
        steps: int,
        has_scale: int,
        has_decay: int,
    ) -> None:
        """R = 1, chunked: the pair summaries (2 x 2 blocks) with the pair replays or the vector ones, and the
        dense k x k summaries, all match; the pair loops taking 1, 2 or 8 steps per iteration (chunks of 1 to
        10 steps: whole tiles, partial ones and tiles longer than the chunk)."""
        monkeypatch.setattr(angle, "PAIR_SUMMARIES", pairs)
        monkeypatch.setattr(angle, "PAIR_REPLAYS", replays)
        monkeypatch.setattr(angle, "PAIR_ROWS", rows)
        inputs = make_inputs(batch, steps, heads, k, 1, torch.float32, torch.device("cpu"), seed=k + steps)
        with force_strategy("chunked"):
            plan = _plan(batch, steps, heads, k, 1, torch.device("cpu"))
            assert plan.strategy == "chunked" and (plan.pairs is not None) == pairs
            check_against_reference(inputs, layout_for(kind, k, 1, seed=steps), has_scale, has_decay)

    @pytest.mark.parametrize(("rows", "chunk", "steps"), [(8, 3, 61), (2, 4, 64), (4, 5, 41)])
    def test_one_layer_many_chunks(
        self, monkeypatch: pytest.MonkeyPatch, rows: int, chunk: int, steps: int
    ) -> None:
        """R = 1, chunked with many short chunks (21, 16 and 9 of them), so that the carries walk several
        tiles of chunks, whole and partial; reflections in the layout."""
        monkeypatch.setattr(angle, "PAIR_ROWS", rows)
        monkeypatch.setattr(angle, "sqrt_chunk", lambda steps, least: chunk)
        inputs = make_inputs(2, steps, 3, 8, 1, torch.float32, torch.device("cpu"), seed=steps)
        with force_strategy("chunked"):
            assert _plan(2, steps, 3, 8, 1, torch.device("cpu"))[:2] == ("chunked", chunk)
            check_against_reference(inputs, layout_for("reflect", 8, 1, seed=rows), 1, 1)

    def test_one_layer_summaries_gradcheck_fp64(self) -> None:
        inputs = make_inputs(1, 5, 3, 4, 1, torch.float64, torch.device("cpu"), seed=13)
        with force_strategy("chunked"):
            assert _plan(1, 5, 3, 4, 1, torch.device("cpu")).pairs is not None
            flat_grad(inputs, random_layout(4, 1, seed=5), 1, 1)

    def test_one_layer_summaries_bf16(self) -> None:
        inputs = make_inputs(1, 17, 2, 8, 1, torch.bfloat16, torch.device("cpu"), seed=14)
        with force_strategy("chunked"):
            check_against_reference(inputs, layout_for("random", 8, 1, seed=6), 1, 1)

    @pytest.mark.parametrize(
        ("batch", "heads", "k", "kind", "steps", "has_scale", "has_decay", "sparse"),
        [
            (1, 2, 8, "default", 1, 1, 1, 1),  # one step, one tile
            (2, 3, 6, "random", 37, 1, 1, 1),  # 3 heads in a block of 4, 8 lanes for k = 6
            (1, 2, 4, "reflect", 100, 1, 0, 3),  # the look-back combines the summaries in between
            (1, 5, 2, "default", 64, 0, 1, 2),  # T a multiple of the tile
            (2, 1, 16, "random", 33, 0, 0, 4),
            (1, 1, 64, "random", 40, 1, 1, 2),  # two warps
        ],
    )
    def test_lookback_matches_reference(
        self,
        batch: int,
        heads: int,
        k: int,
        kind: str,
        steps: int,
        has_scale: int,
        has_decay: int,
        sparse: int,
    ) -> None:
        """R = 1 in one pass, forward and adjoint; ``sparse`` > 1 publishes final states on every sparse-th
        tile only, so that tiles walk back over published summaries."""
        inputs = make_inputs(batch, steps, heads, k, 1, torch.float32, torch.device("cpu"), seed=k + steps)
        with force_strategy("lookback"), _launch.sparse_final_states(sparse):
            plan = _plan(batch, steps, heads, k, 1, torch.device("cpu"))
            assert plan.strategy == "lookback" and plan.chunk == angle.LOOKBACK_BLOCK_T
            check_against_reference(inputs, layout_for(kind, k, 1, seed=steps), has_scale, has_decay)

    def test_sequential_prefetch_default(self) -> None:
        """The sequential plan loads SEQUENTIAL_PREFETCH steps ahead for 2-byte inputs only; the chunked
        plan never does."""
        cpu = torch.device("cpu")
        bf16 = _plan(1, 128, 1, 34, 2, cpu, 2)
        assert bf16.strategy == "sequential" and bf16.prefetch == angle.SEQUENTIAL_PREFETCH == 2
        assert _plan(1, 128, 1, 34, 2, cpu, 4).prefetch == 0
        assert _plan(1, 128, 1, 16, 2, cpu, 2)[:2] == ("chunked", 64)
        assert _plan(1, 128, 1, 16, 2, cpu, 2).prefetch == 0
        inputs = make_inputs(1, 70, 1, 34, 2, torch.bfloat16, cpu, seed=20)
        check_against_reference(inputs, layout_for("random", 34, 2, seed=9), 1, 1)

    @pytest.mark.parametrize("prefetch", [0, 1, 2])
    @pytest.mark.parametrize(("steps", "has_scale", "has_decay"), [(1, 1, 1), (2, 0, 1), (37, 1, 0)])
    def test_sequential_prefetch(
        self, monkeypatch: pytest.MonkeyPatch, prefetch: int, steps: int, has_scale: int, has_decay: int
    ) -> None:
        """The sequential vector path with its loads 0, 1 or 2 steps ahead, forward and adjoint, T down to
        below the distance (the loads past either end masked)."""
        monkeypatch.setattr(angle, "SEQUENTIAL_PREFETCH", prefetch)
        cpu = torch.device("cpu")
        with force_strategy("sequential"):
            assert _plan(2, steps, 3, 6, 2, cpu, 2).prefetch == prefetch
            inputs = make_inputs(2, steps, 3, 6, 2, torch.bfloat16, cpu, seed=30 + steps)
            check_against_reference(inputs, layout_for("random", 6, 2, seed=3), has_scale, has_decay)

    @pytest.mark.parametrize("prefetch", [0, 1])
    @pytest.mark.parametrize(
        ("steps", "k", "has_scale", "has_decay"), [(2, 6, 1, 1), (9, 8, 0, 1), (37, 6, 1, 0), (64, 8, 1, 1)]
    )
    def test_pair_prefetch(
        self,
        monkeypatch: pytest.MonkeyPatch,
        prefetch: int,
        steps: int,
        k: int,
        has_scale: int,
        has_decay: int,
    ) -> None:
        """The R = 1 pair kernels with 2-byte inputs, their loads a tile (a step for the adjoint) ahead or
        not, forward and adjoint: chunks with whole tiles and a partial one, and with none whole."""
        monkeypatch.setattr(angle, "PAIR_PREFETCH_MAX_K", 8 if prefetch else 0)
        cpu = torch.device("cpu")
        with force_strategy("chunked"):
            plan = _plan(2, steps, 3, k, 1, cpu, 2)
            assert plan.pairs is not None and plan.prefetch == prefetch
            assert _plan(2, steps, 3, k, 1, cpu, 4).prefetch == 0
            inputs = make_inputs(2, steps, 3, k, 1, torch.bfloat16, cpu, seed=40 + steps)
            check_against_reference(inputs, layout_for("random", k, 1, seed=steps), has_scale, has_decay)

    def test_lookback_bf16_fp64_and_strided(self) -> None:
        inputs = make_inputs(1, 41, 2, 8, 1, torch.bfloat16, torch.device("cpu"), seed=15)
        with force_strategy("lookback"), _launch.sparse_final_states(2):
            check_against_reference(inputs, layout_for("random", 8, 1, seed=7), 1, 1)
            wide = make_inputs(1, 35, 3, 4, 1, torch.float64, torch.device("cpu"), seed=16)
            check_against_reference(wide, random_layout(4, 1, seed=8), 1, 1)
            wide = make_inputs(1, 19, 2, 4, 1, torch.float64, torch.device("cpu"), seed=17)
            flat_grad(wide, layout_for("reflect", 4, 1), 1, 1)
            theta, scale, gamma, b, h0 = make_inputs(2, 21, 2, 4, 1, torch.float32, torch.device("cpu"), 18)
            views = [
                theta.transpose(0, 2).contiguous().transpose(0, 2),
                scale.transpose(1, 2).contiguous().transpose(1, 2),
                torch.stack((gamma, gamma), -1)[..., 0],
                b.transpose(1, 2).contiguous().transpose(1, 2),
                h0.transpose(0, 1).contiguous().transpose(0, 1),
            ]
            check_against_reference(views, layout_for("default", 4, 1), 1, 1)

    def test_lookback_takes_one_layer(self) -> None:
        inputs = make_inputs(1, 20, 2, 4, 2, torch.float32, torch.device("cpu"), seed=19)
        match = "the lookback strategy runs one rotation layer only \\(R = 1\\), got R=2"
        with force_strategy("lookback"), pytest.raises(ValueError, match=match):
            angle_scan_fwd(*inputs, *layout_for("default", 4, 2), 1, 1)

    @pytest.mark.parametrize(("heads", "k", "layers"), [(3, 6, 2), (1, 64, 2), (1, 64, 4)])
    def test_summary_tiles_match_reference(self, heads: int, k: int, layers: int) -> None:
        """Summary programs with masked heads (3 heads in a block of 4) or split columns (k = 64)."""
        inputs = make_inputs(1, 9, heads, k, layers, torch.float32, torch.device("cpu"), seed=11)
        tile = _summary_tile(heads, k, layers)
        assert tile[0] > heads or tile[1] < k
        with force_strategy("chunked"):
            check_against_reference(inputs, layout_for("random", k, layers, seed=3), 1, 1)

    def test_envelope(self) -> None:
        meta = torch.device("meta")
        theta = torch.empty(1, 2, 1, 2, 65, device=meta)
        assert angle_envelope(theta, torch.empty(1, 2, 1, 130, device=meta)) == (
            "k must be <= 128 for the angle kernel, got k=130"
        )
        theta = torch.empty(1, 2, 1, 17, 2, device=meta)
        assert angle_envelope(theta, torch.empty(1, 2, 1, 4, device=meta)) == (
            "R (rotation layers) must be <= 16 for the angle kernel, got R=17"
        )
        assert (
            angle_envelope(torch.empty(1, 2, 1, 4, 64, device=meta), torch.empty(1, 2, 1, 128, device=meta))
            is None
        )

    def test_outside_the_envelope_raises(self) -> None:
        inputs = make_inputs(1, 2, 1, 130, 1, torch.float32, torch.device("cpu"), seed=11)
        with pytest.raises(ValueError, match="k must be <= 128 for the angle kernel, got k=130"):
            angle_scan_fwd(*inputs, *default_angle_layout(130, 1), 1, 1)

    def test_bad_inputs_raise(self) -> None:
        inputs = make_inputs(1, 3, 2, 4, 1, torch.float32, torch.device("cpu"), seed=12)
        layout = default_angle_layout(4, 1)
        with pytest.raises(ValueError, match="h0 must have shape"):
            angle_scan_fwd(*inputs[:4], inputs[4][:, :1], *layout, 1, 1)
        with pytest.raises(TypeError, match="gamma must have the same dtype as b"):
            angle_scan_fwd(*inputs[:2], inputs[2].double(), *inputs[3:], *layout, 1, 1)
        out = angle_scan_fwd(*inputs, *layout, 1, 1)
        with pytest.raises(ValueError, match="grad_out must match b"):
            angle_scan_bwd(*inputs, out, out[:, :1], *layout, 1, 1)


def _op_and_eager(
    inputs: list[Tensor], layout: Layout, has_scale: int, has_decay: int
) -> tuple[list[Tensor], list[Tensor], Any]:
    """(h and the five input grads) through the op and through the layers' entry point
    (``angle_scan_impl``: checks, then :func:`mingru_triton.angle.scan`), and the latter's graph node."""
    perm, sgn, p2p = (t.to(inputs[0].device) for t in layout)
    grad = torch.linspace(-1.0, 1.0, inputs[3].numel(), dtype=torch.float64).reshape(inputs[3].shape)
    results = []
    node = None
    for path in ("op", "eager"):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        if path == "op":
            h = angle_scan_fwd(*leaves, perm, sgn, p2p, has_scale, has_decay)
        else:
            h = angle_scan_impl(*leaves, perm, sgn, p2p, has_scale=has_scale, has_decay=has_decay)
            node = h.grad_fn
        results.append([h.detach(), *torch.autograd.grad(h, leaves, grad.to(h))])
    return results[0], results[1], node


class TestEagerPath:
    """The layers' entry point runs the op's bodies in a ``torch.autograd.Function`` (no ``torch.library``
    dispatch), with the op's bits."""

    pytestmark = on_interpreter

    @pytest.mark.parametrize("strategy", STRATEGIES)
    @pytest.mark.parametrize("layers", [1, 2])
    @pytest.mark.parametrize(("has_scale", "has_decay"), [(1, 1), (1, 0), (0, 1), (0, 0)])
    def test_gives_the_ops_bits(self, strategy: str, layers: int, has_scale: int, has_decay: int) -> None:
        inputs = make_inputs(2, 29, 3, 8, layers, torch.float32, torch.device("cpu"), seed=layers)
        with force_strategy(strategy):
            want, got, node = _op_and_eager(inputs, random_layout(8, layers, seed=1), has_scale, has_decay)
        name = f"AngleScan{'Scale' if has_scale else ''}{'Decay' if has_decay else ''}Backward"
        assert type(node).__name__ == name
        for what, g, w in zip(("h", "dtheta", "dscale", "dgamma", "db", "dh0"), got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w), what

    def test_lookback_gives_the_ops_bits(self) -> None:
        inputs = make_inputs(2, 29, 3, 8, 1, torch.float32, torch.device("cpu"), seed=4)
        with force_strategy("lookback"):
            want, got, _ = _op_and_eager(inputs, random_layout(8, 1, seed=2), 1, 1)
        for what, g, w in zip(("h", "dtheta", "dscale", "dgamma", "db", "dh0"), got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w), what

    def test_bf16_gives_the_ops_bits(self) -> None:
        inputs = make_inputs(1, 40, 2, 4, 1, torch.bfloat16, torch.device("cpu"), seed=5)
        want, got, _ = _op_and_eager(inputs, layout_for("reflect", 4, 1), 1, 1)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.bfloat16 and torch.equal(g, w)

    def test_without_grad_runs_the_body_alone(self) -> None:
        inputs = make_inputs(1, 17, 2, 6, 2, torch.float32, torch.device("cpu"), seed=6)
        perm, sgn, p2p = layout_for("random", 6, 2)
        want = angle_scan_fwd(*inputs, perm, sgn, p2p, 1, 1)
        leaves = [x.clone().requires_grad_() for x in inputs]
        for args in (inputs, leaves):
            with torch.no_grad():
                got = angle_scan_impl(*args, perm, sgn, p2p, has_scale=1, has_decay=1)
            assert torch.equal(got, want) and got.grad_fn is None and not got.requires_grad
            with torch.inference_mode():
                assert torch.equal(angle_scan_impl(*args, perm, sgn, p2p, has_scale=1, has_decay=1), want)
        got = angle.scan(*inputs, perm, sgn, p2p, 1, 1)
        assert torch.equal(got, want) and got.grad_fn is None

    def test_does_not_keep_b_for_the_backward(self) -> None:
        """The adjoint reads the output, not b: the eager node saves theta, scale, gamma, h0, h and the
        layout (the op's node keeps b too)."""
        inputs = make_inputs(1, 9, 2, 4, 1, torch.float32, torch.device("cpu"), seed=7)
        leaves = [x.clone().requires_grad_() for x in inputs]
        layout = layout_for("default", 4, 1)
        h = angle.scan(*leaves, *layout, 1, 1)
        saved = {t.data_ptr() for t in h.grad_fn.saved_tensors}
        assert leaves[3].data_ptr() not in saved
        assert {leaves[0].data_ptr(), leaves[4].data_ptr(), h.data_ptr()} <= saved

    def test_bad_inputs_fall_back_with_the_reason(self) -> None:
        inputs = make_inputs(1, 9, 2, 4, 1, torch.float32, torch.device("cpu"), seed=8)
        layout = layout_for("default", 4, 1)
        with pytest.raises(ScanFallback, match="h0"):
            angle_scan_impl(*inputs[:4], inputs[4][:, :1], *layout, has_scale=1, has_decay=1)


def test_eager_path_leaves_fake_tensors_to_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under fake CUDA tensors (a dispatch mode) the layers' entry point takes the op, whose launches go
    through ``wrap_triton`` and launch nothing: the eager bodies are not entered; shapes and devices come out
    right (the adjoint op called directly, as autograd would)."""

    def refuse(*args: object) -> None:
        raise AssertionError("the eager path ran under fake tensors")

    monkeypatch.setattr(_launch, "_run_eagerly", refuse)
    with FakeTensorMode():
        theta = torch.empty(2, 512, 4, 1, 4, device="cuda")
        scale, gamma = (torch.empty(2, 512, 4, device="cuda") for _ in range(2))
        b = torch.empty(2, 512, 4, 8, device="cuda")
        h0 = torch.empty(2, 4, 8, device="cuda")
        perm, p2p = (torch.empty(1, 8, dtype=torch.int64, device="cuda") for _ in range(2))
        sgn = torch.empty(1, 8, device="cuda")
        h = angle_scan_impl(theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale=1, has_decay=1)
        assert h.shape == b.shape and h.device.type == "cuda"
        grads = angle_scan_bwd(theta, scale, gamma, b, h0, h, torch.empty_like(h), perm, sgn, p2p, 1, 1)
        assert [g.shape for g in grads] == [x.shape for x in (theta, scale, gamma, b, h0)]


def cuda_inputs(batch: int, steps: int, heads: int, k: int, layers: int, dtype: torch.dtype) -> list[Tensor]:
    return make_inputs(batch, steps, heads, k, layers, dtype, torch.device("cuda"), seed=batch + steps + k)


class TestCuda:
    pytestmark = on_cuda

    @pytest.mark.parametrize("strategy", STRATEGIES)
    @pytest.mark.parametrize(
        ("batch", "steps", "heads", "k", "layers"),
        [
            (8, 1024, 16, 8, 1),
            (4, 2048, 8, 16, 2),
            (2, 777, 8, 32, 4),
            (2, 512, 4, 64, 3),
            (1, 4096, 2, 16, 4),
            (2, 300, 3, 8, 2),
            (2, 1000, 5, 64, 1),
            (3, 3001, 3, 6, 1),
        ],
    )
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_matches_reference(
        self, batch: int, steps: int, heads: int, k: int, layers: int, dtype: torch.dtype, strategy: str
    ) -> None:
        inputs = cuda_inputs(batch, steps, heads, k, layers, dtype)
        with force_strategy(strategy):
            check_against_reference(inputs, random_layout(k, layers, seed=k), 1, 1)

    @pytest.mark.parametrize("layers", [1, 2])
    @pytest.mark.parametrize("steps", [1 << 16, 1 << 18])
    def test_long_sequences_default_strategy(self, steps: int, layers: int) -> None:
        """Long T on the default plan (R = 1: the pair kernels, 256 and 512 chunks)."""
        inputs = cuda_inputs(1, steps, 2, 8, layers, torch.float32)
        check_against_reference(inputs, layout_for("reflect", 8, layers), 1, 1)

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_gradcheck_fp64(self, strategy: str) -> None:
        inputs = cuda_inputs(2, 6, 3, 6, 3, torch.float64)
        with force_strategy(strategy):
            flat_grad(inputs, random_layout(6, 3, seed=3), 1, 1)
            flat_grad(inputs, layout_for("reflect", 6, 3), 0, 1)

    # One chain of 4096 tiles at T = 2^16 with k = 8; k = 32 at T = 2^14. The float64 reference builds k x k
    # matrices per step: at (1, 2^16, 2, 32) its adjoint held 10 GiB and ran out of memory on an 80 GB card
    # beside five other test processes.
    @pytest.mark.parametrize(
        ("batch", "steps", "heads", "k"),
        [
            (8, 1024, 16, 8),
            (8, 4096, 16, 16),
            (2, 1000, 5, 64),
            (3, 3001, 3, 6),
            (1, 1 << 16, 2, 8),
            (1, 1 << 14, 2, 32),
        ],
    )
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_lookback_matches_reference(
        self, batch: int, steps: int, heads: int, k: int, dtype: torch.dtype
    ) -> None:
        """The single pass of R = 1: close to the reference, and the same bits on every call, forward and
        adjoint (the look-back's carry does not depend on which tiles ran first)."""
        inputs = cuda_inputs(batch, steps, heads, k, 1, dtype)
        layout = tuple(t.cuda() for t in random_layout(k, 1, seed=k))
        with force_strategy("lookback"):
            check_against_reference(inputs, random_layout(k, 1, seed=k), 1, 1)
            first = angle_scan_fwd(*inputs, *layout, 1, 1)
            grad = torch.randn_like(first)
            grads = angle_scan_bwd(*inputs, first, grad, *layout, 1, 1)
            for _ in range(3):
                assert torch.equal(angle_scan_fwd(*inputs, *layout, 1, 1), first)
                again = angle_scan_bwd(*inputs, first, grad, *layout, 1, 1)
                assert all(torch.equal(g, w) for g, w in zip(again, grads, strict=True))

    @pytest.mark.parametrize("layers", [2, 4])
    def test_bf16_wide_default_plan(self, layers: int) -> None:
        """bfloat16 at k = 64, R > 1: sequential with the loads two steps ahead, forward and adjoint."""
        plan = _plan(2, 512, 4, 64, layers, torch.device("cuda"), 2)
        assert plan.strategy == "sequential" and plan.prefetch == 2
        check_against_reference(
            cuda_inputs(2, 512, 4, 64, layers, torch.bfloat16), random_layout(64, layers, 5), 1, 1
        )

    def test_lookback_gradcheck_fp64(self) -> None:
        inputs = cuda_inputs(2, 40, 3, 6, 1, torch.float64)
        with force_strategy("lookback"):
            flat_grad(inputs, random_layout(6, 1, seed=4), 1, 1)
            flat_grad(inputs, layout_for("reflect", 6, 1), 0, 1)

    @pytest.mark.gpu_memory
    def test_more_than_2_31_elements(self) -> None:
        """b, h: 2^31 + 2^16 bf16 elements each; the last heads checked against a float64 reference."""
        steps, heads, k = 1 << 17, 2050, 8
        gen = torch.Generator(device="cuda").manual_seed(0)
        theta = torch.randn(1, steps, heads, 1, k // 2, device="cuda", dtype=torch.bfloat16, generator=gen)
        scale = torch.rand(1, steps, heads, device="cuda", generator=gen).mul_(0.5).add_(0.5).bfloat16()
        gamma = torch.ones(1, steps, heads, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(1, steps, heads, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        h0 = torch.randn(1, heads, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        assert b.numel() > 2**31
        perm, sgn, p2p = (t.cuda() for t in layout_for("reflect", k, 1))
        h = angle_scan_fwd(theta, scale, gamma, b, h0, perm, sgn, p2p, 1, 0)
        tail = slice(heads - 2, heads)
        want = angle_scan_ref(
            *(x[:, :, tail].double() for x in (theta, scale, gamma, b)),
            h0[:, tail].double(),
            perm,
            sgn.double(),
            p2p,
            has_scale=True,
            has_decay=False,
        )
        assert_close(h[:, -4096:, tail], want[:, -4096:], torch.bfloat16, what="h (last heads, last steps)")
        del h
        with force_strategy("lookback"):
            h = angle_scan_fwd(theta, scale, gamma, b, h0, perm, sgn, p2p, 1, 0)
        assert_close(h[:, -4096:, tail], want[:, -4096:], torch.bfloat16, what="h (single pass)")
