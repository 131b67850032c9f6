"""Fused log-space scan kernels: h_t = exp(lc_t) h_{t-1} + exp(lb_t), combined in log space.

Ops (namespace ``mingru``):

- ``parallel_scan_log_fwd(log_coeffs (B, T, D), log_values (B, T+1, D)) -> h (B, T, D)``; slot 0 of
  ``log_values`` is log h_0, slots 1..T are log b_t. ``parallel_scan_log_bwd`` is its adjoint.
- ``log_recurrence_fwd(log_coeffs (B, T, D), log_b (B, T, D), h0 (B, D)) -> h (B, T, D)`` with h0 in linear
  space and of any sign: max(h0, 0) enters the log-space scan as log h0 and min(h0, 0) decays as
  exp(sum lc) min(h0, 0), both in the same pass. ``log_recurrence_bwd`` is its adjoint.

The forward decides per tile of (block_t steps x block_d channels). A tile whose lc are all <= 0 (every
a_t <= 1) is scanned in linear space: a = exp(lc), b = exp(lb), the linear combine, the carry kept as a log;
no running product there exceeds 1. Any other tile scans pairs (s, l) = (sum of lc, log of the zero-start
state) with the combine (s1, l1) then (s2, l2) -> (s1 + s2, logaddexp(l1 + s2, l2)), so a growing product
is never exponentiated. ``force_log_space`` takes the second path for every tile.
The backward runs in linear space, lam_t = g_t + a_{t+1} lam_{t+1}, so -inf inputs give exact zeros.

Two strategies, picked by :func:`_plan` from the shapes: "sequential" (one program per (row, channel
block) walks T in tiles, carrying the last state) and "chunked" (T split into chunks: one launch writes
per-chunk summaries, a second replays each chunk from the carry it composes from the summaries before it).
Both ops and their adjoints are also k = 1 recurrences with coefficients exp(lc) (initial state h0, or
exp(log_values[:, 0])): where the k = 1 heuristic picks its single-pass kernel or its pipelined walk
(:func:`mingru_triton.linear.scan_plan`), a k = 1 kernel runs them, reading the log inputs directly: the
forwards the split walk where the pipelined walk would run (enough chains), else the single pass; the
adjoints the single pass; under ``force_strategy("pipelined")`` the one-warp pipelined walk (slower here:
see :func:`_single_pass_plan`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op

from mingru._checks import check_float_tensor, check_same_device_dtype, check_shape
from mingru.scans.log import check_log_inputs
from mingru_triton import _recipes, linear
from mingru_triton._launch import (
    _PLAIN,
    DEFAULT_SMS,
    cdiv,
    common_case,
    eager_path,
    grad_or_zeros,
    is_fp64,
    launch,
    next_pow2,
    num_sms,
    on_kernel_device,
)

__all__ = [
    "force_log_space",
    "force_strategy",
    "log_envelope",
    "log_recurrence_bwd",
    "log_recurrence_fwd",
    "parallel_scan_log_bwd",
    "parallel_scan_log_fwd",
    "recurrence",
]

STRATEGIES = ("sequential", "chunked", "lookback", "pipelined", "split")
_MAX_GRID = 2**31 - 1
_MAX_STEPS = 2**31 - 1
_MAX_CHUNKS = 256

# ----------------------------------------------------------------------------------------------- kernels


@triton.jit
def _to_acc(x, FP64: tl.constexpr):
    y = x.to(tl.float64) if FP64 else x.to(tl.float32)
    return y


@triton.jit
def _full(BLOCK: tl.constexpr, value, FP64: tl.constexpr):
    y = tl.full([BLOCK], value, tl.float64) if FP64 else tl.full([BLOCK], value, tl.float32)
    return y


@triton.jit
def _logaddexp(x, y):
    hi = tl.maximum(x, y)
    lo = tl.minimum(x, y)
    shift = tl.where(hi == float("-inf"), 0.0, hi)
    return hi + tl.log(1.0 + tl.exp(lo - shift))


@triton.jit
def _safe_log(x):
    positive = x > 0
    return tl.where(positive, tl.log(tl.where(positive, x, 1.0)), float("-inf"))


@triton.jit
def _log_pair(s1, l1, s2, l2):
    return s1 + s2, _logaddexp(l1 + s2, l2)


@triton.jit
def _linear_pair(c1, v1, c2, v2):
    return c1 * c2, c2 * v1 + v2


@triton.jit
def _last_row(x, BLOCK_T: tl.constexpr):
    rows = tl.arange(0, BLOCK_T)
    return tl.sum(tl.where(rows[:, None] == BLOCK_T - 1, x, 0.0), axis=0)


@triton.jit
def _log_fwd_kernel(
    lc_ptr,
    b_ptr,
    h0_ptr,
    h_ptr,
    sum_ptr,
    end_ptr,
    gate_ptr,
    gate_at,
    T,
    D,
    stride_b_row,
    b_shift,
    stride_h0_row,
    n_chunks,
    chunk,
    n_tiles,
    H0_LOG: tl.constexpr,
    LEAN: tl.constexpr,
    MODE: tl.constexpr,
    REVERSE: tl.constexpr,
    LINEAR: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP64: tl.constexpr,
):
    """One (row, channel block, chunk). MODE 0: whole row; 1: write the chunk summary (sum lc, end log state
    from -inf); 2: compose the carry from the summaries of earlier chunks, then write h for the chunk.
    LINEAR: a tile whose log coefficients are all <= 0 is scanned in linear space (exp of each input, then
    the linear combine); other tiles, and every tile when LINEAR is 0, combine in log space. GATED: the
    program does nothing unless the int32 ``gate_ptr[gate_at]`` is nonzero (the single pass's fallback)."""
    if GATED:  # noqa: SIM102 (a constexpr test around a runtime one)
        if tl.load(gate_ptr + gate_at) == 0:
            return
    pid = tl.program_id(0).to(tl.int64)
    n_dblk = tl.cdiv(D, BLOCK_D)
    c = pid % n_chunks
    rest = pid // n_chunks
    dblk = rest % n_dblk
    row = rest // n_dblk
    start = 0
    end = T
    length = end - start
    i_lo = c * chunk
    i_hi = tl.minimum(i_lo + chunk, length)

    d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    lc_row = lc_ptr + row * T * D
    h_row = h_ptr + row * T * D
    b_row = b_ptr + row * stride_b_row + b_shift
    summary = (row * n_chunks) * D + d

    s_total = _full(BLOCK_D, 0.0, FP64)
    if MODE == 1:
        lh = _full(BLOCK_D, float("-inf"), FP64)
        ln = lh
    else:
        h0_src = b_ptr + row * stride_b_row + d if H0_LOG else h0_ptr + row * stride_h0_row + d
        h0 = _to_acc(tl.load(h0_src, mask=dmask, other=0.0), FP64)
        if H0_LOG:
            lh = h0
            ln = _full(BLOCK_D, float("-inf"), FP64)
        else:
            lh = _safe_log(h0)
            ln = _safe_log(-h0)
        if MODE == 2:
            for prev in range(0, n_chunks):
                earlier = dmask & ((d * 0 + prev) < c)
                s_prev = _to_acc(tl.load(sum_ptr + summary + prev * D, mask=earlier, other=0.0), FP64)
                e_prev = tl.load(end_ptr + summary + prev * D, mask=earlier, other=float("-inf"))
                lh = _logaddexp(s_prev + lh, _to_acc(e_prev, FP64))
                ln = ln + s_prev

    rows = tl.arange(0, BLOCK_T)
    for tile in range(0, n_tiles):
        i = i_lo + tile * BLOCK_T + rows
        tmask = i < i_hi
        t = end - 1 - i if REVERSE else start + i
        offs = t.to(tl.int64)[:, None] * D + d[None, :]
        mask = tmask[:, None] & dmask[None, :]
        lc = _to_acc(tl.load(lc_row + offs, mask=mask, other=0.0), FP64)
        lb = _to_acc(tl.load(b_row + offs, mask=mask, other=float("-inf")), FP64)
        linear = False
        if LINEAR:
            linear = tl.max(tl.max(lc, axis=1), axis=0) <= 0.0
        if linear:
            # Every coefficient of the tile is <= 1: no running product can overflow, and every term of the
            # positive part is >= 0, so the tile is scanned in linear space from one exp per input.
            p, z = tl.associative_scan((tl.exp(lc), tl.exp(lb)), 0, _linear_pair)
            pos = z + p * tl.exp(lh)[None, :]
            out = pos - p * tl.exp(ln)[None, :] if LEAN else pos
            lh = _safe_log(_last_row(pos, BLOCK_T))
        else:
            s, lz = tl.associative_scan((lc, lb), 0, _log_pair)
            lh_t = _logaddexp(s + lh[None, :], lz)
            out = tl.exp(lh_t) - tl.exp(ln[None, :] + s) if LEAN else tl.exp(lh_t)
            lh = _last_row(lh_t, BLOCK_T)
        if MODE != 1:
            tl.store(h_row + offs, out.to(h_ptr.dtype.element_ty), mask=mask)
        if LEAN or MODE == 1:
            s_last = tl.sum(lc, axis=0)
            ln = ln + s_last
            s_total = s_total + s_last
    if MODE == 1:
        tl.store(sum_ptr + summary + c * D, s_total, mask=dmask)
        tl.store(end_ptr + summary + c * D, lh, mask=dmask)


@triton.jit
def _log_bwd_kernel(
    lc_ptr,
    b_ptr,
    h0_ptr,
    h_ptr,
    g_ptr,
    dlc_ptr,
    db_ptr,
    dh0_ptr,
    prod_ptr,
    end_ptr,
    T,
    D,
    stride_b_row,
    b_shift,
    stride_h0_row,
    n_chunks,
    chunk,
    n_tiles,
    H0_LOG: tl.constexpr,
    MODE: tl.constexpr,
    REVERSE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP64: tl.constexpr,
):
    """Adjoint, walking time against the forward direction: lam_t = g_t + a_next lam_next; d lc_t =
    lam_t a_t h_prev; d lb_t = lam_t exp(lb_t); d h0 = a_first lam_first (times h0 when h0 is a log).
    MODE 0: whole row; 1: chunk summary (product of a_next, end lam from 0); 2: carry from the summaries
    of earlier chunks, then write the gradients for the chunk."""
    pid = tl.program_id(0).to(tl.int64)
    n_dblk = tl.cdiv(D, BLOCK_D)
    c = pid % n_chunks
    rest = pid // n_chunks
    dblk = rest % n_dblk
    row = rest // n_dblk
    start = 0
    end = T
    length = end - start
    i_lo = c * chunk
    i_hi = tl.minimum(i_lo + chunk, length)

    d = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    base = row * T * D
    b_row = row * stride_b_row + b_shift
    summary = (row * n_chunks) * D + d
    first_off = (end - 1).to(tl.int64) * D if REVERSE else start * D
    if H0_LOG:
        h0_src = b_ptr + row * stride_b_row + d
        dh0_dst = db_ptr + row * stride_b_row + d
    else:
        h0_src = h0_ptr + row * stride_h0_row + d
        dh0_dst = dh0_ptr + row * stride_h0_row + d
    if MODE != 1:
        h0 = _to_acc(tl.load(h0_src, mask=dmask, other=0.0), FP64)
        if H0_LOG:
            h0 = tl.exp(h0)

    lam = _full(BLOCK_D, 0.0, FP64)
    p_total = _full(BLOCK_D, 1.0, FP64)
    if MODE == 2:
        for prev in range(0, n_chunks):
            earlier = dmask & ((d * 0 + prev) < c)
            p_prev = _to_acc(tl.load(prod_ptr + summary + prev * D, mask=earlier, other=1.0), FP64)
            e_prev = _to_acc(tl.load(end_ptr + summary + prev * D, mask=earlier, other=0.0), FP64)
            lam = p_prev * lam + e_prev

    rows = tl.arange(0, BLOCK_T)
    for tile in range(0, n_tiles):
        i = i_lo + tile * BLOCK_T + rows
        tmask = i < i_hi
        if REVERSE:
            t = start + i
            t_next = t - 1
            t_prev = t + 1
        else:
            t = end - 1 - i
            t_next = t + 1
            t_prev = t - 1
        has_next = (t_next >= start) & (t_next < end)
        offs = t.to(tl.int64)[:, None] * D + d[None, :]
        offs_next = t_next.to(tl.int64)[:, None] * D + d[None, :]
        offs_prev = t_prev.to(tl.int64)[:, None] * D + d[None, :]
        mask = tmask[:, None] & dmask[None, :]
        mask_next = mask & has_next[:, None]
        lc_next = _to_acc(tl.load(lc_ptr + base + offs_next, mask=mask_next, other=float("-inf")), FP64)
        coef = tl.where(tmask[:, None], tl.exp(lc_next), 1.0)
        g = _to_acc(tl.load(g_ptr + base + offs, mask=mask, other=0.0), FP64)
        p, v = tl.associative_scan((coef, g), 0, _linear_pair)
        lam_t = p * lam[None, :] + v
        if MODE != 1:
            has_prev = (t_prev >= start) & (t_prev < end)
            a = tl.exp(_to_acc(tl.load(lc_ptr + base + offs, mask=mask, other=0.0), FP64))
            h_prev = tl.load(h_ptr + base + offs_prev, mask=mask & has_prev[:, None], other=0.0)
            h_prev = tl.where(has_prev[:, None], _to_acc(h_prev, FP64), h0[None, :])
            tl.store(dlc_ptr + base + offs, (lam_t * a * h_prev).to(dlc_ptr.dtype.element_ty), mask=mask)
            lb = _to_acc(tl.load(b_ptr + b_row + offs, mask=mask, other=float("-inf")), FP64)
            tl.store(db_ptr + b_row + offs, (lam_t * tl.exp(lb)).to(db_ptr.dtype.element_ty), mask=mask)
        else:
            p_total = p_total * _last_row(p, BLOCK_T)
        lam = _last_row(lam_t, BLOCK_T)
    if MODE == 1:
        tl.store(prod_ptr + summary + c * D, p_total, mask=dmask)
        tl.store(end_ptr + summary + c * D, lam, mask=dmask)
    else:
        a_first = tl.exp(_to_acc(tl.load(lc_ptr + base + first_off + d, mask=dmask, other=0.0), FP64))
        dh0 = a_first * lam
        if H0_LOG:
            dh0 = dh0 * h0
        owns_first = (d * 0 + c) == n_chunks - 1
        tl.store(dh0_dst, dh0.to(db_ptr.dtype.element_ty), mask=dmask & owns_first)


# -------------------------------------------------------------------------------------------- heuristics


@dataclass(frozen=True)
class _Plan:
    """Launch configuration: strategy, tile (block_t x block_d), num_warps, chunk length and count."""

    strategy: str
    block_t: int
    block_d: int
    num_warps: int
    chunk: int
    n_chunks: int


_forced: list[str] = []


@contextlib.contextmanager
def force_strategy(name: str) -> Iterator[None]:
    """Within the block, every log-scan launch uses strategy ``name`` ("sequential" or "chunked"); with
    "lookback" (the k = 1 single-pass kernel) or "pipelined" (the k = 1 pipelined walk)
    :func:`log_recurrence_fwd`, :func:`parallel_scan_log_fwd` and their adjoints run that kernel whatever
    the shape, and the other launches keep their own plan; with "split" (the k = 1 walk with a tile's steps
    split over warps) the two forwards run it and the adjoints keep the k = 1 heuristic's plan."""
    if name not in STRATEGIES:
        raise ValueError(f"name must be one of {STRATEGIES}, got {name!r}")
    _forced.append(name)
    try:
        with _recipes.overriding():
            yield
    finally:
        _forced.pop()


_log_space: list[bool] = []


@contextlib.contextmanager
def force_log_space() -> Iterator[None]:
    """Within the block, the forward kernels combine every tile in log space (by default a tile whose log
    coefficients are all <= 0 runs in linear space). For tests and accuracy comparisons."""
    _log_space.append(True)
    try:
        with _recipes.overriding():
            yield
    finally:
        _log_space.pop()


def _device_plan(x: Tensor) -> _Plan:
    """:func:`_plan` for ``x`` (B, T, D) on its device: the SM count of a CUDA device, else 132 SMs (an H200)
    and 16-row tiles."""
    batch, steps, width = x.shape
    if x.device.type != "cuda":
        return _plan(batch, steps, width, DEFAULT_SMS, max_block_t=16, itemsize=x.element_size())
    return _plan(batch, steps, width, num_sms(x.device), itemsize=x.element_size())


def _plan(
    batch: int, steps: int, width: int, sms: int = DEFAULT_SMS, max_block_t: int = 256, itemsize: int = 4
) -> _Plan:
    """Pick the strategy and tile sizes from the shapes.

    Tiles: single-warp programs of block_d = 8 channels (16 for 2-byte types: 32-byte rows, at most
    next_pow2(D)) x block_t = 2048 / block_d rows, clamped to [16, max_block_t], whatever T is (a tile
    that follows T would make torch.compile guard on each power of two of T). ``max_block_t`` is 256 on
    CUDA and 16 for CPU tensors (the interpreter scans element by element).
    Sequential when those programs number >= 2 per SM or T spans <= 4 tiles; otherwise chunked, with
    32-channel tiles and 4 warps, and enough chunks (each >= 2 tiles, at most 256) to give about 4
    programs per SM. These are the k = 1 kernel's tiles (see :func:`mingru_triton.linear.scan_plan`).
    """
    forced = _forced[-1] if _forced and _forced[-1] in ("sequential", "chunked") else None
    plan = _cached_plan if type(batch) is type(steps) is type(width) is int else _make_plan  # not SymInts
    return plan(batch, steps, width, sms, max_block_t, itemsize, forced)


def _make_plan(
    batch: int, steps: int, width: int, sms: int, max_block_t: int, itemsize: int, forced: str | None
) -> _Plan:
    block_d = min(16 if itemsize <= 2 else 8, next_pow2(max(width, 1)))
    block_t = min(max(16, 2048 // block_d), max_block_t)
    num_warps = 1
    few = batch * cdiv(width, block_d) < 2 * sms and steps > 4 * block_t
    if forced == "chunked" or (forced is None and few):
        block_d = min(32, next_pow2(max(width, 1)))
        block_t = min(max(16, 2048 // block_d), max_block_t)
        num_warps = 4
    programs = batch * cdiv(width, block_d)
    if forced == "chunked":
        n_chunks = min(4, cdiv(steps, block_t))
    elif forced == "sequential" or not few:
        n_chunks = 1
    else:
        wanted = cdiv(4 * sms, max(programs, 1))
        n_chunks = min(wanted, _MAX_CHUNKS, cdiv(steps, 2 * block_t))
    chunk = cdiv(cdiv(max(steps, 1), max(n_chunks, 1)), block_t) * block_t
    n_chunks = cdiv(max(steps, 1), chunk)
    strategy = "chunked" if n_chunks > 1 else "sequential"
    if strategy == "sequential":
        chunk = max(steps, 1)
    return _Plan(strategy, block_t, block_d, num_warps, chunk, n_chunks)


_cached_plan = functools.lru_cache(maxsize=512)(_make_plan)
""":func:`_make_plan` memoised (a pure function of its arguments): planning costs microseconds per call."""


def _strategy(batch: int, steps: int, width: int, sms: int = DEFAULT_SMS) -> str:
    """ "sequential" or "chunked": the strategy :func:`_plan` picks for (B, T, D)."""
    return _plan(batch, steps, width, sms).strategy


def log_envelope(log_coeffs: Tensor, values: Tensor) -> str | None:
    """None when the log-scan kernels take these inputs, else the reason they do not.

    ``log_coeffs`` is (B, T, D); ``values`` is log_values (B, T+1, D) or log_b (B, T, D) (only the shape of
    ``log_coeffs`` sets the limits). Limits: T < 2^31 and a grid of B * ceil(D / block_d) * n_chunks < 2^31
    programs. Devices, dtypes and emptiness are checked by the caller.
    """
    if log_coeffs.dim() != 3 or values.dim() != 3:
        return (
            f"the log-scan kernel takes 3-dim (B, T, D) inputs, got log_coeffs {tuple(log_coeffs.shape)} "
            f"and values {tuple(values.shape)}"
        )
    batch, steps, width = log_coeffs.shape
    if steps > _MAX_STEPS:
        return f"T must be < 2^31 for the log-scan kernel, got T={steps}"
    plan = _plan(batch, steps, width, itemsize=log_coeffs.element_size())
    programs = batch * cdiv(width, plan.block_d) * plan.n_chunks
    if programs > _MAX_GRID:
        return (
            f"B * ceil(D / {plan.block_d}) must be < 2^31 for the log-scan kernel, "
            f"got B={batch}, D={width} ({programs} programs)"
        )
    return None


# ----------------------------------------------------------------------------------------------- launches


def _check_device_and_envelope(x: Tensor, name: str) -> None:
    if not on_kernel_device(x):
        raise ValueError(
            f"{name} must be a CUDA tensor (or a CPU tensor under TRITON_INTERPRET=1), got device {x.device}"
        )
    reason = log_envelope(x, x)
    if reason is not None:
        raise ValueError(reason)


def _work(x: Tensor, plan: _Plan) -> Tensor | None:
    """Per-chunk summaries (B, n_chunks, D) in the accumulation dtype; None for the sequential strategy
    (whose launch never touches them)."""
    if plan.strategy == "sequential":
        return None
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.empty((x.shape[0], plan.n_chunks, x.shape[2]), dtype=dtype, device=x.device)


def _scan_fwd(
    lc: Tensor, b: Tensor, h0: Tensor | None, h: Tensor, *, b_shift: int, lean: bool, reverse: bool
) -> None:
    """Write the forward scan into ``h``; ``b`` starts ``b_shift`` elements into its row. ``h0`` (B, D) is a
    linear initial state of any sign; None means log h0 is slot 0 of each ``b`` row (the (T+1) values
    layout, ``b_shift`` = D). Reading h0 through ``b`` keeps each tensor one kernel argument, which the
    functionalization of ``wrap_triton`` needs (a tensor passed twice is cloned twice).

    Where the k = 1 heuristic picks its single pass (:func:`_single_pass_plan`; forward in time, the
    recurrence form or the (T+1) values layout, T >= :data:`LOOKBACK_FORWARD_MIN_LENGTH`), that kernel (or
    the forced walk) runs the recurrence in linear space, a = exp(lc), b = exp(lb) and, in the values
    layout, h0 = exp(log h0), as the log kernel does for a tile with every lc <= 0. If any lc > 0 it raises
    a flag on the device, and the log kernel, launched after it and gated on that flag, redoes the whole
    scan; otherwise that launch does nothing. No host synchronisation either way."""
    gate = None
    slot = h0 is None  # the values layout
    if (slot or (lean and b_shift == 0)) and not reverse and not _log_space:
        single = _single_pass_plan(lc, min_length=LOOKBACK_FORWARD_MIN_LENGTH)
        if single is not None:
            ptrs = {"coef": lc, "u": b, "hout": h, **({} if h0 is None else {"init": h0})}
            gate = _run_single_pass(single, ptrs, {**_SINGLE_PASS_FORWARD, "H0_SLOT": int(slot)})
    h0_log = h0 is None
    h0 = b if h0 is None else h0
    batch, steps, width = lc.shape
    plan = _device_plan(lc)
    grid = (batch * cdiv(width, plan.block_d) * plan.n_chunks,)
    sums, ends = _work(lc, plan), _work(lc, plan)
    gate_args = (None, 0) if gate is None else (gate, gate.numel() - 1)
    args: tuple[Any, ...] = (lc, b, h0, h, sums, ends, *gate_args, steps, width)
    args = (
        *args,
        b.stride(0),
        b_shift,
        h0.stride(0),
        plan.n_chunks,
        plan.chunk,
        cdiv(plan.chunk, plan.block_t),
    )
    meta = dict(
        H0_LOG=int(h0_log),
        LEAN=int(lean),
        REVERSE=int(reverse),
        LINEAR=int(not _log_space),
        GATED=int(gate is not None),
        BLOCK_T=plan.block_t,
        BLOCK_D=plan.block_d,
        FP64=is_fp64(lc),
        num_warps=plan.num_warps,
    )
    if plan.strategy == "chunked":
        launch(_log_fwd_kernel, grid, *args, MODE=1, **meta)
        launch(_log_fwd_kernel, grid, *args, MODE=2, **meta)
    else:
        launch(_log_fwd_kernel, grid, *args, MODE=0, **meta)


LOOKBACK_FORWARD_MIN_LENGTH = 2048
"""Shortest T for which :func:`log_recurrence_fwd` and :func:`parallel_scan_log_fwd` run a k = 1 kernel
(the split walk or the single pass, see :func:`_single_pass_plan`; their adjoints follow the k = 1
heuristic alone). Measured for the single pass, which costs
more host time than the log kernel (a zeroed status buffer, and the gated fallback launch after it: a
forward+backward at 8 x 4096 x 1024 took 548 against 481 us of wall time on an H200 host, pinned, where it is
bound by the host), so it starts where its GPU-time saving per forward reaches tens of microseconds and grows
with T. H200, GPU time (CUDA graph replay), single pass against the log kernel, float32 / bfloat16 forward:
8 x 1024 x 1024 0.043 / 0.034 against 0.059 / 0.073 ms (kept on the log kernel); 8 x 2048 x 1024 0.076 / 0.058
against 0.112 / 0.142 ms; 8 x 4096 x 1024 0.142 / 0.107 against 0.219 / 0.280 ms; 1 x 8192 x 2048
0.085 / 0.072 against 0.216 / 0.278 ms."""
_SINGLE_PASS_FORWARD = dict.fromkeys(("HAS_INIT", "EXP_COEF", "EXP_U", "BAIL"), 1)
"""Flags of the k = 1 kernels (:func:`_run_single_pass`) for :func:`log_recurrence_fwd`: exp of both inputs on
load, the initial state fused, and the flag raised by a log coefficient > 0. :func:`parallel_scan_log_fwd`
adds H0_SLOT (log h0 in slot 0 of the values' rows of T + 1 steps)."""
_SINGLE_PASS_ADJOINT = dict.fromkeys(
    ("WALK_REV", "SHIFT", "DA", "HAS_PREV0", "DINIT", "EXP_COEF", "LOG_GRADS"), 1
)
"""Flags of the k = 1 kernels (:func:`_run_single_pass`) for the adjoint of :func:`log_recurrence_fwd`: walk
time backwards with the next step's coefficient exp(lc), and write d lc, d lb and d h0 (with H0_SLOT, the
adjoint of :func:`parallel_scan_log_fwd`: d log h0 into slot 0 of d log_values)."""


def _single_pass_plan(lc: Tensor, min_length: int = 0, backward: bool = False) -> linear.ScanPlan | None:
    """The plan of a k = 1 kernel for :func:`log_recurrence_fwd`, :func:`parallel_scan_log_fwd` or their
    adjoints (``backward``; linear-space recurrences with coefficients exp(lc)), or None where the log
    kernel's own plan runs: the k = 1 heuristic (:func:`mingru_triton.linear.scan_plan`) for T >=
    ``min_length``, overridden by :func:`force_strategy`. The forwards take the split walk where the k = 1
    heuristic would take its pipelined walk (enough chains), else the single pass where it picks that; the
    adjoints the single pass where it picks that.

    The heuristic never picks the one-warp pipelined walk here. H200, GPU time (CUDA graph replay) at
    (8, 16384, 1024), ms, forward / adjoint: float32 0.836 / 1.023 on the walk's best tiles of a sweep
    against 0.535 / 1.008 on the single pass; bfloat16 0.652 / 0.702 against 0.404 / 0.646. With the k = 1
    forward's one-warp tile the walk's forward took 1.48 ms (float32): one warp per SM does not issue two
    exps per element fast enough. The split walk spreads them over four or eight warps per SM: forward
    float32 0.459 ms there, bfloat16 1.01 against 1.56 ms on the single pass at (8, 65536, 1024)
    (:func:`mingru_triton.linear._split_tile`)."""
    forced = _forced[-1] if _forced else None
    if forced in ("sequential", "chunked") or (forced is None and lc.shape[1] < min_length):
        return None
    inner = linear._FORCED[-1][0] if linear._FORCED else None  # a k = 1 forcing of the same name stays
    walk = forced == "pipelined"  # the one-warp walk only when forced: slower than the single pass here
    split = not backward and forced in (None, "split")
    with linear.force_strategy(forced) if forced not in (None, inner) else contextlib.nullcontext():
        plan = linear._plan_for(lc, 1, single_pass=True, pipelined=walk, backward=backward, split=split)
    return plan if plan.strategy in ("lookback", "pipelined", "split") else None


def _run_single_pass(plan: linear.ScanPlan, ptrs: dict[str, Tensor], flags: dict[str, int]) -> Tensor | None:
    """Launch the kernel of ``plan`` (:func:`_single_pass_plan`); returns its BAIL flag buffer (the last
    element is 1 if set) when ``flags`` asks for BAIL."""
    if plan.strategy == "pipelined":
        return linear._run_pipelined(plan, ptrs, **flags)
    if plan.strategy == "split":
        return linear._run_split(plan, ptrs, **flags)
    return linear._run_lookback(plan, ptrs, **flags)


def _scan_bwd(
    lc: Tensor,
    b: Tensor,
    h0: Tensor | None,
    h: Tensor,
    grad_h: Tensor,
    d_lc: Tensor,
    d_b: Tensor,
    d_h0: Tensor | None,
    *,
    b_shift: int,
    reverse: bool,
) -> None:
    """Write the adjoint of :func:`_scan_fwd` into ``d_lc``, ``d_b``, ``d_h0``; each must have the strides of
    ``lc``, ``b`` and ``h0`` (contiguous rows; ``b`` and ``d_b`` share their batch stride). With ``h0`` None
    (log h0 in slot 0 of ``b``), ``d_h0`` is None and d log h0 goes to slot 0 of ``d_b``."""
    slot = h0 is None  # the values layout
    if (slot or (d_h0 is not None and b_shift == 0)) and not reverse:
        single = _single_pass_plan(lc, backward=True)
        if single is not None:
            ptrs = {"coef": lc, "u": grad_h, "lb": b, "prevh": h, "hout": d_b, "da": d_lc}
            ptrs.update({} if h0 is None or d_h0 is None else {"prev0": h0, "dinit": d_h0})
            _run_single_pass(single, ptrs, {**_SINGLE_PASS_ADJOINT, "H0_SLOT": int(slot)})
            return
    batch, steps, width = lc.shape
    plan = _device_plan(lc)
    grid = (batch * cdiv(width, plan.block_d) * plan.n_chunks,)
    prods, ends = _work(lc, plan), _work(lc, plan)
    h0_log = h0 is None
    h0 = b if h0 is None else h0
    d_h0 = prods if d_h0 is None else d_h0  # never written when h0_log
    args: tuple[Any, ...] = (lc, b, h0, h, grad_h, d_lc, d_b, d_h0, prods, ends, steps, width)
    args = (*args, b.stride(0), b_shift, h0.stride(0), plan.n_chunks, plan.chunk)
    args = (*args, cdiv(plan.chunk, plan.block_t))
    meta = dict(
        H0_LOG=int(h0_log),
        REVERSE=int(reverse),
        BLOCK_T=plan.block_t,
        BLOCK_D=plan.block_d,
        FP64=is_fp64(lc),
        num_warps=plan.num_warps,
    )
    if plan.strategy == "chunked":
        launch(_log_bwd_kernel, grid, *args, MODE=1, **meta)
        launch(_log_bwd_kernel, grid, *args, MODE=2, **meta)
    else:
        launch(_log_bwd_kernel, grid, *args, MODE=0, **meta)


def _check_like(name: str, value: object, like: Tensor, layout: str) -> Tensor:
    value = check_float_tensor(name, value, like.dim(), layout)
    check_shape(name, value, tuple(like.shape), layout)
    return value


# -------------------------------------------------------------------------------------- log_values form


@triton_op("mingru::parallel_scan_log_fwd", mutates_args=())
def parallel_scan_log_fwd(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    """Fused log-space scan: log_coeffs (B, T, D), log_values (B, T+1, D) -> h (B, T, D), input dtype.

    log h_t = logaddexp(log_coeffs_t + log h_{t-1}, log_values_t), log h_0 = log_values_0; accumulates in
    float32 (float64 for float64 inputs). -inf entries give zeros, never NaN. Raises TypeError/ValueError
    on bad inputs and ValueError outside :func:`log_envelope`.
    """
    return _values_fwd(log_coeffs, log_values)


def _values_kind(log_coeffs: Tensor, log_values: Tensor, *like: Tensor) -> Any:
    """The recipe key of valid inputs of the values layout: log_coeffs (B, T, D) and tensors ``like`` it,
    log_values (B, T + 1, D), one dtype and device."""
    if not common_case(log_coeffs, like) or type(log_values) not in _PLAIN:
        return False
    batch, steps, width = log_coeffs.shape
    if log_values.shape != (batch, steps + 1, width) or log_values.dtype != log_coeffs.dtype:
        return False
    return log_values.device == log_coeffs.device and (log_coeffs.shape, log_coeffs.dtype)


@_recipes.replayed("parallel_scan_log_fwd", _values_kind)
def _values_fwd(log_coeffs: Tensor, log_values: Tensor) -> Tensor:
    check_log_inputs(log_coeffs, log_values)
    _check_device_and_envelope(log_coeffs, "log_coeffs")
    log_coeffs, log_values = log_coeffs.contiguous(), log_values.contiguous()
    h = torch.empty_like(log_coeffs)
    if h.numel() > 0:
        _scan_fwd(log_coeffs, log_values, None, h, b_shift=h.shape[2], lean=False, reverse=False)
    return h


@triton_op("mingru::parallel_scan_log_bwd", mutates_args=())
def parallel_scan_log_bwd(
    log_coeffs: Tensor, log_values: Tensor, h: Tensor, grad_h: Tensor
) -> tuple[Tensor, Tensor]:
    """Adjoint of :func:`parallel_scan_log_fwd` in linear space: (d_log_coeffs (B, T, D), d_log_values
    (B, T+1, D)) from the inputs, the output h and grad_h (B, T, D).

    lam_t = grad_h_t + a_{t+1} lam_{t+1}; d lc_t = lam_t a_t h_{t-1}; d lv_t = lam_t exp(lv_t) for t >= 1 and
    d lv_0 = a_1 lam_1 exp(lv_0). -inf inputs give exact zero gradients.
    """
    return _values_bwd(log_coeffs, log_values, h, grad_h)


@_recipes.replayed("parallel_scan_log_bwd", _values_kind)
def _values_bwd(log_coeffs: Tensor, log_values: Tensor, h: Tensor, grad_h: Tensor) -> tuple[Tensor, Tensor]:
    check_log_inputs(log_coeffs, log_values)
    _check_like("h", h, log_coeffs, "like log_coeffs (B, T, D)")
    _check_like("grad_h", grad_h, log_coeffs, "like log_coeffs (B, T, D)")
    check_same_device_dtype({"log_coeffs": log_coeffs, "h": h, "grad_h": grad_h})
    _check_device_and_envelope(log_coeffs, "log_coeffs")
    log_coeffs, log_values = log_coeffs.contiguous(), log_values.contiguous()
    h, grad_h = h.contiguous(), grad_h.contiguous()
    d_log_coeffs = torch.empty_like(log_coeffs)
    if log_coeffs.numel() == 0:
        return d_log_coeffs, torch.zeros_like(log_values)
    d_log_values = torch.empty_like(log_values)  # every slot is written: 1..T per step, 0 as d log h0
    _scan_bwd(
        log_coeffs,
        log_values,
        None,
        h,
        grad_h,
        d_log_coeffs,
        d_log_values,
        None,
        b_shift=log_coeffs.shape[2],
        reverse=False,
    )
    return d_log_coeffs, d_log_values


def _log_setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    log_coeffs, log_values = inputs
    ctx.save_for_backward(log_coeffs, log_values, output)


def _log_backward(ctx: Any, grad_h: Tensor | None) -> tuple[Tensor, Tensor]:
    log_coeffs, log_values, h = ctx.saved_tensors
    return parallel_scan_log_bwd(log_coeffs, log_values, h, grad_or_zeros(grad_h, h))


parallel_scan_log_fwd.register_autograd(_log_backward, setup_context=_log_setup_context)


# ---------------------------------------------------------------------------------------- recurrence form


def _check_recurrence_inputs(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> None:
    if common_case(log_coeffs, (log_b,), h0):
        return
    log_coeffs = check_float_tensor("log_coeffs", log_coeffs, 3, "(B, T, D)")
    log_b = _check_like("log_b", log_b, log_coeffs, "like log_coeffs (B, T, D)")
    h0 = check_float_tensor("h0", h0, 2, "(B, D)")
    check_shape("h0", h0, (log_coeffs.shape[0], log_coeffs.shape[2]), "(B, D)")
    check_same_device_dtype({"log_coeffs": log_coeffs, "log_b": log_b, "h0": h0})


@_recipes.replayed("log_recurrence_fwd", lambda lc, lb, h0: linear._recurrence_kind(lc, h0, lb))
def _recurrence_fwd(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    _check_recurrence_inputs(log_coeffs, log_b, h0)
    _check_device_and_envelope(log_coeffs, "log_coeffs")
    log_coeffs, log_b, h0 = log_coeffs.contiguous(), log_b.contiguous(), h0.contiguous()
    h = torch.empty_like(log_coeffs)
    if h.numel() > 0:
        _scan_fwd(log_coeffs, log_b, h0, h, b_shift=0, lean=True, reverse=False)
    return h


@_recipes.replayed("log_recurrence_bwd", lambda lc, lb, h0, h, gh: linear._recurrence_kind(lc, h0, lb, h, gh))
def _recurrence_bwd(
    log_coeffs: Tensor, log_b: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    if not common_case(log_coeffs, (log_b, h, grad_h), h0):
        _check_recurrence_inputs(log_coeffs, log_b, h0)
        _check_like("h", h, log_coeffs, "like log_coeffs (B, T, D)")
        _check_like("grad_h", grad_h, log_coeffs, "like log_coeffs (B, T, D)")
        check_same_device_dtype({"log_coeffs": log_coeffs, "h": h, "grad_h": grad_h})
    _check_device_and_envelope(log_coeffs, "log_coeffs")
    log_coeffs, log_b, h0 = log_coeffs.contiguous(), log_b.contiguous(), h0.contiguous()
    h, grad_h = h.contiguous(), grad_h.contiguous()
    d_log_coeffs = torch.empty_like(log_coeffs)
    d_log_b = torch.empty_like(log_b)
    d_h0 = torch.zeros_like(h0)
    if log_coeffs.numel() > 0:
        _scan_bwd(
            log_coeffs,
            log_b,
            h0,
            h,
            grad_h,
            d_log_coeffs,
            d_log_b,
            d_h0,
            b_shift=0,
            reverse=False,
        )
    return d_log_coeffs, d_log_b, d_h0


@triton_op("mingru::log_recurrence_fwd", mutates_args=())
def log_recurrence_fwd(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    """h_t = exp(log_coeffs_t) h_{t-1} + exp(log_b_t) from h0 (B, D) of any sign: (B, T, D) x2 -> h (B, T, D).

    max(h0, 0) enters the log-space scan as log h0 (-inf when <= 0) and min(h0, 0) decays as
    exp(sum_{s<=t} log_coeffs_s) min(h0, 0), fused in one pass. Input dtype out, float32/float64 inside.
    """
    return _recurrence_fwd(log_coeffs, log_b, h0)


@triton_op("mingru::log_recurrence_bwd", mutates_args=())
def log_recurrence_bwd(
    log_coeffs: Tensor, log_b: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Adjoint of :func:`log_recurrence_fwd`: (d_log_coeffs, d_log_b (B, T, D), d_h0 (B, D)).

    lam_t = grad_h_t + a_{t+1} lam_{t+1}; d lc_t = lam_t a_t h_{t-1} (h_0 = h0); d lb_t = lam_t exp(lb_t);
    d h0 = a_1 lam_1 for any sign of h0.
    """
    return _recurrence_bwd(log_coeffs, log_b, h0, h, grad_h)


recurrence = eager_path(
    "LogRecurrence", log_recurrence_fwd, _recurrence_fwd, _recurrence_bwd, lambda x, h: (*x, h)
)
"""``recurrence(log_coeffs, log_b, h0)``: :func:`log_recurrence_fwd` for the layers, eagerly without the op's
dispatch (:func:`~mingru_triton._launch.eager_path`)."""


def _recurrence_setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
    log_coeffs, log_b, h0 = inputs
    ctx.save_for_backward(log_coeffs, log_b, h0, output)


def _recurrence_backward(ctx: Any, grad_h: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    log_coeffs, log_b, h0, h = ctx.saved_tensors
    return log_recurrence_bwd(log_coeffs, log_b, h0, h, grad_or_zeros(grad_h, h))


log_recurrence_fwd.register_autograd(_recurrence_backward, setup_context=_recurrence_setup_context)
