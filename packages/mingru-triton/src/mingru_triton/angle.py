"""Angle-fused (rotation) scan kernels: ``mingru::angle_scan_fwd`` and ``mingru::angle_scan_bwd``.

Shapes: theta (B, T, n, R, k/2), scale and gamma (B, T, n), b (B, T, n, k), h0 (B, n, k), perm / sgn / p2p
(R, k). Math: h_t = c_t L_t(h_{t-1}) + b_t with c_t = scale_t^[has_scale] gamma_t^[has_decay] and
L_t = L_{R-1} ... L_0, layer r: x~ = sgn[r] * x, y_i = cos x~_i - sin x~_j (i < j = perm[r, i]) and
y_i = sin x~_j + cos x~_i (i > j), angle theta[..., r, p2p[r, i]]. The layers are applied in registers
(partner entries through ``tl.gather``); carries are float32 (float64 for float64 inputs).

Strategies, chosen by :func:`_strategy` from the shapes and the input's element size (tests force one with
:func:`force_strategy`):

- ``"sequential"``: one program per (batch, block of heads) walks all of T with the state in registers.
- ``"chunked"``: T is cut into chunks. Phase 1 composes each chunk's transition c_t L_t into a k x k matrix
  (the layers applied to the identity) and its zero-start end state; phase 2 scans the chunk summaries per
  (batch, head); phase 3 replays every chunk from its carry-in with the vector path. The backward runs the
  same three phases in reverse time on the adjoint. With one layer (R = 1) each step only mixes the two
  entries of a pair, so the pair kernels hold a pair per thread: a chunk's summary is its 2 x 2 blocks and
  the replays evaluate one cos / sin per pair (:data:`PAIR_SUMMARIES`, :data:`PAIR_REPLAYS`).
- ``"lookback"`` (R = 1, only where forced: slower than chunked on an H100): a single pass, forward and
  adjoint; one program per tile of steps x pairs scans its steps' 2 x 2 pair maps and takes its carry by
  decoupled look-back (:func:`_pair_lookback_kernel`, :func:`_pair_lookback_bwd_kernel`).

Envelope (:func:`angle_envelope`): k even with 2 <= k <= 128, 0 <= R <= 16.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op

from mingru.scans.angle import check_angle_inputs
from mingru_triton import _recipes
from mingru_triton._launch import (
    _PLAIN,
    FLOAT_DTYPES,
    cdiv,
    eager_path,
    is_fp64,
    launch,
    next_pow2,
    num_sms,
    on_kernel_device,
    sparse_every,
    sqrt_chunk,
)
from mingru_triton._math import sincos

__all__ = ["angle_envelope", "angle_scan_bwd", "angle_scan_fwd", "force_strategy"]

MAX_K = 128
MAX_LAYERS = 16
MAX_CHUNKED_K = 64
"""Largest k the chunked strategy takes on its own: its k x k summaries were measured up to k = 64."""
SEQUENTIAL_PREFETCH = 2
"""Steps ahead that the sequential strategy's vector path (:func:`_fwd_kernel`, :func:`_bwd_kernel`) loads
a step's inputs into registers for 2-byte inputs, whose loads get no asynchronous copies from the pipelined
loop; 4-byte inputs keep the loop's copies (0). On an H100 at (8, 4096, 16, 64, R) in bfloat16 (CUDA graph
replay) the sequential forward took 2.04 / 2.08 / 3.98 ms for R = 2 / 4 / 8 against 3.54 / 4.35 / 9.19 ms
without (one step ahead: 2.03 / 2.47 / 4.46), forward + backward 5.46 / 7.76 / 14.75 against 8.71 / 11.95
/ 23.31 ms. float32 lost with it (R = 2: 2.42 against 1.46 ms forward) and so did the chunked replays
(bfloat16, k = 16, R = 2: 0.171 against 0.162 ms forward), which keep their loads in the step."""
PAIR_PREFETCH_MAX_K = 8
"""With 2-byte inputs at k up to this, the R = 1 pair summaries and forward replays load each whole tile of
steps one tile ahead, and the adjoint replay each step one step ahead. On an H100 at (8, 4096, 16, k, 1) in
bfloat16 (CUDA graph replay, two runs of each in turn, the same within 0.8%), with against without: k = 8
forward 32.4 against 37.6 us, forward + backward 87.1 against 101.7; k = 16 70.8 against 60.8 and 165.7
against 150.3; k = 32 116.9 against 98.5 and 291.5 against 271.0; k = 64 225.0 against 179.2 and 521.6
against 523.3 (its adjoint alone faster, 296.6 against 344.1 us by difference; not taken: the plan does not
tell the adjoint apart). k = 8 and 16 have the same tiles (32 pairs a program) and chunks; k = 8 has half
the programs."""
STRATEGIES = ("sequential", "chunked", "lookback")
_FORCED: list[str] = []
CARRY_STAGES = 3
"""``tl.range`` pipelining depth of the chunk-carry loop: its summary loads do not wait on the carry. On an
H200 the angle kernel ran 1.0x-1.1x faster than with 1 stage ((8, 4096, 16, k, R), k <= 64, R <= 4)."""
CHUNK_TILE = 32
"""State entries per vector-path program of the chunked strategy (whole heads; one head when k >= 32). On an
H200, 32 ran 1.2x-1.4x (k = 8) and 1.1x-1.2x (k = 16) faster than one head per program."""
PAIR_SUMMARIES = True
"""With one rotation layer (R = 1) a step only mixes each entry with its partner perm[0, i], so a chunk's
transition keeps the 2 x 2 pair blocks: the chunked strategy then stores two numbers per row (the diagonal and
the partner's column) instead of k. False: the dense k x k summaries for every R (kept to compare)."""
PAIR_REPLAYS = True
"""With pair summaries, the replays (phase 3) of R = 1 also run a pair per thread: one cos / sin per pair and
step instead of one per entry, no exchange between threads. False: the vector path (kept to compare)."""
PAIR_TILE = 32
"""Pairs (one per thread; whole heads, at least one) per program of the pair kernels (summaries, carries,
replays)."""
PAIR_ROWS = 4
"""Steps (chunks, for the carries) the R = 1 pair summaries, carries and forward replays take per loop
iteration: their loads go out together and a scan over them in each thread's registers composes them, so a
program waits on memory once per PAIR_ROWS steps instead of every step. The adjoint replay keeps one step
per iteration (on 4-step tiles it ran slower). On an H100 at (8, 4096, 16, k, 1), k = 8 to 64, forward,
chunks of 64: 4 steps ran 1.2x-1.3x faster than 8 in float32, 1.1x-1.2x faster in bfloat16 but at k = 8
(1.2x slower)."""
LOOKBACK_BLOCK_T = 16
"""Steps per tile of the R = 1 single pass (:func:`_pair_lookback_kernel` and its adjoint)."""
LOOKBACK_REPLAY = 4
"""Summaries one replay step of the single pass's look-back loads at once."""


def angle_envelope(theta: Tensor, b: Tensor) -> str | None:
    """None when the angle kernels take theta (B, T, n, R, k/2) and b (B, T, n, k), else the reason.

    Limits: the state size k even with 2 <= k <= 128; 0 <= R (rotation layers) <= 16. Shapes are read only.
    """
    k, layers = b.shape[-1], theta.shape[-2]
    if k < 2 or k % 2:
        return f"k must be even and >= 2 for the angle kernel, got k={k}"
    if k > MAX_K:
        return f"k must be <= {MAX_K} for the angle kernel, got k={k}"
    if layers > MAX_LAYERS:
        return f"R (rotation layers) must be <= {MAX_LAYERS} for the angle kernel, got R={layers}"
    return None


@contextmanager
def force_strategy(name: str) -> Iterator[None]:
    """Within the block, run the angle ops with strategy ``name`` ("sequential", "chunked" or "lookback":
    the single pass of R = 1)."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    _FORCED.append(name)
    try:
        with _recipes.overriding():
            yield
    finally:
        _FORCED.pop()


def _block_heads(batch: int, heads: int, k: int, sms: int) -> int:
    """Heads per program of the sequential vector path: a tile of up to 256 state entries, shrunk (down to one
    head) until there are at least four programs per SM."""
    block_k = next_pow2(k)
    block = min(next_pow2(heads), max(1, 256 // block_k))
    while block > 1 and batch * cdiv(heads, block) < 4 * sms:
        block //= 2
    return block


def _warps(tile: int) -> int:
    """Warps of a vector-path program holding ``tile`` state entries."""
    return 1 if tile <= 64 else 2 if tile <= 256 else 4


def _matrix_warps(block_k: int) -> int:
    """Warps of a chunk-carry program (a BLOCK_K x BLOCK_K matrix times a vector, per chunk): 1 up to k = 16,
    2 for k = 32, 4 above."""
    return 1 if block_k <= 16 else 2 if block_k <= 32 else 4


def _summary_tile(heads: int, k: int, layers: int) -> tuple[int, int, int]:
    """(heads, columns, warps) of a chunk-summary program. Its rows are BLOCK_H heads x BLOCK_K state entries,
    one row per thread where they fit (32 rows per warp: 32 // BLOCK_K heads up to k = 16), so that a row's
    cos / sin serves all its columns. The columns (independent: the layers applied to columns of the
    identity) are split over programs where a whole row would not fit in registers: every layer's gather
    lanes are loop-invariant and held across the step loop.

    On an H200 ((B, T, n) = (8, 4096, 16), R in {1, 2, 4}, fp32 fwd and fwd+bwd), the chosen tiles ran
    1.4x-1.8x faster than one head per program at k = 16 and 1.4x-1.7x faster than two at k = 8; at k = 32
    1.0x-1.3x faster than 16 columns and 1.3x-1.6x faster than 2 warps; at k = 64 1.2x-1.4x faster than 16
    columns (64 columns: 1.1x faster for R = 1, 1.5x-1.6x slower for R = 4, where they spill)."""
    block_k = next_pow2(k)
    if block_k <= 16:
        return min(next_pow2(heads), 32 // block_k), block_k, 1
    if block_k == 32:
        return 1, 32 if layers <= 8 else 16, 1
    return 1, 64 if block_k == 64 and layers <= 1 else 32, block_k // 32


def _strategy(
    batch: int, steps: int, heads: int, k: int, layers: int, device: torch.device
) -> tuple[str, int]:
    """(strategy, chunk length). A step waits on the one before it, so a program's time is its step count
    times a step's latency, and the GPU fills only with many programs per SM. Chunked, with chunks of
    max(64, isqrt(T)) steps, unless the (batch, head) rows alone give >= 16 programs per SM, T < 2 chunks,
    k > :data:`MAX_CHUNKED_K`, or k > 32 with R > 1.

    Of chunks of 32, 64 and 128 steps, 64 was within 2% of the fastest for every k in {8, 16, 32, 64} and R in
    {1, 2, 4} at (B, T, n) = (8, 4096, 16) on an H200. The chunk summaries do k times the work of the
    vector path: at k = 64 and R in {2, 4} the (pipelined) sequential strategy ran 1.2x-1.8x faster there in
    float32; at k = 64, R = 1 it was 1.06x faster forward but 1.23x slower forward + backward, and at
    k <= 32 2.4x-11x slower. In bfloat16, with its loads :data:`SEQUENTIAL_PREFETCH` steps ahead, it ran on
    an H100 at k = 64 1.56x / 2.83x / 4.07x faster forward than chunked for R = 2 / 4 / 8 and 1.25x / 1.54x
    / 2.24x forward + backward (at k = 16, R = 2 11x slower). The isqrt(T) floor keeps phase 2 (one step per
    chunk) no longer than a chunk.

    "lookback" (the single pass of R = 1, forward and adjoint; chunk = its tile's steps) runs only where
    forced: on an H100 at (8, 4096, 16) its best tile took 1.8x-2.3x the chunked pair kernels' time at k = 8
    and k = 16, float32 and bfloat16, forward and forward + backward (CUDA graph replay).
    """
    rows = batch * heads
    chunk = sqrt_chunk(steps, 64)
    forced = _FORCED[-1] if _FORCED else None
    if forced == "lookback":
        return "lookback", LOOKBACK_BLOCK_T
    if forced == "chunked":
        return "chunked", max(1, min(chunk, cdiv(steps, 3))) if steps > 1 else 1
    if forced == "sequential":
        return "sequential", steps
    chunkable = k <= 32 or (k <= MAX_CHUNKED_K and layers <= 1)
    if chunkable and rows < 16 * num_sms(device) and steps >= 2 * chunk:
        return "chunked", chunk
    return "sequential", steps


class _Plan(NamedTuple):
    strategy: str
    chunk: int
    block_h: int
    """Heads per program of the vector path (phase 3 of the chunked strategy)."""
    stages: int
    """``tl.range`` pipelining depth of the per-step loops."""
    unroll: int
    """``tl.range`` unroll factor of the per-step loops."""
    summary: tuple[int, int, int] = (1, 1, 1)
    """(heads, columns, warps) of a chunk-summary program (:func:`_summary_tile`)."""
    pairs: tuple[int, int] | None = None
    """(heads, warps) of a pair-kernel program (:func:`_pair_tile`) when the summaries keep only the 2 x 2
    pair blocks (R = 1), else None."""
    rows: int = 1
    """Steps per iteration of the pair summaries', carries' and forward replays' loops (:data:`PAIR_ROWS`;
    they unroll by 1); 1 where there are none."""
    prefetch: int = 0
    """Steps ahead that the sequential walk loads its inputs into registers (:data:`SEQUENTIAL_PREFETCH`), or
    with pair kernels 1 where they load a tile ahead (:data:`PAIR_PREFETCH_MAX_K`); 0: each step (tile)
    loads its own."""


def _plan(
    batch: int,
    steps: int,
    heads: int,
    k: int,
    layers: int,
    device: torch.device,
    itemsize: int = 4,
) -> _Plan:
    """The strategy with its tiles and step loops. The chunked strategy's vector path takes
    :data:`CHUNK_TILE` state entries per program; its loops pipeline (3 stages) for k <= 16, k * R >= 64 or
    R = 1 (the pair kernels) and unroll by 2 for k <= 16. On an H200 (the shapes of :func:`_strategy`) that
    ran 1.0x-1.6x faster than without for k <= 16 and 1.1x faster for k = 32, R = 2; at k = 32, R = 1 the
    vector path was 1.25x slower with it, but the pair kernels that serve R = 1 since were faster (float32
    0.140 against 0.160 ms forward, 0.335 against 0.356 ms forward + backward; bfloat16 level). The
    sequential strategy pipelines its loop (3 stages: 2.4x-3.4x faster than without at those
    shapes), and for 2-byte inputs loads :data:`SEQUENTIAL_PREFETCH` steps ahead.

    R = 1 runs the pair kernels (:data:`PAIR_SUMMARIES`, tile :func:`_pair_tile`), with half the chunk length
    for 2-byte inputs at k <= 16. On an H200 at (8, 4096, 16, k, 1) they ran 1.3x-5.8x faster than the dense
    summaries with the vector path (k = 8 to 64, float32 and bfloat16, fwd and fwd+bwd); chunks of 32 steps
    were 1.3x-1.4x faster than 64 in bfloat16 at k <= 16, 1.04x-1.15x slower at k >= 32 and in float32.

    The single pass ("lookback", R = 1 only: a ValueError otherwise) takes :func:`_lookback_tile`'s tile in
    ``block_h`` and ``pairs``."""
    strategy, chunk = _strategy(batch, steps, heads, k, layers, device)
    if strategy == "lookback":
        if layers != 1:
            raise ValueError(f"the lookback strategy runs one rotation layer only (R = 1), got R={layers}")
        block_h, warps = _lookback_tile(heads, k)
        return _Plan(strategy, chunk, block_h, 1, 1, pairs=(block_h, warps))
    if strategy == "sequential":
        prefetch = SEQUENTIAL_PREFETCH if itemsize < 4 else 0
        return _Plan(strategy, chunk, _block_heads(batch, heads, k, num_sms(device)), 3, 1, prefetch=prefetch)
    small = next_pow2(k) <= 16
    pairs = _pair_tile(heads, k) if layers == 1 and PAIR_SUMMARIES else None
    stages = 3 if small or k * layers >= 64 or pairs is not None else 1
    unroll = 2 if small else 1
    block_h = min(next_pow2(heads), max(1, CHUNK_TILE // next_pow2(k)))
    if pairs is not None and itemsize < 4 and small:
        # 2-byte loads get no asynchronous copies: twice the programs hide their latency instead
        chunk = max(1, chunk // 2)
    rows = PAIR_ROWS if pairs is not None else 1
    prefetch = int(pairs is not None and itemsize < 4 and k <= PAIR_PREFETCH_MAX_K)
    return _Plan(
        strategy, chunk, block_h, stages, unroll, _summary_tile(heads, k, layers), pairs, rows, prefetch
    )


def _pair_tile(heads: int, k: int) -> tuple[int, int]:
    """(heads, warps) of a pair-kernel program: whole heads up to :data:`PAIR_TILE` pairs (one head when k is
    larger), one pair per thread. On an H200 ((8, 4096, 16, k, 1), k = 8 to 64) 32 pairs was within 7% of the
    fastest of 16, 32 and 64 at every chunk length; 16 (half a warp idle) was up to 1.95x slower."""
    slots = max(1, next_pow2(k) // 2)
    block_h = min(next_pow2(heads), max(1, PAIR_TILE // slots))
    return block_h, max(1, min(4, block_h * slots // 32))


def _lookback_tile(heads: int, k: int) -> tuple[int, int]:
    """(heads, warps) of a single-pass program: the pair kernels' heads (:func:`_pair_tile`), a warp per
    256 (step, pair) entries of its :data:`LOOKBACK_BLOCK_T`-step tile (at most 4)."""
    block_h, _ = _pair_tile(heads, k)
    entries = LOOKBACK_BLOCK_T * block_h * max(1, next_pow2(k) // 2)
    return block_h, max(1, min(4, entries // 256))


@triton.jit
def _layer_table(perm_ptr, sgn_ptr, p2p_ptr, lanes, K: tl.constexpr, R: tl.constexpr, WT: tl.constexpr):
    """Per rotation layer r (tuples of R (BLOCK_K,) vectors): the partner lane perm[r], the angle index
    p2p[r], the sign sgn[r] and the side (-1 where the lane is the pair's first entry, else +1). Loaded once
    before a step loop: inside a loop that stores, the compiler reloads them every step."""
    kmask = lanes < K
    # tuples grow by concatenation: triton has no starred expressions
    partners = ()
    angles = ()
    signs = ()
    sides = ()
    for r in tl.static_range(R):
        partner = tl.load(perm_ptr + r * K + lanes, mask=kmask, other=0).to(tl.int32)
        partner = tl.where(kmask, partner, lanes)
        angle = tl.load(p2p_ptr + r * K + lanes, mask=kmask, other=0).to(tl.int32)
        sign = tl.load(sgn_ptr + r * K + lanes, mask=kmask, other=1.0).to(WT)
        side = tl.where(lanes < partner, -1.0, 1.0).to(WT)
        partners = partners + (partner,)  # type: ignore[assignment]  # noqa: RUF005
        angles = angles + (angle,)  # type: ignore[assignment]  # noqa: RUF005
        signs = signs + (sign,)  # type: ignore[assignment]  # noqa: RUF005
        sides = sides + (side,)  # type: ignore[assignment]  # noqa: RUF005
    return partners, angles, signs, sides


@triton.jit
def _step_angles(theta_ptr, at, angles, mask, HALF: tl.constexpr, R: tl.constexpr):
    """A step's angles, one tile per layer r at ``at + r HALF + angles[r]`` (broadcast against each other and
    ``mask``; a tuple of R), loaded together before any is used: :func:`sincos`'s exact path is a branch,
    and a load written after it is issued after it."""
    loaded = ()
    for r in tl.static_range(R):
        th = tl.load(theta_ptr + at + r * HALF + angles[r], mask=mask, other=0.0)
        loaded = loaded + (th,)  # type: ignore[assignment]  # noqa: RUF005
    return loaded


@triton.jit
def _fwd_step_inputs(
    theta_ptr, scale_ptr, gamma_ptr, b_ptr, bi, t, T, n, heads, hmask, lanes, kmask, angles,
    K: tl.constexpr, HALF: tl.constexpr, R: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr,
    WT: tl.constexpr,
):  # fmt: skip
    """Step t's loads for (BLOCK_H heads, BLOCK_K lanes) of the vector path, each in its input's dtype (a
    conversion next to its load would wait on it): (the R angle tiles, scale, gamma, b); masked past T,
    gates 1 where absent."""
    live = hmask & (heads * 0 + t < T)
    tmask = live[:, None] & kmask[None, :]
    row = (bi * T + t) * n + heads
    angles_t = _step_angles(theta_ptr, (row * R * HALF)[:, None], angles, tmask, HALF, R)
    scale, gamma = _gate_loads(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
    add = tl.load(b_ptr + row[:, None] * K + lanes[None, :], mask=tmask, other=0.0)
    return angles_t, scale, gamma, add


@triton.jit
def _fwd_kernel(
    theta_ptr, scale_ptr, gamma_ptr, b_ptr, init_ptr, perm_ptr, sgn_ptr, p2p_ptr, out_ptr,
    T, n, n_hblocks, NC, CHUNK,
    K: tl.constexpr, HALF: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Vector path over steps [c*CHUNK, min(T, (c+1)*CHUNK)) of a (batch, head block) from the carry-in
    init (B, NC, n, k) (h0 itself when NC == 1); writes h to out."""
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NC
    rest = pid // NC
    hb = rest % n_hblocks
    bi = rest // n_hblocks
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    lanes = tl.arange(0, BLOCK_K)
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    hmask = heads < n
    kmask = lanes < K
    mask = hmask[:, None] & kmask[None, :]
    x = tl.load(init_ptr + ((bi * NC + c) * n + heads)[:, None] * K + lanes[None, :], mask=mask).to(WT)
    partners, angles, signs, sides = _layer_table(perm_ptr, sgn_ptr, p2p_ptr, lanes, K, R, WT)
    start = c * CHUNK
    if PREFETCH >= 1:
        ahead1 = _fwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, b_ptr, bi, start, T, n, heads, hmask,
                                  lanes, kmask, angles, K, HALF, R, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    if PREFETCH >= 2:
        ahead2 = _fwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, b_ptr, bi, start + 1, T, n, heads, hmask,
                                  lanes, kmask, angles, K, HALF, R, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    for s in tl.range(0, CHUNK, num_stages=STAGES, loop_unroll_factor=UNROLL):
        t = start + s
        live = hmask & (heads * 0 + t < T)
        tmask = live[:, None] & kmask[None, :]
        row = (bi * T + t) * n + heads
        offs = row[:, None] * K + lanes[None, :]
        if PREFETCH == 0:
            # the step's loads first (see :func:`_step_angles`)
            angles_t = _step_angles(theta_ptr, (row * R * HALF)[:, None], angles, tmask, HALF, R)
            scale, gamma = _load_gates(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
            add = tl.load(b_ptr + offs, mask=tmask, other=0.0).to(WT)
        elif PREFETCH == 1:
            angles_t, scale, gamma, add = ahead1
            ahead1 = _fwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, b_ptr, bi, t + 1, T, n, heads, hmask,
                                      lanes, kmask, angles, K, HALF, R, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
        else:
            angles_t, scale, gamma, add = ahead1
            ahead1 = ahead2
            ahead2 = _fwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, b_ptr, bi, t + 2, T, n, heads, hmask,
                                      lanes, kmask, angles, K, HALF, R, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
        if PREFETCH > 0:
            add = add.to(WT)
        for r in tl.static_range(R):
            sn, cs = sincos(angles_t[r].to(WT))
            xs = x * signs[r][None, :]
            idx = tl.broadcast_to(partners[r][None, :], (BLOCK_H, BLOCK_K))
            x = cs * xs + sides[r][None, :] * sn * tl.gather(xs, idx, 1)
        # the gates in WT (a no-op where they were loaded in the step)
        if HAS_SCALE:
            x = x * scale.to(WT)[:, None]
        if HAS_DECAY:
            x = x * gamma.to(WT)[:, None]
        x = x + add
        tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=tmask)


@triton.jit
def _gate_loads(
    scale_ptr, gamma_ptr, row, live, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, WT: tl.constexpr
):  # fmt: skip
    """(scale, gamma) at the offsets ``row`` of (head, step) entries in their input's dtype, 1 where a gate is
    absent (in WT) or not ``live``."""
    scale = tl.full(row.shape, 1.0, WT)
    gamma = scale
    if HAS_SCALE:
        scale = tl.load(scale_ptr + row, mask=live, other=1.0)
    if HAS_DECAY:
        gamma = tl.load(gamma_ptr + row, mask=live, other=1.0)
    return scale, gamma


@triton.jit
def _load_gates(
    scale_ptr, gamma_ptr, row, live, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, WT: tl.constexpr
):  # fmt: skip
    """:func:`_gate_loads` in WT."""
    scale, gamma = _gate_loads(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
    return scale.to(WT), gamma.to(WT)


@triton.jit
def _gate_grads(
    dscale_ptr, dgamma_ptr, scale, gamma, row, live, dc,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """Stores dscale = dc * gamma^[has_decay] and dgamma = dc * scale^[has_scale] at the offsets ``row`` of
    (head, step) entries (dc = lam . L(h_{t-1}), same shape; the gates from :func:`_load_gates`) and
    returns their c_t."""
    factor = tl.full(dc.shape, 1.0, tl.float32).to(WT)
    if HAS_SCALE:
        factor = factor * scale
    if HAS_DECAY:
        factor = factor * gamma
        if HAS_SCALE:
            tl.store(dscale_ptr + row, (dc * gamma).to(dscale_ptr.dtype.element_ty), mask=live)
            tl.store(dgamma_ptr + row, (dc * scale).to(dgamma_ptr.dtype.element_ty), mask=live)
        else:
            tl.store(dgamma_ptr + row, dc.to(dgamma_ptr.dtype.element_ty), mask=live)
    elif HAS_SCALE:
        tl.store(dscale_ptr + row, dc.to(dscale_ptr.dtype.element_ty), mask=live)
    return factor


@triton.jit
def _bwd_step_inputs(
    theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, t, T, n, heads, hmask, lanes, kmask,
    state, angles,
    K: tl.constexpr, HALF: tl.constexpr, R: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr,
    WT: tl.constexpr,
):  # fmt: skip
    """Step t's loads for the adjoint's vector path, each in its input's dtype (see
    :func:`_fwd_step_inputs`): (the R angle tiles, scale, gamma, the output gradient, h_{t-1} (h0 at
    t = 0)); masked outside [0, T)."""
    live = hmask & (heads * 0 + t < T) & (heads * 0 + t >= 0)
    tmask = live[:, None] & kmask[None, :]
    row = (bi * T + t) * n + heads
    offs = row[:, None] * K + lanes[None, :]
    angles_t = _step_angles(theta_ptr, (row * R * HALF)[:, None], angles, tmask, HALF, R)
    scale, gamma = _gate_loads(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
    grad = tl.load(grad_ptr + offs, mask=tmask, other=0.0)
    # one load of h_{t-1} from the output or h0 (same dtype): a sum of two would wait on both
    first = (heads * 0 + t == 0)[:, None]
    prev = tl.load(tl.where(first, h0_ptr + state, out_ptr + offs - n * K), mask=tmask, other=0.0)
    return angles_t, scale, gamma, grad, prev


@triton.jit
def _bwd_kernel(
    theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, perm_ptr, sgn_ptr, p2p_ptr, carry_ptr,
    dtheta_ptr, dscale_ptr, dgamma_ptr, db_ptr, dh0_ptr,
    T, n, n_hblocks, NC, CHUNK,
    K: tl.constexpr, HALF: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, CARRY_IN: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Adjoint over steps [c*CHUNK, min(T, (c+1)*CHUNK)) in reverse, from the carry (B, NC, n, k) holding
    A_{t+1}^T lam_{t+1} at the chunk's last step (zero when not CARRY_IN). lam_t = grad_t + carry,
    db_t = lam_t, dc_t = lam_t . L_t(h_{t-1}), dtheta through the layers, carry = c_t L_t^T lam_t;
    chunk 0 writes its last carry as dh0."""
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NC
    rest = pid // NC
    hb = rest % n_hblocks
    bi = rest // n_hblocks
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    lanes = tl.arange(0, BLOCK_K)
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    hmask = heads < n
    kmask = lanes < K
    mask = hmask[:, None] & kmask[None, :]
    state = (bi * n + heads)[:, None] * K + lanes[None, :]
    if CARRY_IN:
        carry_offs = ((bi * NC + c) * n + heads)[:, None] * K + lanes[None, :]
        carry = tl.load(carry_ptr + carry_offs, mask=mask, other=0.0).to(WT)
    else:
        carry = tl.zeros((BLOCK_H, BLOCK_K), dtype=tl.float32).to(WT)
    partners, angles, signs, sides = _layer_table(perm_ptr, sgn_ptr, p2p_ptr, lanes, K, R, WT)
    last = c * CHUNK + CHUNK - 1
    if PREFETCH >= 1:
        ahead1 = _bwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, last, T, n,
                                  heads, hmask, lanes, kmask, state, angles, K, HALF, R, HAS_SCALE, HAS_DECAY,
                                  WT)  # fmt: skip
    if PREFETCH >= 2:
        ahead2 = _bwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, last - 1, T,
                                  n, heads, hmask, lanes, kmask, state, angles, K, HALF, R, HAS_SCALE,
                                  HAS_DECAY, WT)  # fmt: skip
    for s in tl.range(0, CHUNK, num_stages=STAGES, loop_unroll_factor=UNROLL):
        t = last - s
        live = hmask & (heads * 0 + t < T)
        tmask = live[:, None] & kmask[None, :]
        row = (bi * T + t) * n + heads
        offs = row[:, None] * K + lanes[None, :]
        theta_base = (row * R * HALF)[:, None]
        if PREFETCH == 0:
            lam = carry + tl.load(grad_ptr + offs, mask=tmask, other=0.0).to(WT)
            tl.store(db_ptr + offs, lam.to(db_ptr.dtype.element_ty), mask=tmask)
            first = (heads * 0 + t == 0)[:, None]
            prev = tl.load(out_ptr + offs - n * K, mask=tmask & ~first, other=0.0).to(WT)
            prev += tl.load(h0_ptr + state, mask=tmask & first, other=0.0).to(WT)
            angles_t = _step_angles(theta_ptr, theta_base, angles, tmask, HALF, R)
            scale, gamma = _load_gates(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
            x = prev
        elif PREFETCH == 1:
            angles_t, scale, gamma, grad, prev = ahead1
            ahead1 = _bwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, t - 1,
                                      T, n, heads, hmask, lanes, kmask, state, angles, K, HALF, R,
                                      HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
        else:
            angles_t, scale, gamma, grad, prev = ahead1
            ahead1 = ahead2
            ahead2 = _bwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, t - 2,
                                      T, n, heads, hmask, lanes, kmask, state, angles, K, HALF, R,
                                      HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
        if PREFETCH > 0:
            scale = scale.to(WT)
            gamma = gamma.to(WT)
            lam = carry + grad.to(WT)
            tl.store(db_ptr + offs, lam.to(db_ptr.dtype.element_ty), mask=tmask)
            x = prev.to(WT)
        # each layer's cos / sin, kept for the reverse sweep below
        cosines = ()
        sines = ()
        for r in tl.static_range(R):
            sn, cs = sincos(angles_t[r].to(WT))
            cosines = cosines + (cs,)  # type: ignore[assignment]  # noqa: RUF005
            sines = sines + (sn,)  # type: ignore[assignment]  # noqa: RUF005
            xs = x * signs[r][None, :]
            idx = tl.broadcast_to(partners[r][None, :], (BLOCK_H, BLOCK_K))
            x = cs * xs + sides[r][None, :] * sn * tl.gather(xs, idx, 1)
        factor = _gate_grads(dscale_ptr, dgamma_ptr, scale, gamma, row, live, tl.sum(lam * x, axis=1),
                             HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
        u = lam * factor[:, None]
        for q in tl.static_range(R):
            r = R - 1 - q
            # tuples take constant indices: ``r``, assigned inside the step loop, is not one to triton
            partner = partners[R - 1 - q]
            angle = angles[R - 1 - q]
            sign = signs[R - 1 - q]
            side = sides[R - 1 - q]
            cs = cosines[R - 1 - q]
            sn = sines[R - 1 - q]
            idx = tl.broadcast_to(partner[None, :], (BLOCK_H, BLOCK_K))
            ssn = side[None, :] * sn
            # the layer's input (signed): the transpose of the rotation undoes it
            xs = cs * x - ssn * tl.gather(x, idx, 1)
            grad_angle = u * (side[None, :] * cs * tl.gather(xs, idx, 1) - sn * xs)
            pair = grad_angle + tl.gather(grad_angle, idx, 1)
            keep = tmask & (lanes < partner)[None, :]
            tl.store(
                dtheta_ptr + theta_base + r * HALF + angle[None, :],
                pair.to(dtheta_ptr.dtype.element_ty),
                mask=keep,
            )
            u = (cs * u - ssn * tl.gather(u, idx, 1)) * sign[None, :]
            x = xs * sign[None, :]
        carry = u
    tl.store(dh0_ptr + state, carry.to(dh0_ptr.dtype.element_ty), mask=mask & (heads * 0 + c == 0)[:, None])


@triton.jit
def _summary_start(
    n, n_hblocks, NC,
    K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """Where a chunk-summary program sits and how it starts: (chunk c, batch bi, column block cb, its rows,
    each row's lane and head, its columns, the live rows) and the identity's columns with a zero end state.
    Programs run over (batch, head block, column block, chunk), the chunk fastest."""
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NC
    rest = pid // NC
    cb = rest % (BLOCK_K // BLOCK_C)
    rest = rest // (BLOCK_K // BLOCK_C)
    hb = rest % n_hblocks
    bi = rest // n_hblocks
    rows = tl.arange(0, BLOCK_H * BLOCK_K)
    lane = rows % BLOCK_K
    head = hb * BLOCK_H + rows // BLOCK_K
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = (lane < K) & (head < n)
    mat = ((lane[:, None] == cols[None, :]).to(tl.float32)).to(WT)
    end = tl.zeros((BLOCK_H * BLOCK_K, 1), dtype=tl.float32).to(WT)
    return c, bi, cb, rows, lane, head, cols, rmask, mat, end


@triton.jit
def _store_summary(
    mat_ptr, end_ptr, mat, end, bi, c, cb, n, NC, rows, lane, head, cols, rmask, K: tl.constexpr
):
    """Writes a program's rows of the summaries mat (B, n, NC, k, k) and, from column block 0, of the end
    states end (B, n, NC, k)."""
    summary = (bi * n + head) * NC + c
    tl.store(mat_ptr + (summary * K * K + lane * K)[:, None] + cols[None, :], mat,
             mask=rmask[:, None] & (cols < K)[None, :])  # fmt: skip
    tl.store(end_ptr + (summary * K + lane)[:, None], end, mask=(rmask & (rows * 0 + cb == 0))[:, None])


@triton.jit
def _rotate_rows(mat, end, cs, ssn, src, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
    """One rotation layer on a summary program's rows: row i becomes cs_i row_i + ssn_i row_src[i] (the
    matrix's columns and the end state alike)."""
    pick = tl.broadcast_to(src[:, None], (ROWS, BLOCK_C))
    mat = cs[:, None] * mat + ssn[:, None] * tl.gather(mat, pick, 0)
    end = cs[:, None] * end + ssn[:, None] * tl.gather(end, src[:, None], 0)
    return mat, end


@triton.jit
def _fwd_summary_kernel(
    theta_ptr, scale_ptr, gamma_ptr, b_ptr, perm_ptr, sgn_ptr, p2p_ptr, mat_ptr, end_ptr,
    T, n, n_hblocks, NC, CHUNK,
    K: tl.constexpr, HALF: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr,
):  # fmt: skip
    """Chunked phase 1: per (batch, head, chunk) the product M of c_t L_t over the chunk (newest on the
    left, the layers applied to the columns of the identity) and the zero-start end state e.
    A program holds BLOCK_H heads' matrices stacked as (BLOCK_H * BLOCK_K, BLOCK_K) rows, so that each row's
    cos / sin serves a whole row. mat (B, n, NC, k, k), end (B, n, NC, k)."""
    ROWS: tl.constexpr = BLOCK_H * BLOCK_K
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    c, bi, cb, rows, lane, head, cols, rmask, mat, end = _summary_start(
        n, n_hblocks, NC, K, BLOCK_H, BLOCK_K, BLOCK_C, WT
    )
    partners, angles, signs, _ = _layer_table(perm_ptr, sgn_ptr, p2p_ptr, lane, K, R, WT)
    for s in tl.range(0, CHUNK, num_stages=STAGES, loop_unroll_factor=UNROLL):
        t = c * CHUNK + s
        live = rmask & (rows * 0 + t < T)
        row = (bi * T + t) * n + head
        # the step's loads first (see :func:`_step_angles`)
        angles_t = _step_angles(theta_ptr, row * R * HALF, angles, live, HALF, R)
        scale, gamma = _load_gates(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
        add = tl.load(b_ptr + row * K + lane, mask=live, other=0.0).to(WT)
        factor = scale * gamma
        for r in tl.static_range(R):
            partner = partners[r]
            sign = signs[r]
            psign = tl.load(sgn_ptr + r * K + partner, mask=lane < K, other=1.0).to(WT)
            # y_i = cos_i sgn_i x_i +- sin_i sgn_p x_p; the step's factor rides on the last layer
            sn, cs = sincos(angles_t[r].to(WT))
            cs = cs * sign
            ssn = tl.where(lane < partner, -1.0, 1.0).to(WT) * sn * psign
            if r == R - 1:
                cs = cs * factor
                ssn = ssn * factor
            mat, end = _rotate_rows(mat, end, cs, ssn, rows - lane + partner, ROWS, BLOCK_C)
        if R == 0:
            mat = mat * factor[:, None]
            end = end * factor[:, None]
        end = end + add[:, None]
    _store_summary(mat_ptr, end_ptr, mat, end, bi, c, cb, n, NC, rows, lane, head, cols, rmask, K)


@triton.jit
def _bwd_summary_kernel(
    theta_ptr, scale_ptr, gamma_ptr, grad_ptr, perm_ptr, sgn_ptr, p2p_ptr, mat_ptr, end_ptr,
    T, n, n_hblocks, NC, CHUNK,
    K: tl.constexpr, HALF: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr,
):  # fmt: skip
    """Chunked backward phase 1: per (batch, head, chunk) N = A_{t0}^T ... A_{t1-1}^T (A_t = c_t L_t) and
    the adjoint carry z leaving the chunk when none enters it; BLOCK_H heads per program as in the forward.
    mat (B, n, NC, k, k), end (B, n, NC, k)."""
    ROWS: tl.constexpr = BLOCK_H * BLOCK_K
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    c, bi, cb, rows, lane, head, cols, rmask, mat, end = _summary_start(
        n, n_hblocks, NC, K, BLOCK_H, BLOCK_K, BLOCK_C, WT
    )
    partners, angles, signs, _ = _layer_table(perm_ptr, sgn_ptr, p2p_ptr, lane, K, R, WT)
    for s in tl.range(0, CHUNK, num_stages=STAGES, loop_unroll_factor=UNROLL):
        t = c * CHUNK + CHUNK - 1 - s
        live = rmask & (rows * 0 + t < T)
        row = (bi * T + t) * n + head
        # the step's loads first (see :func:`_step_angles`)
        end = end + tl.load(grad_ptr + row * K + lane, mask=live, other=0.0).to(WT)[:, None]
        angles_t = _step_angles(theta_ptr, row * R * HALF, angles, live, HALF, R)
        scale, gamma = _load_gates(scale_ptr, gamma_ptr, row, live, HAS_SCALE, HAS_DECAY, WT)
        factor = scale * gamma
        if R == 0:
            mat = mat * factor[:, None]
            end = end * factor[:, None]
        for q in tl.static_range(R):
            # tuples take constant indices: R - 1 - q, not a name assigned from it
            partner = partners[R - 1 - q]
            sign = signs[R - 1 - q]
            # y_i = sgn_i (cos_i x_i -+ sin_i x_p); the step's factor rides on the first layer applied
            sn, cs = sincos(angles_t[R - 1 - q].to(WT))
            cs = cs * sign
            ssn = tl.where(lane < partner, sign, -sign) * sn
            if q == 0:
                cs = cs * factor
                ssn = ssn * factor
            mat, end = _rotate_rows(mat, end, cs, ssn, rows - lane + partner, ROWS, BLOCK_C)
    _store_summary(mat_ptr, end_ptr, mat, end, bi, c, cb, n, NC, rows, lane, head, cols, rmask, K)


@triton.jit
def _carry_kernel(
    mat_ptr, end_ptr, init_ptr, carry_ptr, n, NC,
    K: tl.constexpr, BLOCK_K: tl.constexpr, REVERSE: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr,
):  # fmt: skip
    """Chunked phase 2 per (batch, head): carry_c = the state entering chunk c,
    carry_{c+1} = M_c carry_c + e_c from init (h0 (B, n, k)); REVERSE: from zero,
    carry_{c-1} = N_c carry_c + z_c. carry (B, NC, n, k)."""
    pid = tl.program_id(0).to(tl.int64)
    head = pid % n
    bi = pid // n
    lanes = tl.arange(0, BLOCK_K)
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    kmask = lanes < K
    mmask = kmask[:, None] & kmask[None, :]
    if REVERSE:
        state = tl.zeros((BLOCK_K,), dtype=tl.float32).to(WT)
    else:
        state = tl.load(init_ptr + pid * K + lanes, mask=kmask, other=0.0).to(WT)
    for q in tl.range(0, NC, num_stages=STAGES, loop_unroll_factor=UNROLL):
        c = NC - 1 - q if REVERSE else q
        tl.store(carry_ptr + ((bi * NC + c) * n + head) * K + lanes, state, mask=kmask)
        summary = pid * NC + c
        mat = tl.load(mat_ptr + summary * K * K + lanes[:, None] * K + lanes[None, :], mask=mmask, other=0.0)
        state = tl.sum(mat * state[None, :], axis=1) + tl.load(end_ptr + summary * K + lanes, mask=kmask)


@triton.jit
def _pair_tile_start(
    pid, n, n_hblocks, perm_ptr, p2p_ptr, sgn_ptr,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """A pair program's tile for its (batch, head block) index ``pid``: BLOCK_H heads x BLOCK_K // 2 pair
    slots, slot m holding the pair of angle m (lanes lo < hi with p2p[0, lo] = m, hi = perm[0, lo]) in one
    thread. Returns (batch bi, heads (BLOCK_H,), slot m, lo, hi, sgn[0, lo], sgn[0, hi] (BLOCK_K // 2,), the
    live slots (BLOCK_H, BLOCK_K // 2))."""
    hb = pid % n_hblocks
    bi = pid // n_hblocks
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    lanes = tl.arange(0, BLOCK_K)
    kmask = lanes < K
    partner = tl.load(perm_ptr + lanes, mask=kmask, other=0).to(tl.int32)
    number = tl.load(p2p_ptr + lanes, mask=kmask & (lanes < partner), other=-1).to(tl.int32)
    m = tl.arange(0, BLOCK_K // 2)
    match = number[None, :] == m[:, None]
    lo = tl.sum(tl.where(match, lanes[None, :], 0), axis=1)
    hi = tl.sum(tl.where(match, partner[None, :], 0), axis=1)
    sign_lo = tl.load(sgn_ptr + lo, mask=m < HALF, other=1.0).to(WT)
    sign_hi = tl.load(sgn_ptr + hi, mask=m < HALF, other=1.0).to(WT)
    live = (heads < n)[:, None] & (m < HALF)[None, :]
    return bi, heads, m, lo, hi, sign_lo, sign_hi, live


@triton.jit
def _pair_tile_offsets(bi, heads, m, lo, hi, first, rows, move, T, n, HALF: tl.constexpr, K: tl.constexpr):
    """Offsets of a (BLOCK_H, BLOCK_K // 2, ROWS) pair tile whose row r is step first + r move: the scalar
    row (bi T + first) n of its first step (a step moves it by n; theta's entries are HALF per row, those of
    a (B, T, n, k) tensor K) and the tile's int32 offsets from there into theta (BLOCK_H, BLOCK_K // 2, ROWS),
    the gates (BLOCK_H, ROWS) and the lo and hi entries of a (B, T, n, k) tensor. 32-bit and loop-invariant:
    a tile's addresses are the scalar plus these, not 64-bit pointers carried across the loop."""
    heads = heads.to(tl.int32)
    walk = (rows * move)[None, None, :]
    th_rel = (heads * HALF)[:, None, None] + m[None, :, None] + walk * HALF
    gate_rel = heads[:, None] + (rows * move)[None, :]
    at = (heads * K)[:, None, None] + walk * K
    return (bi * T + first) * n, th_rel, gate_rel, at + lo[None, :, None], at + hi[None, :, None]


@triton.jit
def _pair_step_maps(
    th_at, sc_at, ga_at, valid, alive, sign_lo, sign_hi,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, TRANSPOSE: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """The 2 x 2 pair blocks (p00, p01, p10, p11) of a (BLOCK_H, BLOCK_K // 2, ROWS) tile of steps at the
    pointers ``th_at`` (theta) and ``sc_at`` / ``ga_at`` (BLOCK_H, ROWS) (gates): P_t = c_t [[cos sgn_lo,
    -sin sgn_hi], [sin sgn_lo, cos sgn_hi]], transposed with TRANSPOSE. ``valid`` (the tile's mask) and
    ``alive`` ((BLOCK_H, ROWS): the live heads, the steps inside the chunk and T) make the other steps the
    identity."""
    th = tl.load(th_at, mask=valid, other=0.0).to(WT)
    sn, cs = sincos(th)
    if HAS_SCALE or HAS_DECAY:
        factor = tl.full(alive.shape, 1.0, tl.float32).to(WT)
        if HAS_SCALE:
            factor = tl.load(sc_at, mask=alive, other=1.0).to(WT)
        if HAS_DECAY:
            factor = factor * tl.load(ga_at, mask=alive, other=1.0).to(WT)
        cs, sn = cs * factor[:, None, :], sn * factor[:, None, :]
    return _pair_signed(cs, sn, valid, sign_lo, sign_hi, TRANSPOSE)


@triton.jit
def _pair_tile_loads(
    theta_ptr, scale_ptr, gamma_ptr, add_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid, alive, go,
    HALF: tl.constexpr, K: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """A pair tile's loads at row ``base`` (offsets of :func:`_pair_tile_offsets`), each in its input's dtype:
    (theta, scale, gamma, add_lo, add_hi); for loading a tile ahead of its use. ``go`` (ROWS,) masks the
    tile's steps on top of ``valid`` and ``alive``."""
    valid = valid & go[None, None, :]
    alive = alive & go[None, :]
    th = tl.load(theta_ptr + base * HALF + th_rel, mask=valid, other=0.0)
    scale, gamma = _gate_loads(scale_ptr, gamma_ptr, base + gate_rel, alive, HAS_SCALE, HAS_DECAY, WT)
    add_l = tl.load(add_ptr + base * K + rel_l, mask=valid, other=0.0)
    add_h = tl.load(add_ptr + base * K + rel_h, mask=valid, other=0.0)
    return th, scale, gamma, add_l, add_h


@triton.jit
def _pair_ahead(
    ahead, theta_ptr, scale_ptr, gamma_ptr, add_ptr, next_base, th_rel, gate_rel, rel_l, rel_h, valid, alive,
    more, sign_lo, sign_hi,
    HALF: tl.constexpr, K: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr,
    TRANSPOSE: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """A whole tile's step maps and adds (WT) from its loads ``ahead`` (:func:`_pair_tile_loads`), with the
    next tile's loads at row ``next_base`` sent out first (masked by ``more`` where there is none):
    (p00, p01, p10, p11, add_lo, add_hi, the next tile's loads)."""
    th, scale, gamma, add_l, add_h = ahead
    ahead = _pair_tile_loads(theta_ptr, scale_ptr, gamma_ptr, add_ptr, next_base, th_rel, gate_rel, rel_l,
                             rel_h, valid, alive, more, HALF, K, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    p00, p01, p10, p11 = _pair_loaded_maps(th, scale, gamma, valid, sign_lo, sign_hi, HAS_SCALE, HAS_DECAY,
                                           TRANSPOSE, WT)  # fmt: skip
    return p00, p01, p10, p11, add_l.to(WT), add_h.to(WT), ahead


@triton.jit
def _pair_signed(cs, sn, valid, sign_lo, sign_hi, TRANSPOSE: tl.constexpr):
    """The pair blocks (p00, p01, p10, p11) from a tile's c_t cos and c_t sin: the signs of lo and hi taken
    in (1 outside ``valid``), transposed with TRANSPOSE."""
    s_lo = tl.where(valid, sign_lo[None, :, None], 1.0)
    s_hi = tl.where(valid, sign_hi[None, :, None], 1.0)
    if TRANSPOSE:
        return cs * s_lo, sn * s_lo, -sn * s_hi, cs * s_hi
    return cs * s_lo, -sn * s_hi, sn * s_lo, cs * s_hi


@triton.jit
def _pair_loaded_maps(
    th, scale, gamma, valid, sign_lo, sign_hi,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, TRANSPOSE: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """:func:`_pair_step_maps` from a tile's loaded angles and gates (:func:`_pair_tile_loads`)."""
    sn, cs = sincos(th.to(WT))
    if HAS_SCALE or HAS_DECAY:
        factor = scale.to(WT) * gamma.to(WT)
        cs, sn = cs * factor[:, None, :], sn * factor[:, None, :]
    return _pair_signed(cs, sn, valid, sign_lo, sign_hi, TRANSPOSE)


@triton.jit
def _pair_summary_kernel(
    theta_ptr, scale_ptr, gamma_ptr, add_ptr, perm_ptr, sgn_ptr, p2p_ptr, pairs_ptr,
    T, n, n_hblocks, NC, CHUNK, PLANE,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, REVERSE: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr, ROWS: tl.constexpr, FOLD: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    """Chunked phase 1 for R = 1, where a step only mixes the two entries of each pair (lo, hi): the chunk's
    matrix keeps the 2 x 2 pair blocks, one per thread, and a step is the block's 2 x 2 map (one cos / sin
    per pair). Step t's block P_t = c_t [[cos sgn_lo, -sin sgn_hi], [sin sgn_lo, cos sgn_hi]] (forward:
    the step maps x -> P_t x + b_t, composed into (M, e), M the chunk's product newest on the left and e its
    zero-start end state); REVERSE: x -> P_t^T (x + dh_t) towards the chunk's start (e the adjoint carry
    leaving the chunk when none enters it; ``add`` is the output gradient). The loop takes ROWS steps at a
    time: their loads go out together and the thread composes them in its registers (an associative scan over
    the tile's rows, or with FOLD a fold of neighbouring steps); with PREFETCH each whole tile's loads go out
    one tile ahead. Stored per row i with partner p: d_i = M[i, i], o_i = M[i, p], e_i; pairs
    (3, B, NC, n, k), PLANE = B NC n k apart."""
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NC
    bi, heads, m, lo, hi, sign_lo, sign_hi, live = _pair_tile_start(
        pid // NC, n, n_hblocks, perm_ptr, p2p_ptr, sgn_ptr, K, HALF, BLOCK_H, BLOCK_K, WT
    )
    one = tl.full((BLOCK_H, BLOCK_K // 2), 1.0, tl.float32).to(WT)
    m_ll, m_lh, m_hl, m_hh = one, one * 0, one * 0, one
    e_l, e_h = one * 0, one * 0
    rows = tl.arange(0, ROWS)
    hmask = heads < n
    first = (c * CHUNK).to(tl.int32)
    move = -n if REVERSE else n
    # the chunk's steps inside T, walked from its last one when REVERSE
    span = tl.minimum(CHUNK, T - first)
    if REVERSE:
        first = first + span - 1
    # The tile is (heads, slots, steps): the steps last, so that each thread holds all of its pair's steps
    # (the compiler spreads threads over the leading dimensions when no access is contiguous) and the scan
    # runs in registers. Offsets: the walk's first step, then a step per row along the walk. The whole
    # tiles come first, with loop-invariant masks, then the walk's last steps (a partial tile) if any.
    base, th_rel, gate_rel, rel_l, rel_h = _pair_tile_offsets(bi, heads, m, lo, hi, first, rows, move, T, n,
                                                              HALF, K)  # fmt: skip
    whole = span // ROWS * ROWS
    alive = hmask[:, None] & (rows >= 0)[None, :]
    valid = live[:, :, None] & alive[:, None, :]
    if PREFETCH:
        go = rows < whole  # the first whole tile, if any
        ahead = _pair_tile_loads(theta_ptr, scale_ptr, gamma_ptr, add_ptr, base, th_rel, gate_rel, rel_l,
                                 rel_h, valid, alive, go, HALF, K, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    for i in tl.range(0, whole, ROWS, num_stages=STAGES, loop_unroll_factor=UNROLL):
        if PREFETCH:
            more = rows + (i + ROWS) < whole  # the next whole tile, if any
            p00, p01, p10, p11, add_l, add_h, ahead = _pair_ahead(
                ahead, theta_ptr, scale_ptr, gamma_ptr, add_ptr, base + ROWS * move, th_rel, gate_rel, rel_l,
                rel_h, valid, alive, more, sign_lo, sign_hi, HALF, K, HAS_SCALE, HAS_DECAY, REVERSE, WT,
            )  # fmt: skip
            m_ll, m_lh, m_hl, m_hh, e_l, e_h = _pair_summary_compose(
                p00, p01, p10, p11, add_l, add_h, m_ll, m_lh, m_hl, m_hh, e_l, e_h, ROWS, REVERSE, FOLD
            )
        else:
            m_ll, m_lh, m_hl, m_hh, e_l, e_h = _pair_summary_tile(
                theta_ptr, scale_ptr, gamma_ptr, add_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid, alive,
                sign_lo, sign_hi, m_ll, m_lh, m_hl, m_hh, e_l, e_h, HALF, K, ROWS, HAS_SCALE, HAS_DECAY,
                REVERSE, FOLD, WT,
            )  # fmt: skip
        base += ROWS * move
    if whole < span:
        alive = hmask[:, None] & (whole + rows < span)[None, :]
        valid = live[:, :, None] & alive[:, None, :]
        m_ll, m_lh, m_hl, m_hh, e_l, e_h = _pair_summary_tile(
            theta_ptr, scale_ptr, gamma_ptr, add_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid, alive,
            sign_lo, sign_hi, m_ll, m_lh, m_hl, m_hh, e_l, e_h, HALF, K, ROWS, HAS_SCALE, HAS_DECAY, REVERSE,
            FOLD, WT,
        )  # fmt: skip
    at = (((bi * NC + c) * n + heads) * K)[:, None]
    tl.store(pairs_ptr + at + lo[None, :], m_ll, mask=live)
    tl.store(pairs_ptr + at + hi[None, :], m_hh, mask=live)
    tl.store(pairs_ptr + PLANE + at + lo[None, :], m_lh, mask=live)
    tl.store(pairs_ptr + PLANE + at + hi[None, :], m_hl, mask=live)
    tl.store(pairs_ptr + 2 * PLANE + at + lo[None, :], e_l, mask=live)
    tl.store(pairs_ptr + 2 * PLANE + at + hi[None, :], e_h, mask=live)


@triton.jit
def _pair_summary_tile(
    theta_ptr, scale_ptr, gamma_ptr, add_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid, alive, sign_lo,
    sign_hi, m_ll, m_lh, m_hl, m_hh, e_l, e_h,
    HALF: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr,
    REVERSE: tl.constexpr, FOLD: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """One tile of :func:`_pair_summary_kernel` at row ``base``: the summary (m, e) so far with the tile's
    steps composed after it (FOLD: :func:`_pair_total`; else a scan over the rows and its last one)."""
    add_l = tl.load(add_ptr + base * K + rel_l, mask=valid, other=0.0).to(WT)
    add_h = tl.load(add_ptr + base * K + rel_h, mask=valid, other=0.0).to(WT)
    p00, p01, p10, p11 = _pair_step_maps(
        theta_ptr + base * HALF + th_rel, scale_ptr + base + gate_rel, gamma_ptr + base + gate_rel, valid,
        alive, sign_lo, sign_hi, HAS_SCALE, HAS_DECAY, REVERSE, WT,
    )  # fmt: skip
    return _pair_summary_compose(
        p00, p01, p10, p11, add_l, add_h, m_ll, m_lh, m_hl, m_hh, e_l, e_h, ROWS, REVERSE, FOLD
    )


@triton.jit
def _pair_summary_compose(
    p00, p01, p10, p11, add_l, add_h, m_ll, m_lh, m_hl, m_hh, e_l, e_h,
    ROWS: tl.constexpr, REVERSE: tl.constexpr, FOLD: tl.constexpr,
):  # fmt: skip
    """The summary (m, e) so far with a tile's step maps and adds (WT) composed after it."""
    if REVERSE:
        add_l, add_h = p00 * add_l + p01 * add_h, p10 * add_l + p11 * add_h
    if FOLD and ROWS >= 2:
        t00, t01, t10, t11, t_l, t_h = _pair_total(p00, p01, p10, p11, add_l, add_h, ROWS)
        return _pair_compose(m_ll, m_lh, m_hl, m_hh, e_l, e_h, t00, t01, t10, t11, t_l, t_h)
    t00, t01, t10, t11, t_l, t_h = tl.associative_scan((p00, p01, p10, p11, add_l, add_h), 2, _pair_compose)
    last = (tl.arange(0, ROWS) == ROWS - 1)[None, None, :]
    return _pair_compose(
        m_ll, m_lh, m_hl, m_hh, e_l, e_h, _last_step(t00, last), _last_step(t01, last), _last_step(t10, last),
        _last_step(t11, last), _last_step(t_l, last), _last_step(t_h, last),
    )  # fmt: skip


@triton.jit
def _halves(x):
    """(earlier, later) steps of a (heads, slots, 2 s) tile, steps last: its even and odd rows, (heads, slots,
    s) each."""
    return tl.split(tl.reshape(x, (x.shape[0], x.shape[1], x.shape[2] // 2, 2)))


@triton.jit
def _pair_fold(p00, p01, p10, p11, p_l, p_h):
    """A (heads, slots, 2 s) tile of pair maps, steps last, folded to s: each odd step composed after the even
    step before it."""
    a00, b00 = _halves(p00)
    a01, b01 = _halves(p01)
    a10, b10 = _halves(p10)
    a11, b11 = _halves(p11)
    a_l, b_l = _halves(p_l)
    a_h, b_h = _halves(p_h)
    return _pair_compose(a00, a01, a10, a11, a_l, a_h, b00, b01, b10, b11, b_l, b_h)


@triton.jit
def _pair_total(p00, p01, p10, p11, p_l, p_h, ROWS: tl.constexpr):
    """The composition of a (heads, slots, ROWS) tile's pair maps (steps last, in walk order; ROWS a power of
    two), (heads, slots): log2(ROWS) folds of neighbouring steps, a tree of ROWS - 1 compositions where a
    scan and a last-step pick take about twice that."""
    for _ in tl.static_range(ROWS.bit_length() - 1):
        p00, p01, p10, p11, p_l, p_h = _pair_fold(p00, p01, p10, p11, p_l, p_h)
    shape: tl.constexpr = (p00.shape[0], p00.shape[1])
    return (
        tl.reshape(p00, shape), tl.reshape(p01, shape), tl.reshape(p10, shape), tl.reshape(p11, shape),
        tl.reshape(p_l, shape), tl.reshape(p_h, shape),
    )  # fmt: skip


@triton.jit
def _pair_carry_kernel(
    pairs_ptr, init_ptr, carry_ptr, perm_ptr, sgn_ptr, p2p_ptr, n, n_hblocks, NC, PLANE,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    REVERSE: tl.constexpr, FP64: tl.constexpr, STAGES: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Chunked phase 2 on pair summaries (:func:`_pair_summary_kernel`) per (batch, head block), a pair per
    thread: carry_c = the state entering chunk c, carry_{c+1,i} = d_i carry_{c,i} + o_i carry_{c,p} + e_i
    from init (h0 (B, n, k)); REVERSE: from zero, towards chunk 0. ROWS chunks at a time ((heads, slots,
    chunks) tiles, a scan over the chunks in the thread, as in :func:`_pair_fwd_kernel`). carry (B, NC, n,
    k)."""
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    bi, heads, _, lo, hi, _, _, live = _pair_tile_start(
        pid, n, n_hblocks, perm_ptr, p2p_ptr, sgn_ptr, K, HALF, BLOCK_H, BLOCK_K, WT
    )
    if REVERSE:
        x_l = tl.zeros((BLOCK_H, BLOCK_K // 2), dtype=tl.float32).to(WT)
        x_h = x_l
    else:
        at = ((bi * n + heads) * K)[:, None]
        x_l = tl.load(init_ptr + at + lo[None, :], mask=live, other=0.0).to(WT)
        x_h = tl.load(init_ptr + at + hi[None, :], mask=live, other=0.0).to(WT)
    rows = tl.arange(0, ROWS)
    head_row = (rows == 0)[None, None, :]
    last = (rows == ROWS - 1)[None, None, :]
    move = -1 if REVERSE else 1
    heads = heads.to(tl.int32)
    # offsets: an int64 base at the walk's current chunk, int32 ones for the tile's chunks
    rel = ((rows * move * n)[None, None, :] + heads[:, None, None]) * K
    rel_l = rel + lo[None, :, None]
    rel_h = rel + hi[None, :, None]
    base = (bi * NC + (NC - 1 if REVERSE else 0)) * n * K
    at = (heads * K)[:, None]
    tl.store(carry_ptr + base + at + lo[None, :], x_l, mask=live)
    tl.store(carry_ptr + base + at + hi[None, :], x_h, mask=live)
    for q in tl.range(0, NC, ROWS, num_stages=STAGES):
        walk = q + rows
        valid = live[:, :, None] & (walk < NC)[None, None, :]
        d_l = tl.load(pairs_ptr + base + rel_l, mask=valid, other=0.0)
        d_h = tl.load(pairs_ptr + base + rel_h, mask=valid, other=0.0)
        o_l = tl.load(pairs_ptr + PLANE + base + rel_l, mask=valid, other=0.0)
        o_h = tl.load(pairs_ptr + PLANE + base + rel_h, mask=valid, other=0.0)
        e_l = tl.load(pairs_ptr + 2 * PLANE + base + rel_l, mask=valid, other=0.0)
        e_h = tl.load(pairs_ptr + 2 * PLANE + base + rel_h, mask=valid, other=0.0)
        e_l += tl.where(head_row, d_l * x_l[:, :, None] + o_l * x_h[:, :, None], 0.0)
        e_h += tl.where(head_row, o_h * x_l[:, :, None] + d_h * x_h[:, :, None], 0.0)
        y_l, y_h = tl.associative_scan((d_l, o_l, o_h, d_h, e_l, e_h), 2, _pair_compose)[4:]
        # the state after the walk's chunk w enters chunk w + 1
        following = valid & (walk + 1 < NC)[None, None, :]
        tl.store(carry_ptr + base + move * n * K + rel_l, y_l, mask=following)
        tl.store(carry_ptr + base + move * n * K + rel_h, y_h, mask=following)
        x_l, x_h = _last_step(y_l, last), _last_step(y_h, last)
        base += ROWS * move * n * K


@triton.jit
def _pair_fwd_kernel(
    theta_ptr, scale_ptr, gamma_ptr, b_ptr, init_ptr, perm_ptr, sgn_ptr, p2p_ptr, out_ptr,
    T, n, n_hblocks, NC, CHUNK,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr, ROWS: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """:func:`_fwd_kernel` for R = 1 with a pair per thread (:func:`_pair_tile_start`): one cos / sin per pair
    and step, no exchange between threads. h_lo = c (cos x~_lo - sin x~_hi) + b_lo,
    h_hi = c (sin x~_lo + cos x~_hi) + b_hi, x~ = sgn x. ROWS steps at a time: the carry enters the tile's
    first step and an associative scan over its rows (held in the thread) gives every step's state; with
    PREFETCH each whole tile's loads go out one tile ahead."""
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NC
    bi, heads, m, lo, hi, sign_lo, sign_hi, live = _pair_tile_start(
        pid // NC, n, n_hblocks, perm_ptr, p2p_ptr, sgn_ptr, K, HALF, BLOCK_H, BLOCK_K, WT
    )
    at = (((bi * NC + c) * n + heads) * K)[:, None]
    x_l = tl.load(init_ptr + at + lo[None, :], mask=live, other=0.0).to(WT)
    x_h = tl.load(init_ptr + at + hi[None, :], mask=live, other=0.0).to(WT)
    rows = tl.arange(0, ROWS)
    hmask = heads < n
    first = (c * CHUNK).to(tl.int32)
    # (heads, slots, steps) tiles, as in :func:`_pair_summary_kernel`: the whole tiles first, their masks
    # loop-invariant, then the chunk's last steps (a partial tile) if any
    base, th_rel, gate_rel, rel_l, rel_h = _pair_tile_offsets(bi, heads, m, lo, hi, first, rows, n, T, n,
                                                              HALF, K)  # fmt: skip
    span = tl.minimum(CHUNK, T - first)
    whole = span // ROWS * ROWS
    alive = hmask[:, None] & (rows >= 0)[None, :]
    valid = live[:, :, None] & alive[:, None, :]
    if PREFETCH:
        go = rows < whole  # the first whole tile, if any
        ahead = _pair_tile_loads(theta_ptr, scale_ptr, gamma_ptr, b_ptr, base, th_rel, gate_rel, rel_l, rel_h,
                                 valid, alive, go, HALF, K, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    for i in tl.range(0, whole, ROWS, num_stages=STAGES, loop_unroll_factor=UNROLL):
        if PREFETCH:
            more = rows + (i + ROWS) < whole  # the next whole tile, if any
            p00, p01, p10, p11, add_l, add_h, ahead = _pair_ahead(
                ahead, theta_ptr, scale_ptr, gamma_ptr, b_ptr, base + ROWS * n, th_rel, gate_rel, rel_l,
                rel_h, valid, alive, more, sign_lo, sign_hi, HALF, K, HAS_SCALE, HAS_DECAY, False, WT,
            )  # fmt: skip
            x_l, x_h = _pair_fwd_scan(p00, p01, p10, p11, add_l, add_h, out_ptr, base, rel_l, rel_h, valid,
                                      x_l, x_h, K, ROWS)  # fmt: skip
        else:
            x_l, x_h = _pair_fwd_tile(
                theta_ptr, scale_ptr, gamma_ptr, b_ptr, out_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid,
                alive, sign_lo, sign_hi, x_l, x_h, HALF, K, ROWS, HAS_SCALE, HAS_DECAY, WT,
            )  # fmt: skip
        base += ROWS * n
    if whole < span:
        alive = hmask[:, None] & (whole + rows < span)[None, :]
        valid = live[:, :, None] & alive[:, None, :]
        _pair_fwd_tile(
            theta_ptr, scale_ptr, gamma_ptr, b_ptr, out_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid,
            alive, sign_lo, sign_hi, x_l, x_h, HALF, K, ROWS, HAS_SCALE, HAS_DECAY, WT,
        )  # fmt: skip


@triton.jit
def _pair_fwd_tile(
    theta_ptr, scale_ptr, gamma_ptr, b_ptr, out_ptr, base, th_rel, gate_rel, rel_l, rel_h, valid, alive,
    sign_lo, sign_hi, x_l, x_h,
    HALF: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr,
    WT: tl.constexpr,
):  # fmt: skip
    """One tile of :func:`_pair_fwd_kernel` at row ``base`` from the state (x_l, x_h) entering it: stores its
    steps' states and returns the last."""
    p00, p01, p10, p11 = _pair_step_maps(
        theta_ptr + base * HALF + th_rel, scale_ptr + base + gate_rel, gamma_ptr + base + gate_rel, valid,
        alive, sign_lo, sign_hi, HAS_SCALE, HAS_DECAY, False, WT,
    )  # fmt: skip
    add_l = tl.load(b_ptr + base * K + rel_l, mask=valid, other=0.0).to(WT)
    add_h = tl.load(b_ptr + base * K + rel_h, mask=valid, other=0.0).to(WT)
    return _pair_fwd_scan(p00, p01, p10, p11, add_l, add_h, out_ptr, base, rel_l, rel_h, valid, x_l, x_h, K,
                          ROWS)  # fmt: skip


@triton.jit
def _pair_fwd_scan(
    p00, p01, p10, p11, add_l, add_h, out_ptr, base, rel_l, rel_h, valid, x_l, x_h,
    K: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """A forward tile's states from its step maps and adds (WT) and the state (x_l, x_h) entering it: stores
    them and returns the last."""
    rows = tl.arange(0, ROWS)
    head_row = (rows == 0)[None, None, :]
    add_l += tl.where(head_row, p00 * x_l[:, :, None] + p01 * x_h[:, :, None], 0.0)
    add_h += tl.where(head_row, p10 * x_l[:, :, None] + p11 * x_h[:, :, None], 0.0)
    _, _, _, _, h_l, h_h = tl.associative_scan((p00, p01, p10, p11, add_l, add_h), 2, _pair_compose)
    tl.store(out_ptr + base * K + rel_l, h_l.to(out_ptr.dtype.element_ty), mask=valid)
    tl.store(out_ptr + base * K + rel_h, h_h.to(out_ptr.dtype.element_ty), mask=valid)
    last = (rows == ROWS - 1)[None, None, :]
    return _last_step(h_l, last), _last_step(h_h, last)


@triton.jit
def _pair_bwd_kernel(
    theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, perm_ptr, sgn_ptr, p2p_ptr, carry_ptr,
    dtheta_ptr, dscale_ptr, dgamma_ptr, db_ptr, dh0_ptr,
    T, n, n_hblocks, NC, CHUNK,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, CARRY_IN: tl.constexpr, FP64: tl.constexpr,
    STAGES: tl.constexpr, UNROLL: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """:func:`_bwd_kernel` for R = 1 with a pair per thread: with y = L_t(h_{t-1}) and u = c_t lam_t,
    dtheta = u_lo dy_lo/dtheta + u_hi dy_hi/dtheta and the carry L_t^T u, one cos / sin per pair and step;
    with PREFETCH a step's loads go out one step ahead (:func:`_pair_bwd_step_inputs`)."""
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NC
    bi, heads, m, lo, hi, sign_lo, sign_hi, live = _pair_tile_start(
        pid // NC, n, n_hblocks, perm_ptr, p2p_ptr, sgn_ptr, K, HALF, BLOCK_H, BLOCK_K, WT
    )
    if CARRY_IN:
        at = (((bi * NC + c) * n + heads) * K)[:, None]
        u_l = tl.load(carry_ptr + at + lo[None, :], mask=live, other=0.0).to(WT)
        u_h = tl.load(carry_ptr + at + hi[None, :], mask=live, other=0.0).to(WT)
    else:
        u_l = tl.zeros((BLOCK_H, BLOCK_K // 2), dtype=tl.float32).to(WT)
        u_h = u_l
    state = ((bi * n + heads) * K)[:, None]
    last = c * CHUNK + CHUNK - 1
    if PREFETCH:
        ahead = _pair_bwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, last, T,
                                      n, heads, m, lo, hi, live, state, HALF, K, HAS_SCALE, HAS_DECAY,
                                      WT)  # fmt: skip
    for s in tl.range(0, CHUNK, num_stages=STAGES, loop_unroll_factor=UNROLL):
        t = last - s
        alive = (heads < n) & (heads * 0 + t < T)
        step = live & alive[:, None]
        row = (bi * T + t) * n + heads
        at_l = (row * K)[:, None] + lo[None, :]
        at_h = (row * K)[:, None] + hi[None, :]
        if PREFETCH:
            grad_l, grad_h, xs_l, xs_h, th, scale, gamma = ahead
            ahead = _pair_bwd_step_inputs(theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi,
                                          t - 1, T, n, heads, m, lo, hi, live, state, HALF, K, HAS_SCALE,
                                          HAS_DECAY, WT)  # fmt: skip
            lam_l = u_l + grad_l.to(WT)
            lam_h = u_h + grad_h.to(WT)
            tl.store(db_ptr + at_l, lam_l.to(db_ptr.dtype.element_ty), mask=step)
            tl.store(db_ptr + at_h, lam_h.to(db_ptr.dtype.element_ty), mask=step)
            xs_l = xs_l.to(WT) * sign_lo[None, :]
            xs_h = xs_h.to(WT) * sign_hi[None, :]
            th = th.to(WT)
            scale = scale.to(WT)
            gamma = gamma.to(WT)
        else:
            lam_l = u_l + tl.load(grad_ptr + at_l, mask=step, other=0.0).to(WT)
            lam_h = u_h + tl.load(grad_ptr + at_h, mask=step, other=0.0).to(WT)
            tl.store(db_ptr + at_l, lam_l.to(db_ptr.dtype.element_ty), mask=step)
            tl.store(db_ptr + at_h, lam_h.to(db_ptr.dtype.element_ty), mask=step)
            first = (heads * 0 + t == 0)[:, None]
            xs_l = tl.load(out_ptr + at_l - n * K, mask=step & ~first, other=0.0).to(WT)
            xs_h = tl.load(out_ptr + at_h - n * K, mask=step & ~first, other=0.0).to(WT)
            xs_l += tl.load(h0_ptr + state + lo[None, :], mask=step & first, other=0.0).to(WT)
            xs_h += tl.load(h0_ptr + state + hi[None, :], mask=step & first, other=0.0).to(WT)
            xs_l = xs_l * sign_lo[None, :]
            xs_h = xs_h * sign_hi[None, :]
            th = tl.load(theta_ptr + (row * HALF)[:, None] + m[None, :], mask=step, other=0.0).to(WT)
            scale, gamma = _load_gates(scale_ptr, gamma_ptr, row, alive, HAS_SCALE, HAS_DECAY, WT)
        # this loop keeps Triton's cos and sin, its indexing and one step per iteration: rewritten like the
        # forward pair kernels (pointers moved per step, h0 picked by a where, sincos) it ran 8% faster in
        # float32 but 1.6x slower in bfloat16 (H100, (8, 4096, 16, 16), chunks of 32); on 4-step tiles
        # (a scan of the maps one step later in time, loaded again) 1.3x-1.4x slower in both (86 / 70 us
        # against 63 / 54 us, H100, k = 16); which part slowed either is not known
        cs = tl.cos(th)
        sn = tl.sin(th)
        y_l = cs * xs_l - sn * xs_h
        y_h = sn * xs_l + cs * xs_h
        dc = tl.sum(lam_l * y_l + lam_h * y_h, axis=1)
        factor = _gate_grads(dscale_ptr, dgamma_ptr, scale, gamma, row, alive, dc, HAS_SCALE, HAS_DECAY,
                             WT)[:, None]  # fmt: skip
        g_l = lam_l * factor
        g_h = lam_h * factor
        dtheta = g_h * y_l - g_l * y_h
        tl.store(dtheta_ptr + (row * HALF)[:, None] + m[None, :], dtheta.to(dtheta_ptr.dtype.element_ty),
                 mask=step)  # fmt: skip
        u_l = (cs * g_l + sn * g_h) * sign_lo[None, :]
        u_h = (cs * g_h - sn * g_l) * sign_hi[None, :]
    first = live & (heads * 0 + c == 0)[:, None]
    tl.store(dh0_ptr + state + lo[None, :], u_l.to(dh0_ptr.dtype.element_ty), mask=first)
    tl.store(dh0_ptr + state + hi[None, :], u_h.to(dh0_ptr.dtype.element_ty), mask=first)


@triton.jit
def _pair_bwd_step_inputs(
    theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, bi, t, T, n, heads, m, lo, hi, live, state,
    HALF: tl.constexpr, K: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """Step t's loads for :func:`_pair_bwd_kernel`, each in its input's dtype: (the output gradient's lo and
    hi entries, h_{t-1}'s (h0 at t = 0, through one load each), theta, scale, gamma); masked outside
    [0, T)."""
    alive = (heads < n) & (heads * 0 + t < T) & (heads * 0 + t >= 0)
    step = live & alive[:, None]
    row = (bi * T + t) * n + heads
    at_l = (row * K)[:, None] + lo[None, :]
    at_h = (row * K)[:, None] + hi[None, :]
    grad_l = tl.load(grad_ptr + at_l, mask=step, other=0.0)
    grad_h = tl.load(grad_ptr + at_h, mask=step, other=0.0)
    first = (heads * 0 + t == 0)[:, None]
    prev_l = tl.load(
        tl.where(first, h0_ptr + state + lo[None, :], out_ptr + at_l - n * K), mask=step, other=0.0
    )
    prev_h = tl.load(
        tl.where(first, h0_ptr + state + hi[None, :], out_ptr + at_h - n * K), mask=step, other=0.0
    )
    th = tl.load(theta_ptr + (row * HALF)[:, None] + m[None, :], mask=step, other=0.0)
    scale, gamma = _gate_loads(scale_ptr, gamma_ptr, row, alive, HAS_SCALE, HAS_DECAY, WT)
    return grad_l, grad_h, prev_l, prev_h, th, scale, gamma


@triton.jit
def _pair_compose(a00, a01, a10, a11, a_l, a_h, b00, b01, b10, b11, b_l, b_h):
    """Pair map (B, b) after pair map (A, a): x -> B (A x + a) + b, for 2 x 2 blocks and pair vectors."""
    return (
        b00 * a00 + b01 * a10, b00 * a01 + b01 * a11, b10 * a00 + b11 * a10, b10 * a01 + b11 * a11,
        b00 * a_l + b01 * a_h + b_l, b10 * a_l + b11 * a_h + b_h,
    )  # fmt: skip


@triton.jit
def _pair_apply(a00, a01, a10, a11, a_l, a_h, x_l, x_h):
    """The pair map (A, a) applied to (x_l, x_h), in explicit fused multiply-adds. The look-back publishes
    and replays carries through this one formula: left to the compiler, a00 x_l + a01 x_h + a_l can be
    contracted differently at two sites (with that form an H100 gave gradients that changed between calls)."""
    return tl.fma(a00, x_l, tl.fma(a01, x_h, a_l)), tl.fma(a10, x_l, tl.fma(a11, x_h, a_h))


@triton.jit
def _last_step(x, last):
    """The last step of a tile whose steps are its last dimension (``last`` marks it): the pair kernels'
    (BLOCK_H, BLOCK_K // 2, ROWS) tiles and the single pass's (BLOCK_Q, BLOCK_T) ones."""
    return tl.sum(tl.where(last, x, 0.0), axis=-1)


@triton.jit
def _lookback_tile_start(
    flag_ptr, perm_ptr, p2p_ptr, sgn_ptr, n, n_hblocks, CHAINS, NT,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """A single-pass program's tile, taken in launch order from the counter ``flag_ptr[CHAINS * NT]``:
    tile = place CHAINS + chain, chain = (batch bi, head block hb). Its BLOCK_Q = BLOCK_H BLOCK_K / 2 columns
    hold slot m of head j in column j BLOCK_K / 2 + m, lanes lo < hi as in :func:`_pair_tile_start`. Returns
    (tile, place, bi, hb, heads, m, lo, hi (BLOCK_Q,), sgn[0, lo], sgn[0, hi], live columns)."""
    SLOTS: tl.constexpr = BLOCK_K // 2
    tile = tl.atomic_add(flag_ptr + CHAINS * NT, 1).to(tl.int64)
    place = tile // CHAINS
    chain = tile % CHAINS
    hb = (chain % n_hblocks).to(tl.int32)
    bi = chain // n_hblocks
    q = tl.arange(0, BLOCK_H * SLOTS)
    m = q % SLOTS
    heads = hb * BLOCK_H + q // SLOTS
    lanes = tl.arange(0, BLOCK_K)
    partner = tl.load(perm_ptr + lanes, mask=lanes < K, other=0).to(tl.int32)
    number = tl.load(p2p_ptr + lanes, mask=(lanes < K) & (lanes < partner), other=-1).to(tl.int32)
    match = number[None, :] == m[:, None]
    lo = tl.sum(tl.where(match, lanes[None, :], 0), axis=1)
    hi = tl.sum(tl.where(match, partner[None, :], 0), axis=1)
    live = (heads < n) & (m < HALF)
    sign_lo = tl.load(sgn_ptr + lo, mask=live, other=1.0).to(WT)
    sign_hi = tl.load(sgn_ptr + hi, mask=live, other=1.0).to(WT)
    return tile, place, bi, hb, heads, m, lo, hi, sign_lo, sign_hi, live


@triton.jit
def _pair_angles(
    theta_ptr, scale_ptr, gamma_ptr, theta_at, gate_at, mask,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, WT: tl.constexpr,
):  # fmt: skip
    """(cos, sin, c) of a tile's angles at ``theta_at`` and gates at ``gate_at``: c = scale^[HAS_SCALE]
    gamma^[HAS_DECAY] (1 where ``mask`` is off)."""
    th = tl.load(theta_ptr + theta_at, mask=mask, other=0.0).to(WT)
    factor = tl.full(th.shape, 1.0, tl.float32).to(WT)
    if HAS_SCALE:
        factor = factor * tl.load(scale_ptr + gate_at, mask=mask, other=1.0).to(WT)
    if HAS_DECAY:
        factor = factor * tl.load(gamma_ptr + gate_at, mask=mask, other=1.0).to(WT)
    sn, cs = sincos(th)
    return cs, sn, factor


@triton.jit
def _lookback_carry(
    agg_ptr, inc_ptr, flag_ptr, tile, place, CHAINS, NT, q, d00, d01, d10, d11, d_l, d_h, init_l, init_h,
    SPARSE: tl.constexpr, REPLAY: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    """The decoupled look-back of a single-pass tile with summary (d, the composed pair map of its steps):
    the carry (c_l, c_h) entering the tile (``init`` for the chain's first tile). Publishes the summary
    (6 numbers per column, status 1), walks back along its chain to the nearest tile with a published final
    state (status 2), waiting at a tile with no status yet, replays the REPLAY-at-a-time loaded summaries in
    between in walk order, then publishes its own final state d(carry) (on every SPARSE-th tile; not on the
    chain's last). Publishing and replaying both go through :func:`_pair_apply`, so the carry is the same bits
    whichever tile the walk stopped at. ``agg`` (tiles, 6, BLOCK_Q) and ``inc`` (tiles, 2, BLOCK_Q) are in the
    carry dtype."""
    status = flag_ptr + tile
    if place == 0:
        c_l, c_h = init_l, init_h
    else:
        slot = agg_ptr + tile * 6 * BLOCK_Q + q
        tl.store(slot, d00)
        tl.store(slot + BLOCK_Q, d01)
        tl.store(slot + 2 * BLOCK_Q, d10)
        tl.store(slot + 3 * BLOCK_Q, d11)
        tl.store(slot + 4 * BLOCK_Q, d_l)
        tl.store(slot + 5 * BLOCK_Q, d_h)
        tl.debug_barrier()
        tl.atomic_xchg(status, 1, sem="release")
        found = tile - CHAINS
        seen = tl.atomic_add(flag_ptr + found, 0, sem="acquire")
        while seen != 2:
            found = tl.where(seen == 1, found - CHAINS, found)
            seen = tl.atomic_add(flag_ptr + found, 0, sem="acquire")
        c_l = tl.load(inc_ptr + found * 2 * BLOCK_Q + q, cache_modifier=".cg")
        c_h = tl.load(inc_ptr + found * 2 * BLOCK_Q + BLOCK_Q + q, cache_modifier=".cg")
        # a summary past the tile's own place loads as the identity map
        for start in range(found + CHAINS, tile, CHAINS * REPLAY):
            for i in tl.static_range(REPLAY):
                idx = start + CHAINS * i
                use = (q * 0 + idx) < tile
                slot = agg_ptr + idx * 6 * BLOCK_Q + q
                a00 = tl.load(slot, mask=use, other=1.0, cache_modifier=".cg")
                a01 = tl.load(slot + BLOCK_Q, mask=use, other=0.0, cache_modifier=".cg")
                a10 = tl.load(slot + 2 * BLOCK_Q, mask=use, other=0.0, cache_modifier=".cg")
                a11 = tl.load(slot + 3 * BLOCK_Q, mask=use, other=1.0, cache_modifier=".cg")
                a_l = tl.load(slot + 4 * BLOCK_Q, mask=use, other=0.0, cache_modifier=".cg")
                a_h = tl.load(slot + 5 * BLOCK_Q, mask=use, other=0.0, cache_modifier=".cg")
                c_l, c_h = _pair_apply(a00, a01, a10, a11, a_l, a_h, c_l, c_h)
    if (place < NT - 1) & (place % SPARSE == 0):
        e_l, e_h = _pair_apply(d00, d01, d10, d11, d_l, d_h, c_l, c_h)
        tl.store(inc_ptr + tile * 2 * BLOCK_Q + q, e_l)
        tl.store(inc_ptr + tile * 2 * BLOCK_Q + BLOCK_Q + q, e_h)
        tl.debug_barrier()
        tl.atomic_xchg(status, 2, sem="release")
    return c_l, c_h


@triton.jit
def _pair_lookback_kernel(
    theta_ptr, scale_ptr, gamma_ptr, b_ptr, h0_ptr, perm_ptr, sgn_ptr, p2p_ptr, out_ptr,
    agg_ptr, inc_ptr, flag_ptr, T, n, n_hblocks, CHAINS, NT,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, FP64: tl.constexpr,
    SPARSE: tl.constexpr, REPLAY: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """The R = 1 forward in one pass: one program per tile of BLOCK_T steps x BLOCK_H heads
    (:func:`_lookback_tile_start`). Step t is the pair map x -> P_t x + b_t with
    P_t = c_t [[cos sgn_lo, -sin sgn_hi], [sin sgn_lo, cos sgn_hi]]. The tile composes its steps with an
    associative scan (M_t, e_t: the product P_t ... P_first and the zero-start state), takes its carry by
    look-back (:func:`_lookback_carry`; h0 for the first tile) and writes h_t = M_t carry + e_t. Steps past T
    (last tile only) compose sign flips: neither published nor stored. Tiles are (pairs, steps), the steps
    last: with no contiguous access the compiler spreads threads over the leading dimension first, so a
    warp's threads hold whole pairs and the scan runs in their registers."""
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    BLOCK_Q: tl.constexpr = BLOCK_H * (BLOCK_K // 2)
    tile, place, bi, _, heads, m, lo, hi, sign_lo, sign_hi, live = _lookback_tile_start(
        flag_ptr, perm_ptr, p2p_ptr, sgn_ptr, n, n_hblocks, CHAINS, NT, K, HALF, BLOCK_H, BLOCK_K, WT
    )
    # Addresses: an int64 base at the tile's first step plus int32 offsets inside the tile.
    steps = tl.arange(0, BLOCK_T)
    t0 = place * BLOCK_T
    step = live[:, None] & ((t0 + steps) < T)[None, :]
    base = (bi * T + t0) * n
    rows = heads[:, None] + (steps * n)[None, :]
    cs, sn, factor = _pair_angles(theta_ptr, scale_ptr, gamma_ptr, base * HALF + rows * HALF + m[:, None],
                                  base + rows, step, HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    cs, sn = cs * factor, sn * factor
    at_l = base * K + rows * K + lo[:, None]
    at_h = base * K + rows * K + hi[:, None]
    add_l = tl.load(b_ptr + at_l, mask=step, other=0.0).to(WT)
    add_h = tl.load(b_ptr + at_h, mask=step, other=0.0).to(WT)
    m00, m01, m10, m11, e_l, e_h = tl.associative_scan(
        (cs * sign_lo[:, None], -sn * sign_hi[:, None], sn * sign_lo[:, None], cs * sign_hi[:, None], add_l,
         add_h), 1, _pair_compose
    )  # fmt: skip
    last = (steps == BLOCK_T - 1)[None, :]
    at = (bi * n + heads) * K
    c_l, c_h = _lookback_carry(
        agg_ptr, inc_ptr, flag_ptr, tile, place, CHAINS, NT, tl.arange(0, BLOCK_Q),
        _last_step(m00, last), _last_step(m01, last), _last_step(m10, last), _last_step(m11, last),
        _last_step(e_l, last), _last_step(e_h, last),
        tl.load(h0_ptr + at + lo, mask=live, other=0.0).to(WT),
        tl.load(h0_ptr + at + hi, mask=live, other=0.0).to(WT), SPARSE, REPLAY, BLOCK_Q,
    )  # fmt: skip
    h_l = m00 * c_l[:, None] + m01 * c_h[:, None] + e_l
    h_h = m10 * c_l[:, None] + m11 * c_h[:, None] + e_h
    tl.store(out_ptr + at_l, h_l.to(out_ptr.dtype.element_ty), mask=step)
    tl.store(out_ptr + at_h, h_h.to(out_ptr.dtype.element_ty), mask=step)


@triton.jit
def _pair_lookback_bwd_kernel(
    theta_ptr, scale_ptr, gamma_ptr, h0_ptr, out_ptr, grad_ptr, perm_ptr, sgn_ptr, p2p_ptr,
    dtheta_ptr, dscale_ptr, dgamma_ptr, db_ptr, dh0_ptr, agg_ptr, inc_ptr, flag_ptr,
    T, n, n_hblocks, CHAINS, NT,
    K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_DECAY: tl.constexpr, FP64: tl.constexpr,
    SPARSE: tl.constexpr, REPLAY: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """The R = 1 adjoint in one pass, walking T backwards (walk step w at time t = T - 1 - w), tiles as in
    :func:`_pair_lookback_kernel`. The adjoint lam_t = dh_t + P_{t+1}^T lam_{t+1} (db = lam) is a pair scan
    whose map at walk step w is P^T one step later in time (none at t = T - 1); with lam known, each step's
    gradients are :func:`_pair_bwd_kernel`'s: y = L_t(h_{t-1}) (h0 before t = 0), dc = lam . y per head,
    dtheta = c (lam_hi y_lo - lam_lo y_hi), dh0 = P_0^T lam_0."""
    WT: tl.constexpr = tl.float64 if FP64 else tl.float32
    SLOTS: tl.constexpr = BLOCK_K // 2
    BLOCK_Q: tl.constexpr = BLOCK_H * SLOTS
    tile, place, bi, hb, heads, m, lo, hi, sign_lo, sign_hi, live = _lookback_tile_start(
        flag_ptr, perm_ptr, p2p_ptr, sgn_ptr, n, n_hblocks, CHAINS, NT, K, HALF, BLOCK_H, BLOCK_K, WT
    )
    steps = tl.arange(0, BLOCK_T)
    walk = place * BLOCK_T + steps
    valid = walk < T
    step = live[:, None] & valid[None, :]
    # Addresses: an int64 base at the tile's latest time plus int32 offsets inside the tile (time t0 - s).
    t0 = T - 1 - place * BLOCK_T
    base = (bi * T + t0) * n
    rows = heads[:, None] + (-steps * n)[None, :]
    later = step & (walk > 0)[None, :]
    ahead = base + n + rows
    cs, sn, factor = _pair_angles(theta_ptr, scale_ptr, gamma_ptr, ahead * HALF + m[:, None], ahead, later,
                                  HAS_SCALE, HAS_DECAY, WT)  # fmt: skip
    cs, sn = cs * factor, sn * factor
    at_l = base * K + rows * K + lo[:, None]
    at_h = base * K + rows * K + hi[:, None]
    add_l = tl.load(grad_ptr + at_l, mask=step, other=0.0).to(WT)
    add_h = tl.load(grad_ptr + at_h, mask=step, other=0.0).to(WT)
    m00, m01, m10, m11, e_l, e_h = tl.associative_scan(
        (cs * sign_lo[:, None], sn * sign_lo[:, None], -sn * sign_hi[:, None], cs * sign_hi[:, None], add_l,
         add_h), 1, _pair_compose
    )  # fmt: skip
    last = (steps == BLOCK_T - 1)[None, :]
    zero = tl.zeros((BLOCK_Q,), dtype=tl.float32).to(WT)
    c_l, c_h = _lookback_carry(
        agg_ptr, inc_ptr, flag_ptr, tile, place, CHAINS, NT, tl.arange(0, BLOCK_Q),
        _last_step(m00, last), _last_step(m01, last), _last_step(m10, last), _last_step(m11, last),
        _last_step(e_l, last), _last_step(e_h, last), zero, zero, SPARSE, REPLAY, BLOCK_Q,
    )  # fmt: skip
    lam_l = m00 * c_l[:, None] + m01 * c_h[:, None] + e_l
    lam_h = m10 * c_l[:, None] + m11 * c_h[:, None] + e_h
    tl.store(db_ptr + at_l, lam_l.to(db_ptr.dtype.element_ty), mask=step)
    tl.store(db_ptr + at_h, lam_h.to(db_ptr.dtype.element_ty), mask=step)
    # The step's own gradients: the state one step back in time (h0 at t = 0), its rotation, the gates.
    first = (t0 - steps == 0)[None, :]
    state = (bi * n + heads) * K
    xs_l = tl.load(out_ptr + at_l - n * K, mask=step & ~first, other=0.0).to(WT)
    xs_h = tl.load(out_ptr + at_h - n * K, mask=step & ~first, other=0.0).to(WT)
    xs_l += tl.load(h0_ptr + (state + lo)[:, None] + rows * 0, mask=step & first, other=0.0).to(WT)
    xs_h += tl.load(h0_ptr + (state + hi)[:, None] + rows * 0, mask=step & first, other=0.0).to(WT)
    xs_l = xs_l * sign_lo[:, None]
    xs_h = xs_h * sign_hi[:, None]
    theta_at = base * HALF + rows * HALF + m[:, None]
    cs, sn, factor = _pair_angles(theta_ptr, scale_ptr, gamma_ptr, theta_at, base + rows, step, HAS_SCALE,
                                  HAS_DECAY, WT)  # fmt: skip
    y_l = cs * xs_l - sn * xs_h
    y_h = sn * xs_l + cs * xs_h
    dc = tl.sum(tl.reshape(lam_l * y_l + lam_h * y_h, (BLOCK_H, SLOTS, BLOCK_T)), axis=1)
    own = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    gate_at = base + own[:, None] + (-steps * n)[None, :]
    gate_live = (own < n)[:, None] & valid[None, :]
    scale, gamma = _load_gates(scale_ptr, gamma_ptr, gate_at, gate_live, HAS_SCALE, HAS_DECAY, WT)
    _gate_grads(dscale_ptr, dgamma_ptr, scale, gamma, gate_at, gate_live, dc, HAS_SCALE, HAS_DECAY, WT)
    g_l = lam_l * factor
    g_h = lam_h * factor
    tl.store(dtheta_ptr + theta_at, (g_h * y_l - g_l * y_h).to(dtheta_ptr.dtype.element_ty), mask=step)
    u_l = (cs * g_l + sn * g_h) * sign_lo[:, None]
    u_h = (cs * g_h - sn * g_l) * sign_hi[:, None]
    tl.store(dh0_ptr + (state + lo)[:, None] + rows * 0, u_l.to(dh0_ptr.dtype.element_ty), mask=step & first)
    tl.store(dh0_ptr + (state + hi)[:, None] + rows * 0, u_h.to(dh0_ptr.dtype.element_ty), mask=step & first)


_INDEX_DTYPES = (torch.int32, torch.int64)


def _common_case(
    theta: Tensor, scale: Tensor, gamma: Tensor, b: Tensor, h0: Tensor, perm: Tensor, sgn: Tensor, p2p: Tensor
) -> Any:
    """The recipe key of common, valid inputs, else False: plain tensors of the shapes :func:`_check` asks
    for, theta, scale, gamma, b and h0 of one floating dtype on one CUDA device (a device type recipes
    serve), the layout there (perm, p2p int32 / int64, sgn floating), within :func:`angle_envelope`, with
    R >= 1 and no empty input. The key is (b's shape, its dtype, R, the layout's dtypes). Callers skip their
    detailed checks where it holds: those name what is wrong, and cost tens of microseconds of host time per
    call."""
    if type(b) not in _PLAIN or type(perm) not in _PLAIN or b.dim() != 4 or perm.dim() != 2:
        return False
    if b.dtype not in FLOAT_DTYPES:
        return False
    device = _recipes.device_key(b)
    if device is None:
        return False
    batch, steps, heads, k = shape = b.shape
    layers, dtype = perm.shape[0], b.dtype
    if k % 2 or not 2 <= k <= MAX_K or not 1 <= layers <= MAX_LAYERS or batch * steps * heads == 0:
        return False
    for x in (theta, scale, gamma, h0, perm, sgn, p2p):
        if type(x) not in _PLAIN or not _recipes.on_device(x, device):
            return False
    rows = (batch, steps, heads)
    if theta.shape != (*rows, layers, k // 2) or scale.shape != rows or gamma.shape != rows:
        return False
    if h0.shape != (batch, heads, k) or theta.dtype != dtype or scale.dtype != dtype:
        return False
    if gamma.dtype != dtype or h0.dtype != dtype or perm.shape != (layers, k):
        return False
    if sgn.shape != (layers, k) or p2p.shape != (layers, k) or sgn.dtype not in FLOAT_DTYPES:
        return False
    if perm.dtype not in _INDEX_DTYPES or p2p.dtype not in _INDEX_DTYPES:
        return False
    return shape, dtype, layers, perm.dtype, sgn.dtype, p2p.dtype


def _adjoint_case(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    h0: Tensor,
    out: Tensor,
    grad_out: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
) -> Any:
    """:func:`_common_case` of the adjoint's inputs (``out`` in b's place), with ``grad_out`` a plain tensor
    like ``out``; its key, else False."""
    key = _common_case(theta, scale, gamma, out, h0, perm, sgn, p2p)
    same = type(grad_out) in _PLAIN and grad_out.shape == out.shape and grad_out.dtype == out.dtype
    return key if same and grad_out.device == out.device else False


def _check(
    theta: Tensor, scale: Tensor, gamma: Tensor, b: Tensor, h0: Tensor, perm: Tensor, sgn: Tensor, p2p: Tensor
) -> None:
    check_angle_inputs(theta, scale, gamma, b, h0, perm, sgn, p2p)
    if not on_kernel_device(b):
        raise ValueError(
            f"b must be a CUDA tensor (or a CPU tensor under TRITON_INTERPRET=1) for the angle kernel, "
            f"got device {b.device}"
        )
    reason = angle_envelope(theta, b)
    if reason is not None:
        raise ValueError(reason)


def _meta(b: Tensor, layers: int) -> dict[str, int]:
    k = b.shape[-1]
    return {"K": k, "HALF": k // 2, "R": layers, "BLOCK_K": next_pow2(k), "FP64": is_fp64(b)}


def _fold(add: Tensor) -> int:
    """FOLD of :func:`_pair_summary_kernel`: 1 for 4- and 8-byte inputs, whose tiles it composes with a
    fold of neighbouring steps, 0 for 2-byte ones (scan and last-step pick). On an H100 at (8, 4096, 16, k,
    1), k = 8 to 64, the fold ran float32 1.04x-1.09x faster forward and 1.01x-1.04x forward + backward;
    for bfloat16 it was 1.18x-1.28x slower (k = 16 and 64)."""
    return int(add.element_size() >= 4)


def _work_dtype(b: Tensor) -> torch.dtype:
    return torch.float64 if b.dtype == torch.float64 else torch.float32


def _replay(
    plan: _Plan, heads: int, meta: dict[str, int], vector: object, pair: object
) -> tuple[object, int, dict[str, int]]:
    """(kernel, head blocks, tile constants and warps) of the replay (phase 3, or the whole sequential walk):
    the pair kernel with ``plan.pairs``' tile where the plan has one and :data:`PAIR_REPLAYS` is set, else
    the vector path with ``plan.block_h`` heads."""
    if plan.pairs is not None and PAIR_REPLAYS:
        pair_h, pair_warps = plan.pairs
        tile = {k: meta[k] for k in ("K", "HALF", "BLOCK_K", "FP64")}
        tile.update(BLOCK_H=pair_h, PREFETCH=plan.prefetch, num_warps=pair_warps)
        return pair, cdiv(heads, pair_h), tile
    warps = _warps(plan.block_h * meta["BLOCK_K"])
    # the pair summaries' prefetch is theirs: the vector replays after them load in the step
    prefetch = plan.prefetch if plan.pairs is None else 0
    tile = {**meta, "BLOCK_H": plan.block_h, "PREFETCH": prefetch, "num_warps": warps}
    return vector, cdiv(heads, plan.block_h), tile


def _carries(
    plan: _Plan,
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    add: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    meta: dict[str, int],
    flags: dict[str, int],
    reverse: int,
) -> Tensor:
    """Phases 1 and 2 of the chunked strategy: the carry (B, NC, n, k) entering each chunk, forward from h0
    (``add`` = b) or, with ``reverse``, the adjoint carry from the sequence's end (``add`` = the output
    gradient). The summaries are the pair blocks where ``plan.pairs`` is set, else k x k matrices."""
    batch, steps, heads, k = add.shape
    chunks, chunk, work = cdiv(steps, plan.chunk), plan.chunk, _work_dtype(add)
    carries = torch.empty(batch, chunks, heads, k, device=add.device, dtype=work)
    loops = {"STAGES": plan.stages, "UNROLL": plan.unroll}
    common = {"K": k, "BLOCK_K": meta["BLOCK_K"], "REVERSE": reverse, "FP64": meta["FP64"]}
    if plan.pairs is not None:
        loops["UNROLL"] = 1  # the tiles take several steps per iteration already
        pair_h, pair_warps = plan.pairs
        pairs = torch.empty(3, batch, chunks, heads, k, device=add.device, dtype=work)
        # the plane's size without indexing pairs: a CPU-only torch cannot index a fake CUDA tensor
        plane, n_blocks = batch * chunks * heads * k, cdiv(heads, pair_h)
        launch(_pair_summary_kernel, (batch * n_blocks * chunks,), theta, scale, gamma, add, perm, sgn, p2p,
               pairs, steps, heads, n_blocks, chunks, chunk, plane, HALF=meta["HALF"], BLOCK_H=pair_h,
               **common, **flags, **loops, ROWS=plan.rows, FOLD=_fold(add), PREFETCH=plan.prefetch,
               num_warps=pair_warps)  # fmt: skip
        launch(_pair_carry_kernel, (batch * n_blocks,), pairs, h0, carries, perm, sgn, p2p, heads, n_blocks,
               chunks, plane, HALF=meta["HALF"], BLOCK_H=pair_h, **common, STAGES=CARRY_STAGES,
               ROWS=plan.rows, num_warps=pair_warps)  # fmt: skip
        return carries
    mats = torch.empty(batch, heads, chunks, k, k, device=add.device, dtype=work)
    ends = torch.empty(batch, heads, chunks, k, device=add.device, dtype=work)
    sum_h, sum_c, sum_warps = plan.summary
    grid = (batch * cdiv(heads, sum_h) * (meta["BLOCK_K"] // sum_c) * chunks,)
    summary = _bwd_summary_kernel if reverse else _fwd_summary_kernel
    launch(summary, grid, theta, scale, gamma, add, perm, sgn, p2p, mats, ends, steps, heads,
           cdiv(heads, sum_h), chunks, chunk, **meta, BLOCK_H=sum_h, BLOCK_C=sum_c, **flags, **loops,
           num_warps=sum_warps)  # fmt: skip
    launch(_carry_kernel, (batch * heads,), mats, ends, h0, carries, heads, chunks, **common,
           STAGES=CARRY_STAGES, UNROLL=1, num_warps=_matrix_warps(meta["BLOCK_K"]))  # fmt: skip
    return carries


def _lookback(
    kernel: object, plan: _Plan, like: Tensor, args: tuple[Tensor, ...], flags: dict[str, int]
) -> None:
    """One launch of the single-pass ``kernel`` (:func:`_pair_lookback_kernel` or its adjoint; one program
    per tile) on ``args``, its tensors, with its summary and status buffers; ``like`` (B, T, n, k) gives the
    sizes and the carry dtype."""
    batch, steps, heads, k = like.shape
    assert plan.pairs is not None  # a lookback plan holds its tile (:func:`_plan`)
    block_h, warps = plan.pairs
    n_blocks = cdiv(heads, block_h)
    chains, tiles_per_chain = batch * n_blocks, cdiv(max(steps, 1), plan.chunk)
    tiles, columns, work = chains * tiles_per_chain, block_h * next_pow2(k) // 2, _work_dtype(like)
    agg = torch.empty(tiles * 6 * columns, device=like.device, dtype=work)
    inc = torch.empty(tiles * 2 * columns, device=like.device, dtype=work)
    status = torch.zeros(tiles + 1, device=like.device, dtype=torch.int32)
    launch(kernel, (tiles,), *args, agg, inc, status, steps, heads, n_blocks, chains, tiles_per_chain, K=k,
           HALF=k // 2, BLOCK_H=block_h, BLOCK_K=next_pow2(k), **flags, FP64=is_fp64(like),
           SPARSE=sparse_every(), REPLAY=LOOKBACK_REPLAY, BLOCK_T=plan.chunk, num_warps=warps)  # fmt: skip


def _forward(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    has_scale: int,
    has_decay: int,
) -> Tensor:
    """The forward's launches on checked inputs (the body of :func:`angle_scan_fwd` after its checks)."""
    theta, scale, gamma, b, h0 = (x.contiguous() for x in (theta, scale, gamma, b, h0))
    perm, sgn, p2p = perm.contiguous(), sgn.contiguous(), p2p.contiguous()
    batch, steps, heads, k = b.shape
    meta = _meta(b, perm.shape[0])
    flags = {"HAS_SCALE": int(bool(has_scale)), "HAS_DECAY": int(bool(has_decay))}
    out = torch.empty_like(b)
    plan = _plan(batch, steps, heads, k, meta["R"], b.device, b.element_size())
    if plan.strategy == "lookback":
        _lookback(_pair_lookback_kernel, plan, b, (theta, scale, gamma, b, h0, perm, sgn, p2p, out), flags)
        return out
    loops = {"STAGES": plan.stages, "UNROLL": plan.unroll}
    if plan.strategy == "chunked":
        chunks, chunk = cdiv(steps, plan.chunk), plan.chunk
        carries = _carries(plan, theta, scale, gamma, b, h0, perm, sgn, p2p, meta, flags, reverse=0)
    else:
        chunks, chunk, carries = 1, max(steps, 1), h0
    kernel, n_hblocks, tile = _replay(plan, heads, meta, _fwd_kernel, _pair_fwd_kernel)
    if kernel is _pair_fwd_kernel:
        tile["ROWS"] = plan.rows
        loops["UNROLL"] = 1  # the tiles take several steps per iteration already
    launch(kernel, (batch * n_hblocks * chunks,), theta, scale, gamma, b, carries, perm, sgn, p2p, out,
           steps, heads, n_hblocks, chunks, chunk, **tile, **flags, **loops)  # fmt: skip
    return out


def _backward(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    h0: Tensor,
    out: Tensor,
    grad_out: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    has_scale: int,
    has_decay: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The adjoint's launches on checked inputs (the body of :func:`angle_scan_bwd` after its checks; the
    forward's ``b`` is not read: ``out`` has its shape)."""
    theta, scale, gamma, h0, out, grad_out = (
        x.contiguous() for x in (theta, scale, gamma, h0, out, grad_out)
    )
    perm, sgn, p2p = perm.contiguous(), sgn.contiguous(), p2p.contiguous()
    batch, steps, heads, k = out.shape
    meta = _meta(out, perm.shape[0])
    flags = {"HAS_SCALE": int(bool(has_scale)), "HAS_DECAY": int(bool(has_decay))}
    dtheta = torch.empty_like(theta)
    dscale = torch.zeros_like(scale)
    dgamma = torch.zeros_like(gamma)
    db = torch.empty_like(out)
    dh0 = torch.empty_like(h0)
    plan = _plan(batch, steps, heads, k, meta["R"], out.device, out.element_size())
    if plan.strategy == "lookback":
        args = (theta, scale, gamma, h0, out, grad_out, perm, sgn, p2p, dtheta, dscale, dgamma, db, dh0)
        _lookback(_pair_lookback_bwd_kernel, plan, out, args, flags)
        return dtheta, dscale, dgamma, db, dh0
    loops = {"STAGES": plan.stages, "UNROLL": plan.unroll}
    if plan.strategy == "chunked":
        chunks, chunk = cdiv(steps, plan.chunk), plan.chunk
        carries = _carries(plan, theta, scale, gamma, grad_out, h0, perm, sgn, p2p, meta, flags, reverse=1)
        carry_in = 1
    else:
        chunks, chunk, carries, carry_in = 1, max(steps, 1), h0, 0
    kernel, n_hblocks, tile = _replay(plan, heads, meta, _bwd_kernel, _pair_bwd_kernel)
    launch(kernel, (batch * n_hblocks * chunks,), theta, scale, gamma, h0, out, grad_out, perm, sgn, p2p,
           carries, dtheta, dscale, dgamma, db, dh0, steps, heads, n_hblocks, chunks, chunk, **tile, **flags,
           CARRY_IN=carry_in, **loops)  # fmt: skip
    return dtheta, dscale, dgamma, db, dh0


@triton_op("mingru::angle_scan_fwd", mutates_args=())
def angle_scan_fwd(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    has_scale: int,
    has_decay: int,
) -> Tensor:
    """Angle-fused forward scan -> h (B, T, n, k): h_t = c_t L_t(h_{t-1}) + b_t (module docstring).

    theta (B, T, n, R, k/2), scale / gamma (B, T, n) (read only when has_scale / has_decay), b (B, T, n, k),
    h0 (B, n, k), perm / p2p (R, k) int32 or int64, sgn (R, k) float. Raises TypeError/ValueError for bad
    shapes, dtypes or devices and ValueError outside :func:`angle_envelope`. Layout values are not checked.
    """
    if not _common_case(theta, scale, gamma, b, h0, perm, sgn, p2p):
        _check(theta, scale, gamma, b, h0, perm, sgn, p2p)
    forward = _BODIES[int(bool(has_scale)), int(bool(has_decay))][0]
    return forward(theta, scale, gamma, b, h0, perm, sgn, p2p)


@triton_op("mingru::angle_scan_bwd", mutates_args=())
def angle_scan_bwd(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    out: Tensor,
    grad_out: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    has_scale: int,
    has_decay: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Exact stored-state adjoint of :func:`angle_scan_fwd` -> (dtheta, dscale, dgamma, db, dh0).

    Reads h_{t-1} from the forward output ``out`` (B, T, n, k) (h0 for t = 1) and ``grad_out`` (B, T, n, k):
    lam_t = grad_out_t + c_{t+1} L_{t+1}^T lam_{t+1}, db = lam, dh0 = c_1 L_1^T lam_1,
    dc_t = lam_t . L_t(h_{t-1}) (dscale = dc * gamma^[has_decay], dgamma = dc * scale^[has_scale]) and dtheta
    through the layers. dscale / dgamma are zeros unless their flag is set. Raises as the forward does.
    """
    like_out = type(b) in _PLAIN and b.shape == out.shape and b.dtype == out.dtype and b.device == out.device
    if not (like_out and _adjoint_case(theta, scale, gamma, h0, out, grad_out, perm, sgn, p2p)):
        _check(theta, scale, gamma, b, h0, perm, sgn, p2p)
        for name, value in (("out", out), ("grad_out", grad_out)):
            if value.shape != b.shape or value.dtype != b.dtype or value.device != b.device:
                raise ValueError(
                    f"{name} must match b (shape {tuple(b.shape)}, {b.dtype}, {b.device}), got shape "
                    f"{tuple(value.shape)}, {value.dtype}, {value.device}"
                )
    backward = _BODIES[int(bool(has_scale)), int(bool(has_decay))][1]
    return backward(theta, scale, gamma, h0, out, grad_out, perm, sgn, p2p)


_Body = Callable[..., Any]


def _bodies(has_scale: int, has_decay: int) -> tuple[_Body, _Body]:
    """The forward's and the adjoint's launches with the flags bound, on checked inputs, each replayed from
    launch recipes per kind of input (:mod:`mingru_triton._recipes`; keys :func:`_common_case`,
    :func:`_adjoint_case`)."""
    name = f"angle_scan_{'scale_' if has_scale else ''}{'decay_' if has_decay else ''}"

    @_recipes.replayed(name + "fwd", _common_case)
    def forward(*inputs: Tensor) -> Tensor:
        theta, scale, gamma, b, h0, perm, sgn, p2p = inputs
        return _forward(theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale, has_decay)

    @_recipes.replayed(name + "bwd", _adjoint_case)
    def backward(*inputs: Tensor) -> tuple[Tensor, ...]:
        theta, scale, gamma, h0, out, grad_out, perm, sgn, p2p = inputs
        return _backward(theta, scale, gamma, h0, out, grad_out, perm, sgn, p2p, has_scale, has_decay)

    return forward, backward


_BODIES = {(s, d): _bodies(s, d) for s in (0, 1) for d in (0, 1)}
"""(forward, adjoint) bodies by (has_scale, has_decay): :func:`_forward` / :func:`_backward` with recipes."""


def _setup_context(ctx: object, inputs: tuple[object, ...], output: Tensor) -> None:
    theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale, has_decay = inputs
    ctx.save_for_backward(theta, scale, gamma, b, h0, output, perm, sgn, p2p)  # type: ignore[attr-defined]
    ctx.flags = (has_scale, has_decay)  # type: ignore[attr-defined]


def _backward_op(ctx: object, grad: Tensor | None) -> tuple[Tensor | None, ...]:
    theta, scale, gamma, b, h0, out, perm, sgn, p2p = ctx.saved_tensors  # type: ignore[attr-defined]
    grad = torch.zeros_like(out) if grad is None else grad.to(out.dtype)
    grads = angle_scan_bwd(theta, scale, gamma, b, h0, out, grad, perm, sgn, p2p, *ctx.flags)  # type: ignore[attr-defined]
    return (*grads, None, None, None, None, None)


angle_scan_fwd.register_autograd(_backward_op, setup_context=_setup_context)


def _eager(has_scale: int, has_decay: int) -> Callable[..., Tensor]:
    """:func:`angle_scan_fwd` with the flags bound, on the eager path: saves theta, scale, gamma, h0, the
    output and the layout (not b, which the adjoint does not read)."""
    name = f"AngleScan{'Scale' if has_scale else ''}{'Decay' if has_decay else ''}"

    def op(*inputs: Tensor) -> Tensor:
        theta, scale, gamma, b, h0, perm, sgn, p2p = inputs
        return angle_scan_fwd(theta, scale, gamma, b, h0, perm, sgn, p2p, has_scale, has_decay)

    forward_body, backward_body = _BODIES[has_scale, has_decay]

    def backward(*saved: Tensor) -> tuple[Tensor | None, ...]:
        theta, scale, gamma, h0, out, perm, sgn, p2p, grad = saved
        grad = grad.to(out.dtype)
        grads = backward_body(theta, scale, gamma, h0, out, grad, perm, sgn, p2p)
        return (*grads, None, None, None)

    return eager_path(
        name, op, forward_body, backward, lambda x, out: (x[0], x[1], x[2], x[4], out, x[5], x[6], x[7])
    )


_EAGER = {(s, d): _eager(s, d) for s in (0, 1) for d in (0, 1)}


def scan(
    theta: Tensor,
    scale: Tensor,
    gamma: Tensor,
    b: Tensor,
    h0: Tensor,
    perm: Tensor,
    sgn: Tensor,
    p2p: Tensor,
    has_scale: int,
    has_decay: int,
) -> Tensor:
    """``angle_scan_fwd(...)`` for the layers, eagerly without the op's dispatch
    (:func:`~mingru_triton._launch.eager_path`). The inputs must have passed the op's checks
    (``mingru_triton.impls.angle_scan_impl`` runs them): the eager bodies do not repeat them."""
    path = _EAGER[int(bool(has_scale)), int(bool(has_decay))]
    return path(theta, scale, gamma, b, h0, perm, sgn, p2p)
