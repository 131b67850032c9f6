"""Triton kernels for the k = 1 linear scan h_t = a_t h_{t-1} + b_t (also the engine of the diagonal scan).

Layout: the coefficient ``a`` is (R, L, DJ) ("a-like"), the values ``b`` are (R, L, DJ * V) ("b-like"), and
value channel ``c`` uses coefficient channel ``c // V`` (V = 1 for the linear scan, V = v for the diagonal
scan, so ``a`` is never expanded). The general kernel, :func:`_scan_kernel`, walks the time steps of a row
in tiles of (BLOCK_T, BLOCK_J, BLOCK_V), scans each tile with ``tl.associative_scan`` and carries the last
state. It runs two recurrences that share the coefficient: an a-like state X (the running product A_t, or
an adjoint of it) and the b-like state H.

Strategies (chosen by :func:`scan_plan`, forced in tests by :func:`force_strategy`):

- ``pipelined`` (the k = 1 scans with or without the running product and their adjoints, and the diagonal
  ones with v = 1, when rows x 64-channel blocks number about the SMs or more, T >= 1024; the log scan's
  single pass only when forced): :func:`_pipelined_kernel`, one program per
  (row, channel block) walks all of T in tiles whose loads are software-pipelined (``tl.range`` stages),
  so a few programs per SM keep enough bytes in flight; inputs read once, outputs written once, nothing
  else.
- ``split`` (the log scan's forwards, exp of both inputs on load, where the pipelined walk would run):
  :func:`_split_walk_kernel`, the pipelined walk with each tile's steps split over four or eight warps, so
  the exps are issued from every scheduler of an SM; the warps' end maps are composed once per tile.
- ``lookback`` (single pass, k = 1 scans that need no running product: the layers' recurrence and its
  adjoint): :func:`_lookback_kernel`, one program per tile (shapes in :func:`scan_plan`; with one warp every
  channel's steps sit in one thread, no cross-lane scan). Tiles are handed out in order; each
  publishes its summary, walks back along its row to the nearest tile with a published end state and
  replays the summaries in between in order (so the bits never depend on timing), then publishes its own
  end state. Inputs are read once and outputs written once; the status costs 12 bytes per channel per
  tile. Chosen for >= 8 (row, 32-channel block) chains (float64: 16 of 64 channels) and T >= 1024 where
  the pipelined walk is not (and for the log scan's single pass).
- ``sequential``: one program per (row, channel block) walks all of T. Chosen when those programs fill the
  GPU, or when T is short.
- ``chunked`` (T-parallel, three launches): (1) each (row, chunk, channel block) writes the chunk's
  summary: the product of its coefficients and its end state from a zero carry; (2) the same kernel runs the
  recurrence over the chunk summaries, giving every chunk's carry-in; (3) each chunk replays from its carry-in
  and writes the outputs.

The backward kernel walks the other way with the coefficient of the next step (g_t = gh_t + a_{t+1} g_{t+1})
and forms da from the stored states of the forward: no division by ``a``, so ``a`` may be 0.
"""

import contextlib
import functools
from collections.abc import Iterator, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op

from mingru._checks import check_float_tensor, check_same_device_dtype, check_shape
from mingru_triton import _recipes
from mingru_triton._launch import (
    cdiv,
    common_case,
    eager_path,
    fast_math,
    grad_or_zeros,
    is_fp64,
    launch,
    next_pow2,
    num_sms,
    on_kernel_device,
    sparse_every,
)
from mingru_triton._math import fast_exp, widen

__all__ = [
    "force_strategy",
    "linear_envelope",
    "linear_recurrence_bwd",
    "linear_recurrence_fwd",
    "linear_scan_bwd",
    "linear_scan_fwd",
    "recurrence",
    "scan",
    "scan_plan",
]


@triton.jit
def _compose(a1, h1, a2, h2):
    """Map (a2, h2) after map (a1, h1): x -> a2 (a1 x + h1) + h2."""
    return a1 * a2, a2 * h1 + h2


@triton.jit
def _compose2(a1, h1, x1, a2, h2, x2):
    """:func:`_compose` for two value columns sharing one coefficient."""
    return a1 * a2, a2 * h1 + h2, a2 * x1 + x2


@triton.jit
def _acc(x, FP64: tl.constexpr):
    """``x`` in the accumulation type: float64 for float64 inputs, float32 otherwise."""
    y = x.to(tl.float64) if FP64 else x.to(tl.float32)
    return y


@triton.jit
def _wide(x, FAST: tl.constexpr, FP64: tl.constexpr):
    """:func:`_acc` of loaded values: bfloat16 pairs widen by :func:`~mingru_triton._math.widen` (FAST)."""
    y = x.to(tl.float64) if FP64 else widen(x, FAST)
    return y


@triton.jit
def _first_state(state_ptr, log_ptr, r, L, DJ, offs_j, mask_j, H0_SLOT: tl.constexpr, FP64: tl.constexpr):
    """The state before row r's first step: ``state`` (R, DJ) at r, or (H0_SLOT) exp of slot 0 of row r of
    ``log`` (R, L + 1, DJ), the log h0 of the log-values layout."""
    if H0_SLOT:
        lh0 = tl.load(log_ptr + r * (L + 1) * DJ + offs_j, mask=mask_j, other=float("-inf"))
        x = tl.exp(_acc(lh0, FP64))
    else:
        x = _acc(tl.load(state_ptr + r * DJ + offs_j, mask=mask_j, other=0.0), FP64)
    return x


@triton.jit
def _store_dinit(
    coef_ptr,
    lb_ptr,
    hout_ptr,
    dinit_ptr,
    r,
    L,
    DJ,
    offs_j,
    mask_j,
    state,
    WALK_REV: tl.constexpr,
    EXP_COEF: tl.constexpr,
    H0_SLOT: tl.constexpr,
    FP64: tl.constexpr,
):
    """d(init) = a_first ``state`` of row r into ``dinit`` (R, DJ); a_first is the coefficient of the
    forward's first step (exp of the stored one with EXP_COEF). H0_SLOT: d log h0 = h0 d(h0) into slot 0 of
    row r of ``hout`` (R, L + 1, DJ), h0 = exp(slot 0 of ``lb``)."""
    first = 0 if WALK_REV else L - 1
    a_first = _acc(tl.load(coef_ptr + r * L * DJ + first * DJ + offs_j, mask=mask_j, other=0.0), FP64)
    if EXP_COEF:
        a_first = tl.exp(a_first)
    if H0_SLOT:
        h0 = _first_state(lb_ptr, lb_ptr, r, L, DJ, offs_j, mask_j, H0_SLOT, FP64)
        tl.store(hout_ptr + r * (L + 1) * DJ + offs_j, (a_first * state * h0).to(hout_ptr.dtype.element_ty),
                 mask=mask_j)  # fmt: skip
    else:
        tl.store(dinit_ptr + r * DJ + offs_j, (a_first * state).to(dinit_ptr.dtype.element_ty), mask=mask_j)


@triton.jit
def _scan_kernel(
    coef_ptr,
    u_ptr,
    ux_ptr,
    init_ptr,
    hcarry_ptr,
    xcarry_ptr,
    hout_ptr,
    xout_ptr,
    pout_ptr,
    prevh_ptr,
    prevx_ptr,
    prev0_ptr,
    da_ptr,
    dinit_ptr,
    L,
    DJ,
    V,
    CHUNK,
    NC,
    NJB,
    WALK_REV: tl.constexpr,
    SHIFT: tl.constexpr,
    SUMMARY: tl.constexpr,
    CARRY: tl.constexpr,
    HAS_UX: tl.constexpr,
    X_ONE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    WRITE_X: tl.constexpr,
    WRITE_H: tl.constexpr,
    DA: tl.constexpr,
    PREV_X: tl.constexpr,
    HAS_PREV0: tl.constexpr,
    DINIT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FP64: tl.constexpr,
):
    """One program: row r, chunk c (walk steps [c CHUNK, (c + 1) CHUNK) of L), channel block jb.

    Walk step s sits at time s (or L - 1 - s when WALK_REV). Its coefficient is ``coef`` at that time, or
    (SHIFT) at the time of the previous walk step, 0 before the first. X_s = a X_{s-1} + ux_s (ux = 0 unless
    HAS_UX; X starts at 1 when X_ONE, else 0) and H_s = a H_{s-1} + u_s (H starts at ``init`` or 0). CARRY:
    chunk c > 0 starts from the phase-2 carries at c - 1. SUMMARY: write only the chunk's coefficient product
    and end states from zero. DA: da = sum_v H * Hprev + X * Xprev, with Hprev/Xprev the stored forward
    states one step into the forward's past (``prev0`` or 0, and 1, before the first). DINIT: d(init) =
    a_first * H after the last step.
    """
    pid = tl.program_id(0).to(tl.int64)
    jb = pid % NJB
    rc = pid // NJB
    c = rc % NC
    r = rc // NC
    DV = DJ * V
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_v = tl.arange(0, BLOCK_V)
    mask_j = offs_j < DJ
    mask_jv = mask_j[:, None] & (offs_v[None, :] < V)
    ch = offs_j[:, None] * V + offs_v[None, :]
    row_x = r * L * DJ
    row_h = r * L * DV
    lanes = tl.arange(0, BLOCK_T)
    last2 = (lanes == BLOCK_T - 1)[:, None]
    last3 = (lanes == BLOCK_T - 1)[:, None, None]

    hc = _acc(tl.zeros((BLOCK_J, BLOCK_V), tl.float32), FP64)
    xc = _acc(tl.zeros((BLOCK_J,), tl.float32), FP64)
    pc = xc + 1.0
    if not SUMMARY:
        if X_ONE:
            xc = xc + 1.0
        if HAS_INIT:
            hc = _acc(tl.load(init_ptr + r * DV + ch, mask=mask_jv, other=0.0), FP64)
        if CARRY:
            has_prev = (offs_j * 0 + c) > 0
            hmask = mask_jv & has_prev[:, None]
            hprev = tl.load(hcarry_ptr + (r * NC + c - 1) * DV + ch, mask=hmask, other=0.0)
            xprev = tl.load(xcarry_ptr + (r * NC + c - 1) * DJ + offs_j, mask=mask_j & has_prev, other=0.0)
            hc = tl.where(has_prev[:, None], _acc(hprev, FP64), hc)
            xc = tl.where(has_prev, _acc(xprev, FP64), xc)
    if HAS_PREV0:
        h0 = _acc(tl.load(prev0_ptr + r * DV + ch, mask=mask_jv, other=0.0), FP64)

    s_begin = c * CHUNK
    s_end = tl.minimum(s_begin + CHUNK, L)
    for s0 in range(s_begin, s_end, BLOCK_T):
        steps = s0 + lanes
        valid = steps < s_end
        pos = L - 1 - steps if WALK_REV else steps
        if SHIFT:
            qpos = pos + 1 if WALK_REV else pos - 1
            qok = valid & (qpos >= 0) & (qpos < L)
        else:
            qpos = pos
            qok = valid
        m2 = valid[:, None] & mask_j[None, :]
        m3 = valid[:, None, None] & mask_jv[None, :, :]
        off_q = row_x + qpos[:, None] * DJ + offs_j[None, :]
        a2 = tl.load(coef_ptr + off_q, mask=qok[:, None] & mask_j[None, :], other=0.0)
        a2 = tl.where(valid[:, None], _acc(a2, FP64), 1.0)
        off3 = row_h + pos[:, None, None] * DV + ch[None, :, :]
        u3 = _acc(tl.load(u_ptr + off3, mask=m3, other=0.0), FP64)
        a3 = tl.broadcast_to(a2[:, :, None], (BLOCK_T, BLOCK_J, BLOCK_V))
        p3, h3 = tl.associative_scan((a3, u3), 0, _compose)
        h3 = h3 + p3 * hc[None, :, :]
        if HAS_UX:
            off2 = row_x + pos[:, None] * DJ + offs_j[None, :]
            ux = _acc(tl.load(ux_ptr + off2, mask=m2, other=0.0), FP64)
            p2, x2 = tl.associative_scan((a2, ux), 0, _compose)
            x2 = x2 + p2 * xc[None, :]
        else:
            p2 = tl.cumprod(a2, 0)
            x2 = p2 * xc[None, :]
        hc = tl.sum(tl.where(last3, h3, 0.0), axis=0)
        xc = tl.sum(tl.where(last2, x2, 0.0), axis=0)
        if SUMMARY:
            pc = pc * tl.sum(tl.where(last2, p2, 0.0), axis=0)
        if WRITE_H:
            tl.store(hout_ptr + off3, h3.to(hout_ptr.dtype.element_ty), mask=m3)
        if WRITE_X:
            off2w = row_x + pos[:, None] * DJ + offs_j[None, :]
            tl.store(xout_ptr + off2w, x2.to(xout_ptr.dtype.element_ty), mask=m2)
        if DA:
            ppos = pos - 1 if WALK_REV else pos + 1
            pok = valid & (ppos >= 0) & (ppos < L)
            poff3 = row_h + ppos[:, None, None] * DV + ch[None, :, :]
            hp = _acc(
                tl.load(prevh_ptr + poff3, mask=pok[:, None, None] & mask_jv[None, :, :], other=0.0), FP64
            )
            if HAS_PREV0:
                hp = tl.where(pok[:, None, None], hp, h0[None, :, :])
            da = tl.sum(h3 * hp, axis=2)
            if PREV_X:
                poff2 = row_x + ppos[:, None] * DJ + offs_j[None, :]
                xp = tl.load(prevx_ptr + poff2, mask=pok[:, None] & mask_j[None, :], other=1.0)
                da = da + x2 * _acc(xp, FP64)
            offda = row_x + pos[:, None] * DJ + offs_j[None, :]
            tl.store(da_ptr + offda, da.to(da_ptr.dtype.element_ty), mask=m2)
    if SUMMARY:
        tl.store(hout_ptr + (r * NC + c) * DV + ch, hc.to(hout_ptr.dtype.element_ty), mask=mask_jv)
        tl.store(pout_ptr + (r * NC + c) * DJ + offs_j, pc.to(pout_ptr.dtype.element_ty), mask=mask_j)
        if HAS_UX:
            tl.store(xout_ptr + (r * NC + c) * DJ + offs_j, xc.to(xout_ptr.dtype.element_ty), mask=mask_j)
    if DINIT:
        is_last = (offs_j * 0 + c) == NC - 1
        first = 0 if WALK_REV else L - 1
        a_first = tl.load(coef_ptr + row_x + first * DJ + offs_j, mask=mask_j & is_last, other=0.0)
        dinit = _acc(a_first, FP64)[:, None] * hc
        tl.store(
            dinit_ptr + r * DV + ch, dinit.to(dinit_ptr.dtype.element_ty), mask=mask_jv & is_last[:, None]
        )


# ---------------------------------------------------------------------------------------------------------
# Single-pass k = 1 kernel: decoupled look-back
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _look_back(agg_ptr, inc_ptr, flag_ptr, status, tile, CHAINS, p_end, h_end, lanes_j, REPLAY: tl.constexpr,
               BLOCK_J: tl.constexpr):  # fmt: skip
    """The carry into ``tile`` (not a chain's first) of a single pass over tiles taken in chain order (tile
    = k CHAINS + chain): publishes the tile's summary (p_end, h_end; status 1), walks back along its chain
    to the nearest tile whose final end state is published (status 2), waiting at a tile with no status
    yet, and replays the REPLAY-at-a-time loaded summaries in between in walk order (the arithmetic of a
    sequential fold over tiles, so the carry does not depend on timing). ``agg`` (tiles, 2, BLOCK_J) and
    ``inc`` (tiles, BLOCK_J) are in the accumulation type; ``flag`` holds one int32 status per tile, the
    tile's own at ``status``."""
    tl.store(agg_ptr + (2 * tile) * BLOCK_J + lanes_j, p_end)
    tl.store(agg_ptr + (2 * tile + 1) * BLOCK_J + lanes_j, h_end)
    tl.debug_barrier()
    tl.atomic_xchg(status, 1, sem="release")
    # (Polling 32 statuses at once, one per lane, was slower on an H200: the extra atomics cost more than the
    # round trips they save. So were 8, 16 or 32 volatile loads per round trip with one fence after them,
    # even at few chains: 1.2x-1.6x the time at (1, 65536, 256), docs/benchmarks.md, round 18.)
    found = tile - CHAINS
    seen = tl.atomic_add(flag_ptr + found, 0, sem="acquire")
    while seen != 2:
        found = tl.where(seen == 1, found - CHAINS, found)
        seen = tl.atomic_add(flag_ptr + found, 0, sem="acquire")
    # The REPLAY loads of a step do not depend on each other and are in flight together.
    carry = tl.load(inc_ptr + found * BLOCK_J + lanes_j, cache_modifier=".cg")
    for start in range(found + CHAINS, tile, CHAINS * REPLAY):
        for i in tl.static_range(REPLAY):
            idx = start + CHAINS * i
            use = (lanes_j * 0 + idx) < tile
            slot = agg_ptr + (2 * idx) * BLOCK_J + lanes_j
            p_i = tl.load(slot, mask=use, other=1.0, cache_modifier=".cg")
            h_i = tl.load(slot + BLOCK_J, mask=use, other=0.0, cache_modifier=".cg")
            carry = tl.where(use, h_i + p_i * carry, carry)
    return carry


@triton.jit
def _publish_final(inc_ptr, status, tile, final, lanes_j, BLOCK_J: tl.constexpr):
    """Publish ``tile``'s final end state for :func:`_look_back` (its status, at ``status``, set to 2)."""
    tl.store(inc_ptr + tile * BLOCK_J + lanes_j, final)
    tl.debug_barrier()
    tl.atomic_xchg(status, 2, sem="release")


@triton.jit
def _lookback_kernel(
    coef_ptr,
    u_ptr,
    init_ptr,
    hout_ptr,
    prevh_ptr,
    prev0_ptr,
    da_ptr,
    dinit_ptr,
    lb_ptr,
    agg_ptr,
    inc_ptr,
    flag_ptr,
    L,
    DJ,
    NJB,
    CHAINS,
    NT,
    WALK_REV: tl.constexpr,
    SHIFT: tl.constexpr,
    HAS_INIT: tl.constexpr,
    DA: tl.constexpr,
    HAS_PREV0: tl.constexpr,
    DINIT: tl.constexpr,
    EXP_COEF: tl.constexpr,
    EXP_U: tl.constexpr,
    FAST: tl.constexpr,
    LOG_GRADS: tl.constexpr,
    BAIL: tl.constexpr,
    H0_SLOT: tl.constexpr,
    SPARSE: tl.constexpr,
    REPLAY: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    FP64: tl.constexpr,
):
    """One tile of BLOCK_T walk steps x BLOCK_J channels of h_s = a h_{s-1} + u_s (k = 1, V = 1).

    Tiles are taken in launch order from a counter (``flag_ptr[CHAINS * NT]``): tile = k CHAINS + chain,
    chain = (row, channel block), k = the tile's place along the walk. Each tile scans its steps in
    registers and publishes its summary (coefficient product, end state from 0; status 1). It then walks
    back along its chain to the nearest tile whose final end state is published (status 2), waiting at a
    tile with no status yet, replays the REPLAY-at-a-time loaded summaries in between in walk order (the
    arithmetic of a sequential fold over tiles, so the carry does not depend on timing), publishes its own
    final end state and writes its outputs. Walk step s sits at time s (L - 1 - s when WALK_REV); SHIFT
    takes the coefficient one walk step back (1 stands in at the first step: SHIFT needs a zero initial
    state, as in the adjoint); DA writes da = h_s * hprev with
    hprev the stored state one step into the forward's past (``prev0`` or 0 before t = 1); DINIT writes
    a_first * (final state) from the last tile. EXP_COEF: the coefficient is exp of the stored value (the
    log scan's adjoint); LOG_GRADS (with DA and EXP_COEF) writes the log scan's gradients: da times a at the
    same step, and h times exp(lb) in place of h. EXP_U: the values are exp of the stored ones (the log
    scan's forward). BAIL (with EXP_COEF): a tile with a log coefficient > 0 sets
    ``flag_ptr[CHAINS * NT + 1]`` to 1 and the launch goes on; its outputs are then not to be used. H0_SLOT
    (the log-values form: log h0 in slot 0 of rows of L + 1 steps): with EXP_U, ``u`` is (R, L + 1, DJ) and
    the initial state is exp(u[:, 0]); with LOG_GRADS, ``lb`` and ``hout`` are (R, L + 1, DJ), the stored
    h0 is exp(lb[:, 0]) and DINIT writes d log h0 = h0 d(h0) to hout[:, 0]. SPARSE > 1
    (tests) publishes final states only on every SPARSE-th tile, so the look-back walks over summaries.
    Inputs contiguous (R, L, DJ).
    """
    tile = tl.atomic_add(flag_ptr + CHAINS * NT, 1).to(tl.int64)
    k = tile // CHAINS
    chain = tile % CHAINS
    r = chain // NJB
    jb = chain % NJB
    lanes_j = tl.arange(0, BLOCK_J)
    offs_j = jb * BLOCK_J + lanes_j
    mask_j = offs_j < DJ
    lanes_t = tl.arange(0, BLOCK_T)
    step0 = k * BLOCK_T
    valid = step0 + lanes_t < L
    # Addresses: an int64 base at the tile's first walk step plus int32 offsets inside the tile.
    t0 = L - 1 - step0 if WALK_REV else step0
    dstep = -DJ if WALK_REV else DJ
    inside = (lanes_t * dstep)[:, None] + offs_j[None, :]
    base = r * L * DJ + t0 * DJ
    # H0_SLOT: u (forward) or lb and hout (adjoint) have rows of L + 1 steps, log h0 first
    slot_base = r * (L + 1) * DJ + (t0 + 1) * DJ
    ubase = slot_base if H0_SLOT and EXP_U else base
    lbase = slot_base if H0_SLOT and LOG_GRADS else base
    m2 = valid[:, None] & mask_j[None, :]
    if EXP_U:
        u = fast_exp(_acc(tl.load(u_ptr + ubase + inside, mask=m2, other=float("-inf")), FP64), FAST)
    else:
        u = _acc(tl.load(u_ptr + base + inside, mask=m2, other=0.0), FP64)
    pad = 0.0 if EXP_COEF else 1.0  # the stored coefficient that stands for 1
    if SHIFT:
        # The first walk step has no coefficient; 1 stands in, harmless since the carry into it is 0.
        qok = valid & (step0 + lanes_t > 0)
        a = tl.load(coef_ptr + base - dstep + inside, mask=qok[:, None] & mask_j[None, :], other=pad)
    else:
        a = tl.load(coef_ptr + base + inside, mask=m2, other=pad)
    a = _acc(a, FP64)
    if BAIL:  # noqa: SIM102 (a constexpr test around a runtime one)
        # A coefficient above 1 (a log above 0): flag the launch; the caller's fallback redoes all of it.
        if tl.max(tl.max(a, axis=1), axis=0) > 0.0:
            tl.atomic_xchg(flag_ptr + CHAINS * NT + 1, 1)
    if EXP_COEF:
        a = fast_exp(a, FAST)
    p, h = tl.associative_scan((a, u), 0, _compose)
    last = (lanes_t == BLOCK_T - 1)[:, None]
    p_end = tl.sum(tl.where(last, p, 0.0), axis=0)
    h_end = tl.sum(tl.where(last, h, 0.0), axis=0)
    status = flag_ptr + tile
    carry = h_end * 0.0
    if k == 0:
        if HAS_INIT:
            carry = _first_state(init_ptr, u_ptr, r, L, DJ, offs_j, mask_j, H0_SLOT, FP64)
    else:
        carry = _look_back(agg_ptr, inc_ptr, flag_ptr, status, tile, CHAINS, p_end, h_end, lanes_j, REPLAY,
                           BLOCK_J)  # fmt: skip
    final = h_end + p_end * carry
    if (k < NT - 1) & (k % SPARSE == 0):
        _publish_final(inc_ptr, status, tile, final, lanes_j, BLOCK_J)
    h = h + p * carry[None, :]
    if LOG_GRADS:
        lb = _acc(tl.load(lb_ptr + lbase + inside, mask=m2, other=float("-inf")), FP64)
        tl.store(hout_ptr + lbase + inside, (h * fast_exp(lb, FAST)).to(hout_ptr.dtype.element_ty), mask=m2)
    else:
        tl.store(hout_ptr + base + inside, h.to(hout_ptr.dtype.element_ty), mask=m2)
    if DA:
        # The stored state one step into the forward's past: time - 1 when walking back, time + 1 else.
        ptime = t0 - lanes_t - 1 if WALK_REV else t0 + lanes_t + 1
        pok = valid & (ptime >= 0) & (ptime < L)
        hp = tl.load(prevh_ptr + base + dstep + inside, mask=pok[:, None] & mask_j[None, :], other=0.0)
        hp = _acc(hp, FP64)
        if HAS_PREV0:
            h0 = _first_state(prev0_ptr, lb_ptr, r, L, DJ, offs_j, mask_j, H0_SLOT, FP64)
            hp = tl.where(pok[:, None], hp, h0[None, :])
        grad = h * hp
        if LOG_GRADS:
            grad = grad * fast_exp(_acc(tl.load(coef_ptr + base + inside, mask=m2, other=0.0), FP64), FAST)
        tl.store(da_ptr + base + inside, grad.to(da_ptr.dtype.element_ty), mask=m2)
    if DINIT:  # noqa: SIM102 (a constexpr test around a runtime one)
        if k == NT - 1:
            _store_dinit(coef_ptr, lb_ptr, hout_ptr, dinit_ptr, r, L, DJ, offs_j, mask_j, final, WALK_REV,
                         EXP_COEF, H0_SLOT, FP64)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# k = 1 forward in segments read twice
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _segment_loads(coef_ptr, u_ptr, base0, s0, L, dstep, inside, lanes_t, mask_j, FP64: tl.constexpr):
    """Walk steps s0 to s0 + BLOCK_T - 1 of a segment: (coefficients, values, offsets, mask); past L a = 1
    and u = 0, which leaves the state as it is."""
    m2 = (s0 + lanes_t < L)[:, None] & mask_j[None, :]
    offs = base0 + s0 * dstep + inside
    a = _acc(tl.load(coef_ptr + offs, mask=m2, other=1.0), FP64)
    u = _acc(tl.load(u_ptr + offs, mask=m2, other=0.0), FP64)
    return a, u, offs, m2


@triton.jit
def _segment_kernel(
    coef_ptr,
    u_ptr,
    init_ptr,
    hout_ptr,
    agg_ptr,
    inc_ptr,
    flag_ptr,
    L,
    DJ,
    NJB,
    CHAINS,
    NS,
    WALK_REV: tl.constexpr,
    HAS_INIT: tl.constexpr,
    SPARSE: tl.constexpr,
    REPLAY: tl.constexpr,
    PERSIST: tl.constexpr,
    SEG: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    FP64: tl.constexpr,
):
    """h_s = a_s h_{s-1} + u_s (k = 1, V = 1, forward) by segments of SEG walk steps x BLOCK_J channels.

    A segment is read twice: pass 1 folds its steps (BLOCK_T at a time, STAGES - 1 sub-tiles of loads in
    flight) into its map (coefficient product, end state from 0); the carry comes from the single pass's
    look-back over the earlier segments of its chain (:func:`_look_back`, so the bits do not depend on
    timing); its end state is published and pass 2 reads the segment again, scans each sub-tile from the
    carry and writes h. A chain has SEG / BLOCK_T times fewer hand-offs than the single pass on BLOCK_T-step
    tiles, at the cost of the second read, meant to be served by L2 while few segments are open at once.

    Segments are taken in order from a counter (``flag_ptr[CHAINS * NS]``): segment = k CHAINS + chain.
    PERSIST: the grid has fewer programs than segments and each takes segments until none is left, so only
    as many segments as programs are open at once; else each program takes one. Walk step s sits at time s
    (L - 1 - s when WALK_REV); HAS_INIT: the state before the first step is ``init`` (R, DJ), else 0.
    SPARSE and REPLAY as in :func:`_lookback_kernel`. Inputs contiguous (R, L, DJ).
    """
    lanes_j = tl.arange(0, BLOCK_J)
    lanes_t = tl.arange(0, BLOCK_T)
    last = (lanes_t == BLOCK_T - 1)[:, None]
    dstep = -DJ if WALK_REV else DJ
    tile = tl.atomic_add(flag_ptr + CHAINS * NS, 1).to(tl.int64)
    while tile < CHAINS * NS:
        k = tile // CHAINS
        r = (tile % CHAINS) // NJB
        offs_j = (tile % CHAINS) % NJB * BLOCK_J + lanes_j
        mask_j = offs_j < DJ
        base0 = r * L * DJ + (L - 1 if WALK_REV else 0) * DJ
        inside = (lanes_t * dstep)[:, None] + offs_j[None, :]
        # Pass 1: the segment's map x -> P x + H, folded sub-tile by sub-tile in walk order.
        P = _acc(tl.full((BLOCK_J,), 1.0, tl.float32), FP64)
        H = P * 0.0
        for i in tl.range(0, SEG // BLOCK_T, num_stages=STAGES):
            s0 = k * SEG + i * BLOCK_T
            a, u, _, _ = _segment_loads(coef_ptr, u_ptr, base0, s0, L, dstep, inside, lanes_t, mask_j, FP64)
            pe, he = tl.reduce((a, u), 0, _compose)
            P, H = P * pe, H * pe + he
        status = flag_ptr + tile
        carry = H * 0.0
        if k == 0:
            if HAS_INIT:
                carry = _first_state(init_ptr, u_ptr, r, L, DJ, offs_j, mask_j, 0, FP64)
        else:
            carry = _look_back(agg_ptr, inc_ptr, flag_ptr, status, tile, CHAINS, P, H, lanes_j, REPLAY,
                               BLOCK_J)  # fmt: skip
        if (k < NS - 1) & (k % SPARSE == 0):
            _publish_final(inc_ptr, status, tile, H + P * carry, lanes_j, BLOCK_J)
        # Pass 2: the segment again, each sub-tile scanned from the carry.
        for i in tl.range(0, SEG // BLOCK_T, num_stages=STAGES):
            s0 = k * SEG + i * BLOCK_T
            a, u, offs, m2 = _segment_loads(coef_ptr, u_ptr, base0, s0, L, dstep, inside, lanes_t, mask_j,
                                            FP64)  # fmt: skip
            p, h = tl.associative_scan((a, u), 0, _compose)
            h = h + p * carry[None, :]
            tl.store(hout_ptr + offs, h.to(hout_ptr.dtype.element_ty), mask=m2)
            carry = tl.sum(tl.where(last, h, 0.0), axis=0)
        if PERSIST:  # noqa: SIM108 (a compile-time branch: no counter read for one segment per program)
            tile = tl.atomic_add(flag_ptr + CHAINS * NS, 1).to(tl.int64)
        else:
            tile = tile * 0 + CHAINS * NS  # one segment per program


# ---------------------------------------------------------------------------------------------------------
# k = 1 walk with pipelined loads
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def _walk_tile(
    coef_ptr,
    u_ptr,
    ux_ptr,
    hout_ptr,
    xout_ptr,
    prevh_ptr,
    prevx_ptr,
    da_ptr,
    lb_ptr,
    s0,
    L,
    base0,
    ubase0,
    lbase0,
    dstep,
    inside,
    lanes_t,
    mask_j,
    top,
    last,
    h0,
    carry,
    xcarry,
    gcarry,
    worst,
    WALK_REV: tl.constexpr,
    SHIFT: tl.constexpr,
    DA: tl.constexpr,
    HAS_PREV0: tl.constexpr,
    DINIT: tl.constexpr,
    WRITE_X: tl.constexpr,
    HAS_UX: tl.constexpr,
    PREV_X: tl.constexpr,
    EXP_COEF: tl.constexpr,
    EXP_U: tl.constexpr,
    FAST: tl.constexpr,
    LOG_GRADS: tl.constexpr,
    BAIL: tl.constexpr,
    H0_SLOT: tl.constexpr,
    COLUMNS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    FP64: tl.constexpr,
    TAIL: tl.constexpr,
):
    """One tile of :func:`_pipelined_kernel`'s walk, steps s0 to s0 + BLOCK_T - 1: loads, the scan from the
    carries, stores; returns the carries after it (state, running product, second column, largest log
    coefficient). TAIL: the tile may reach past L, so its steps are masked; else it lies inside L."""
    # The stored coefficient of a step past L. Forward in time (no SHIFT, no DINIT) it is 0: the asynchronous
    # copy's zero fill, where 1 costs a select per element; those steps' outputs are masked off and the carry
    # after the last tile is not used. Otherwise it stands for 1, so that the last tile's final row holds
    # the state at step L - 1 (DINIT needs it; the adjoints measured slower with 0 in bfloat16).
    pad = 0.0 if EXP_COEF or not (DINIT or SHIFT) else 1.0
    # Inside L (TAIL = 0) no mask on the steps: a predicate per row costs instructions per element.
    valid = (s0 + lanes_t < L) if TAIL else (lanes_t >= 0)
    m2 = valid[:, None] & mask_j[None, :]
    base = base0 + s0 * dstep
    if EXP_U:
        ubase = ubase0 + s0 * dstep
        u = tl.load(u_ptr + ubase + inside, mask=m2, other=float("-inf"))
        u = fast_exp(_wide(u, FAST, FP64), FAST)
    else:
        u = _wide(tl.load(u_ptr + base + inside, mask=m2, other=0.0), FAST, FP64)
    if SHIFT:
        # The first walk step has no coefficient; 1 stands in, harmless since the carry into it is 0.
        qok = valid & (s0 + lanes_t > 0)
        a = tl.load(coef_ptr + base - dstep + inside, mask=qok[:, None] & mask_j[None, :], other=pad)
    else:
        a = tl.load(coef_ptr + base + inside, mask=m2, other=pad)
    a = _wide(a, FAST, FP64)
    if BAIL:
        worst = tl.maximum(worst, tl.max(a, axis=0))
    if EXP_COEF:
        a = fast_exp(a, FAST)
    if HAS_UX:
        ux = _wide(tl.load(ux_ptr + base + inside, mask=m2, other=0.0), FAST, FP64)
    # Steps past L carry u = 0 and a = pad: with a = 1 the state at the tile's last row is the state at
    # step L - 1.
    if COLUMNS > 0:
        u = tl.where(top, u + a * carry[None, :], u)
        if HAS_UX:
            ux = tl.where(top, ux + a * gcarry[None, :], ux)
            p, h, g = tl.associative_scan((a, u, ux), 0, _compose2)
        else:
            p, h = tl.associative_scan((a, u), 0, _compose)
    else:
        if HAS_UX:
            p, h, g = tl.associative_scan((a, u, ux), 0, _compose2)
            g = g + p * gcarry[None, :]
        else:
            p, h = tl.associative_scan((a, u), 0, _compose)
        h = h + p * carry[None, :]
    carry = tl.sum(tl.where(last, h, 0.0), axis=0)
    if HAS_UX:
        gcarry = tl.sum(tl.where(last, g, 0.0), axis=0)
    if WRITE_X:
        x = p * xcarry[None, :]
        xcarry = tl.sum(tl.where(last, x, 0.0), axis=0)
        tl.store(xout_ptr + base + inside, x.to(xout_ptr.dtype.element_ty), mask=m2)
    if LOG_GRADS:
        lbase = lbase0 + s0 * dstep
        lb = _wide(tl.load(lb_ptr + lbase + inside, mask=m2, other=float("-inf")), FAST, FP64)
        tl.store(hout_ptr + lbase + inside, (h * fast_exp(lb, FAST)).to(hout_ptr.dtype.element_ty), mask=m2)
    else:
        tl.store(hout_ptr + base + inside, h.to(hout_ptr.dtype.element_ty), mask=m2)
    if DA:
        # The stored state one step into the forward's past: time - 1 when walking back, time + 1 else.
        steps = s0 + lanes_t
        ptime = L - 2 - steps if WALK_REV else steps + 1
        pok = valid & (ptime >= 0) & (ptime < L)
        hp = tl.load(prevh_ptr + base + dstep + inside, mask=pok[:, None] & mask_j[None, :], other=0.0)
        hp = _wide(hp, FAST, FP64)
        if HAS_PREV0:
            hp = tl.where(pok[:, None], hp, h0[None, :])
        grad = h * hp
        if PREV_X:
            pm = pok[:, None] & mask_j[None, :]
            xp = tl.load(prevx_ptr + base + dstep + inside, mask=pm, other=1.0)
            grad = grad + g * _wide(xp, FAST, FP64)
        if LOG_GRADS:
            grad = grad * fast_exp(
                _wide(tl.load(coef_ptr + base + inside, mask=m2, other=0.0), FAST, FP64), FAST
            )
        tl.store(da_ptr + base + inside, grad.to(da_ptr.dtype.element_ty), mask=m2)
    return carry, xcarry, gcarry, worst


@triton.jit
def _pipelined_kernel(
    coef_ptr,
    u_ptr,
    ux_ptr,
    init_ptr,
    hout_ptr,
    xout_ptr,
    prevh_ptr,
    prevx_ptr,
    prev0_ptr,
    da_ptr,
    dinit_ptr,
    lb_ptr,
    flag_ptr,
    L,
    DJ,
    NJB,
    WALK_REV: tl.constexpr,
    SHIFT: tl.constexpr,
    HAS_INIT: tl.constexpr,
    DA: tl.constexpr,
    HAS_PREV0: tl.constexpr,
    DINIT: tl.constexpr,
    WRITE_X: tl.constexpr,
    HAS_UX: tl.constexpr,
    PREV_X: tl.constexpr,
    EXP_COEF: tl.constexpr,
    EXP_U: tl.constexpr,
    FAST: tl.constexpr,
    LOG_GRADS: tl.constexpr,
    BAIL: tl.constexpr,
    H0_SLOT: tl.constexpr,
    FIXED_DJ: tl.constexpr,
    STAGES: tl.constexpr,
    COLUMNS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    FP64: tl.constexpr,
):
    """One program: row r, channel block jb; h_s = a h_{s-1} + u_s over all L walk steps (k = 1, V = 1).

    The loop over tiles of BLOCK_T steps x BLOCK_J channels keeps STAGES - 1 tiles of loads in flight
    (``tl.range``'s software pipeline: asynchronous copies to shared memory on sm_80 and later), so one
    program streams its chain at the memory's pace; only the carry, BLOCK_J states, passes from tile to tile.
    COLUMNS > 0 asks for at most that many contiguous channels per thread (a hint on the addresses; on one
    warp with BLOCK_J = 32 x COLUMNS every channel's steps then sit in one thread) and folds the carry into
    the tile's first step instead of applying it to every step after the scan (in one thread the scan then
    needs no coefficient products). The flags are those of :func:`_lookback_kernel` (walk direction, SHIFT,
    da, d(init), and the log scan's EXP_COEF, EXP_U, LOG_GRADS, H0_SLOT); BAIL (with EXP_COEF) sets
    ``flag_ptr[0]`` to 1 when any log coefficient of the program's chain is > 0, checked once after its
    walk. The running product's flags are those of :func:`_scan_kernel`: WRITE_X writes X_s = a X_{s-1}
    (X = 1 before the first step) to ``xout``; HAS_UX scans a second value column G_s = a G_{s-1} + ux_s
    (from 0) and PREV_X adds G_s Xprev to da, Xprev from ``prevx`` one step into the forward's past (1
    before t = 1).
    FIXED_DJ > 0 is DJ as a compile-time constant: a thread's steps then sit at immediate offsets from one
    address, which saves the per-element address arithmetic of a one-warp tile. The forward walks (no DA)
    take the tiles inside L without a mask on their steps (:func:`_walk_tile`), and with FAST bfloat16 pairs
    widen by a shift and a mask (:func:`~mingru_triton._math.widen`): sm_90 code of the bfloat16 forward
    tile, 6.6 instructions per element against 7.9 before both. Inputs contiguous (R, L, DJ).
    """
    dj = FIXED_DJ if FIXED_DJ > 0 else DJ
    pid = tl.program_id(0).to(tl.int64)
    r = pid // NJB
    jb = pid % NJB
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_j = offs_j < dj
    lanes_t = tl.arange(0, BLOCK_T)
    dstep = -dj if WALK_REV else dj
    first_t = L - 1 if WALK_REV else 0
    base0 = r * L * dj + first_t * dj
    # H0_SLOT: u (forward) or lb and hout (adjoint) have rows of L + 1 steps, log h0 first
    slot_base0 = r * (L + 1) * dj + (first_t + 1) * dj
    ubase0 = slot_base0 if H0_SLOT and EXP_U else base0
    lbase0 = slot_base0 if H0_SLOT and LOG_GRADS else base0
    inside = (lanes_t * dstep)[:, None] + offs_j[None, :]
    if COLUMNS > 0:
        inside = tl.max_contiguous(inside, [1, COLUMNS])
    top = (lanes_t == 0)[:, None]
    last = (lanes_t == BLOCK_T - 1)[:, None]
    carry = _acc(tl.zeros((BLOCK_J,), tl.float32), FP64)
    if HAS_INIT:
        carry = _first_state(init_ptr, u_ptr, r, L, dj, offs_j, mask_j, H0_SLOT, FP64)
    h0 = carry  # HAS_PREV0: the forward's state before t = 0
    if HAS_PREV0:
        h0 = _first_state(prev0_ptr, lb_ptr, r, L, dj, offs_j, mask_j, H0_SLOT, FP64)
    worst = _acc(tl.full((BLOCK_J,), float("-inf"), tl.float32), FP64)  # BAIL: largest log coefficient
    xcarry = carry * 0.0 + 1.0  # WRITE_X: the running product before the tile
    gcarry = carry * 0.0  # HAS_UX: the second column's state before the tile
    # The forward walks (no DA) take every tile but a last partial one without a mask on its steps; the
    # adjoints keep one masked loop (float32 measured 0.5%-1.7% slower with the split, bfloat16 level).
    if DA:
        for s0 in tl.range(0, L, BLOCK_T, num_stages=STAGES):
            carry, xcarry, gcarry, worst = _walk_tile(
                coef_ptr, u_ptr, ux_ptr, hout_ptr, xout_ptr, prevh_ptr, prevx_ptr, da_ptr, lb_ptr, s0, L,
                base0, ubase0, lbase0, dstep, inside, lanes_t, mask_j, top, last, h0, carry, xcarry, gcarry,
                worst, WALK_REV, SHIFT, DA, HAS_PREV0, DINIT, WRITE_X, HAS_UX, PREV_X, EXP_COEF, EXP_U, FAST,
                LOG_GRADS, BAIL, H0_SLOT, COLUMNS, BLOCK_T, FP64, 1,
            )  # fmt: skip
    else:
        full = L // BLOCK_T * BLOCK_T
        for s0 in tl.range(0, full, BLOCK_T, num_stages=STAGES):
            carry, xcarry, gcarry, worst = _walk_tile(
                coef_ptr, u_ptr, ux_ptr, hout_ptr, xout_ptr, prevh_ptr, prevx_ptr, da_ptr, lb_ptr, s0, L,
                base0, ubase0, lbase0, dstep, inside, lanes_t, mask_j, top, last, h0, carry, xcarry, gcarry,
                worst, WALK_REV, SHIFT, DA, HAS_PREV0, DINIT, WRITE_X, HAS_UX, PREV_X, EXP_COEF, EXP_U, FAST,
                LOG_GRADS, BAIL, H0_SLOT, COLUMNS, BLOCK_T, FP64, 0,
            )  # fmt: skip
        if full < L:
            carry, xcarry, gcarry, worst = _walk_tile(
                coef_ptr, u_ptr, ux_ptr, hout_ptr, xout_ptr, prevh_ptr, prevx_ptr, da_ptr, lb_ptr, full, L,
                base0, ubase0, lbase0, dstep, inside, lanes_t, mask_j, top, last, h0, carry, xcarry, gcarry,
                worst, WALK_REV, SHIFT, DA, HAS_PREV0, DINIT, WRITE_X, HAS_UX, PREV_X, EXP_COEF, EXP_U, FAST,
                LOG_GRADS, BAIL, H0_SLOT, COLUMNS, BLOCK_T, FP64, 1,
            )  # fmt: skip
    if BAIL:  # noqa: SIM102 (a constexpr test around a runtime one)
        # A coefficient above 1 (a log above 0): flag the launch; the caller's fallback redoes all of it.
        if tl.max(worst, axis=0) > 0.0:
            tl.atomic_xchg(flag_ptr, 1)
    if DINIT:
        _store_dinit(coef_ptr, lb_ptr, hout_ptr, dinit_ptr, r, L, dj, offs_j, mask_j, carry, WALK_REV,
                     EXP_COEF, H0_SLOT, FP64)  # fmt: skip


@triton.jit
def _split_walk_tile(
    coef_ptr,
    u_ptr,
    hout_ptr,
    s0,
    L,
    base0,
    ubase0,
    dj,
    inside,
    steps,
    mask_j,
    lastrow,
    prev,
    first_w,
    last_w,
    carry,
    worst,
    EXP_COEF: tl.constexpr,
    EXP_U: tl.constexpr,
    FAST: tl.constexpr,
    BAIL: tl.constexpr,
    FP64: tl.constexpr,
    TAIL: tl.constexpr,
):
    """One tile of :func:`_split_walk_kernel`: steps s0 + w SUB + s of run w (tile (WARPS, SUB, BLOCK_J)).
    Each run of SUB steps is scanned from a zero state, the runs' end maps are composed in order from the
    carry, and each run adds its carry-in times its running product. TAIL: the tile may reach past L."""
    valid = (s0 + steps < L) if TAIL else (steps >= 0)
    m3 = valid[:, :, None] & mask_j[None, None, :]
    base = base0 + s0 * dj
    # Past L or D the loads give -inf where an exp follows, else 0: a = 0 and u = 0 there; those outputs are
    # not stored and the carry after the last tile is not used.
    a = tl.load(coef_ptr + base + inside, mask=m3, other=float("-inf") if EXP_COEF else 0.0)
    a = _wide(a, FAST, FP64)
    u = tl.load(u_ptr + ubase0 + s0 * dj + inside, mask=m3, other=float("-inf") if EXP_U else 0.0)
    u = _wide(u, FAST, FP64)
    if BAIL:
        worst = tl.maximum(worst, tl.max(a, axis=1))  # per run; the runs are reduced once, after the walk
    if EXP_COEF:
        a = fast_exp(a, FAST)
    if EXP_U:
        u = fast_exp(u, FAST)
    p, h = tl.associative_scan((a, u), 1, _compose)  # within each run, from 0
    pw = tl.sum(tl.where(lastrow, p, 0.0), axis=1)  # (WARPS, BLOCK_J): each run's end map
    hw = tl.sum(tl.where(lastrow, h, 0.0), axis=1)
    pi, hi = tl.associative_scan((pw, hw), 0, _compose)
    ends = hi + pi * carry[None, :]  # the state after each run's last step
    cin = tl.sum(tl.where(prev, ends[None, :, :], 0.0), axis=1)  # run w - 1's end: one term of the sum
    cin = tl.where(first_w, carry[None, :], cin)
    h = h + p * cin[:, None, :]
    tl.store(hout_ptr + base + inside, h.to(hout_ptr.dtype.element_ty), mask=m3)
    carry = tl.sum(tl.where(last_w, ends, 0.0), axis=0)
    return carry, worst


@triton.jit
def _split_walk_kernel(
    coef_ptr,
    u_ptr,
    init_ptr,
    hout_ptr,
    flag_ptr,
    L,
    DJ,
    NJB,
    HAS_INIT: tl.constexpr,
    EXP_COEF: tl.constexpr,
    EXP_U: tl.constexpr,
    FAST: tl.constexpr,
    BAIL: tl.constexpr,
    H0_SLOT: tl.constexpr,
    FIXED_DJ: tl.constexpr,
    STAGES: tl.constexpr,
    COLUMNS: tl.constexpr,
    WARPS: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_J: tl.constexpr,
    FP64: tl.constexpr,
):
    """One program: row r, channel block jb; h_t = a_t h_{t-1} + u_t forward over all L steps (k = 1).

    The pipelined walk of :func:`_pipelined_kernel` on WARPS warps, each tile's steps in WARPS runs of SUB
    consecutive steps (COLUMNS channels per thread): four or eight warps per SM share a chain's work, so
    the exps of the log scan (EXP_COEF: a = exp(coef), EXP_U: u = exp(u)) are issued from every scheduler
    of the SM instead of one. The runs' end maps are composed once per tile. HAS_INIT, BAIL and H0_SLOT as
    in :func:`_pipelined_kernel`, BAIL's largest log coefficient kept per run and reduced once at the end;
    forward in time, no running product, no adjoint. Inputs contiguous (R, L, DJ).
    """
    dj = FIXED_DJ if FIXED_DJ > 0 else DJ
    pid = tl.program_id(0).to(tl.int64)
    r = pid // NJB
    jb = pid % NJB
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_j = offs_j < dj
    w_ix = tl.arange(0, WARPS)
    steps = w_ix[:, None] * SUB + tl.arange(0, SUB)[None, :]  # (WARPS, SUB)
    # Tile (WARPS, SUB, BLOCK_J): as compiled for sm_90 the warps lie along the SUB axis (a (4, 16, 64)
    # tile gets warpsPerCTA [1, 4, 1]), so each run's scan crosses warps. A (SUB, WARPS, BLOCK_J) tile,
    # each run in one warp's threads, compiled to 2x-3x fewer instructions per element but ran the plain
    # k = 1 forward and adjoint 1.4x-2.8x slower than the pipelined walk (H100, (8, 16384, 1024)).
    inside = (steps * dj)[:, :, None] + offs_j[None, None, :]
    inside = tl.max_contiguous(inside, [1, 1, COLUMNS])
    lastrow = (tl.arange(0, SUB) == SUB - 1)[None, :, None]
    prev = (w_ix[None, :] == w_ix[:, None] - 1)[:, :, None]  # [w, w']: w' is the run before w
    first_w = (w_ix == 0)[:, None]
    last_w = (w_ix == WARPS - 1)[:, None]
    base0 = r * L * dj
    # H0_SLOT: u has rows of L + 1 steps, log h0 first
    ubase0 = r * (L + 1) * dj + dj if H0_SLOT else base0
    carry = _acc(tl.zeros((BLOCK_J,), tl.float32), FP64)
    if HAS_INIT:
        carry = _first_state(init_ptr, u_ptr, r, L, dj, offs_j, mask_j, H0_SLOT, FP64)
    worst = _acc(tl.full((WARPS, BLOCK_J), float("-inf"), tl.float32), FP64)  # BAIL: largest log coefficient
    tile = WARPS * SUB
    full = L // tile * tile
    for s0 in tl.range(0, full, tile, num_stages=STAGES):
        carry, worst = _split_walk_tile(
            coef_ptr, u_ptr, hout_ptr, s0, L, base0, ubase0, dj, inside, steps, mask_j, lastrow, prev,
            first_w, last_w, carry, worst, EXP_COEF, EXP_U, FAST, BAIL, FP64, 0,
        )  # fmt: skip
    if full < L:
        carry, worst = _split_walk_tile(
            coef_ptr, u_ptr, hout_ptr, full, L, base0, ubase0, dj, inside, steps, mask_j, lastrow, prev,
            first_w, last_w, carry, worst, EXP_COEF, EXP_U, FAST, BAIL, FP64, 1,
        )  # fmt: skip
    if BAIL:  # noqa: SIM102 (a constexpr test around a runtime one)
        if tl.max(tl.max(worst, axis=1), axis=0) > 0.0:
            tl.atomic_xchg(flag_ptr, 1)


# ---------------------------------------------------------------------------------------------------------
# Heuristics
# ---------------------------------------------------------------------------------------------------------

MAX_V = 512
"""Largest v (value columns sharing one coefficient) a program takes whole: the diagonal scan's limit."""

_FORCED: list[tuple[str, int | None, int | None]] = []
STRATEGIES = ("pipelined", "split", "lookback", "segment", "sequential", "chunked")
LOOKBACK_MIN_CHAINS = 8
LOOKBACK_MIN_LENGTH = 1024
"""The single-pass kernel runs when rows x 32-channel blocks >= LOOKBACK_MIN_CHAINS and
T >= LOOKBACK_MIN_LENGTH. With fewer chains, hundreds of tiles of one chain are in flight and each walks back
over many of them; with short T the fixed cost per tile is not repaid. H200 (runner, layers' path):
1 x 65536 x 256 (8 chains) fp32 forward 0.114 ms against 0.392 ms for the chunked plan; 8 x 2048 x 1024
fp32 forward+backward 1.3x the copy floor against 1.6x for the sequential plan. GPU time (CUDA graph
replay, layers' path) at 8 x 1024 x 1024: forward / forward+backward 0.037 / 0.090 ms against 0.042 /
0.107 ms for the sequential plan (fp32), 0.034 / 0.072 against 0.038 / 0.101 ms (bf16); below T = 1024
the two are level (8 x 512 x 1024). Each single-pass call also zeroes its status buffer (one more launch)."""
LOOKBACK_FEW_CHAINS = 16
"""At most this many rows x 32-channel blocks: the single-pass kernel takes 4-warp tiles of 128 steps and
32 channels (float32; 256 steps from :data:`LOOKBACK_LONG_TILES` steps) or of 256 steps and 16 channels
(2-byte types), so a chain has 4x-8x fewer tiles to walk back over. H100, GPU time of the layers' path,
forward / forward+backward in us, against 32 x 128 tiles for both: bfloat16 (1, 65536, 256) 97.4 / 207.1
against 106.2 / 218.7, (1, 4096, 256) 12.8 / 26.9 against 14.1 / 29.1, (2, 16384, 256) 52.1 / 111.3
against 52.6 / 108.5; float32 with 256 steps (1, 65536, 256) 104.3 / 239.7 against 111.5 / 253.3, but
(2, 16384, 256) 55.6 / 129.4 against 53.8 / 125.6 and (8, 2048, 32) 11.8 / 24.7 against 10.6 / 22.7."""
LOOKBACK_LONG_TILES = 65536
"""From this many steps the float32 few-chain tile of the single pass is 256 steps long (see
:data:`LOOKBACK_FEW_CHAINS`); (1, 65536, 512): 182.1 / 437.4 us against 189.8 / 450.1."""
PIPELINED_MIN_FILL = 7 / 8
"""The pipelined walk runs (T >= :data:`LOOKBACK_MIN_LENGTH`, float32/bfloat16/float16) when rows x
64-channel blocks number at least this fraction of the SMs: one program per chain must keep an SM busy. This
holds for the recurrence's 2-byte adjoint (float32: :data:`ADJOINT_FLOAT32_MIN_FILL`) and the float32 split
walk; the adjoint with the running product takes :data:`SCAN_ADJOINT_MIN_FILL`, the recurrence's forward
walk takes :data:`FORWARD_MIN_FILL`, the running product's :data:`SCAN_FORWARD_MIN_FILL` and the 2-byte
split walk :data:`SPLIT_MIN_FILL`. H100, GPU time (CUDA graph) of the adjoint at T = 4096, D = 1024 against
the single-pass kernel: B = 6 (96 chains) bfloat16 0.131 against 0.119 ms, B = 4 float32 0.172 against 0.129
ms (32-channel programs: 0.125)."""
ADJOINT_FLOAT32_MIN_FILL = 7 / 16
"""The float32 recurrence's adjoint (``single_pass`` and ``backward``; the adjoint with the running product:
:data:`SCAN_ADJOINT_MIN_FILL`) takes the pipelined walk on 32 x 64 tiles (4 stages) from this fraction
of the SMs' worth of 64-channel chains while its chains of 32 channels fit in one wave; with more, from
:data:`ADJOINT_FLOAT32_WIDE_MIN_FILL`. H100, GPU time (CUDA graph), D = 1024, walk against the single pass,
in ms: (4, 4096) 0.122 / 0.129, (4, 16384) 0.476 / 0.497; but (3, 16384) 0.469 / 0.376. 2-byte types keep
:data:`PIPELINED_MIN_FILL` (the single pass ahead: bfloat16 (6, 16384) 0.454 against 0.525 for the best
walk tile)."""
ADJOINT_FLOAT32_WIDE_MIN_FILL = 3 / 4
"""Where the float32 recurrence's chains of 32 channels outnumber the SMs, its adjoint takes the walk from
this fraction of the SMs' worth of 64-channel chains: 64 x 64 tiles on 3 stages below
:data:`PIPELINED_MIN_FILL`, whose programs take the time of one chain's walk (0.74 ms at T = 16384 from 64
to 96 chains). H100, GPU time (CUDA graph), D = 1024, walk against the single pass, in ms: (7, 16384)
0.833-0.839 / 0.886, but (6, 16384) 0.740 / 0.749 and (5, 16384) 0.738 / 0.635 (32 x 64 on 3 stages:
0.645)."""
SCAN_ADJOINT_MIN_FILL = 3 / 16
"""The adjoint with the running product (``backward``, not ``single_pass``: ``linear_scan_bwd``) takes the
pipelined walk from this fraction of the SMs' worth of 64-channel chains (24.75 of 132); below 7/8 it had
run the sequential or chunked plan at 2x-4x the floor. H100, GPU time (CUDA graph), D = 1024, walk against
that plan, in ms: float32 (32 x 64 tiles, 4 stages) (4, 4096) 0.155 / 0.359, (4, 16384) 0.606 / 1.497,
(2, 16384) 0.603 / 0.613, (1, 8192, 2048) 0.303 / 0.321, (64 x 64, 3 stages) (6, 16384) 0.945 / 2.017,
(7, 16384) 0.955 / 2.313; bfloat16 (32 x 64, 3 stages) (4, 4096) 0.139 / 0.307, (4, 16384) 0.545 / 1.059,
(6, 16384) 0.783 / 1.600, (7, 16384) 0.782 / 1.619, (2, 16384) 0.543 / 0.540, (1, 8192, 2048) 0.272 /
0.307; but 4 chains (1, 65536, 256) float32 2.40 / 0.312, bfloat16 2.16 / 0.303: one chain's walk takes
its T steps' time."""
FORWARD_MIN_FILL = 7 / 16
"""The recurrence's forward (``single_pass``, not ``backward``) takes the pipelined walk from this
fraction of the SMs' worth of 64-channel chains: its one-warp programs outrun the single-pass kernel
from about half the SMs. H100, GPU time (CUDA graph) at T = 4096, D = 1024, in ms, walk against single
pass: bfloat16 B = 3 (48 chains) 0.057 / 0.056, B = 4 0.057 / 0.070, B = 5 0.058 / 0.084, B = 6 0.063 /
0.099, (4, 16384, 1024) 0.218 / 0.250; float32 (32-channel programs up to B = 4, see
:func:`_pipelined_tile`) B = 3 0.071 / 0.064, B = 4 0.072 / 0.080, B = 5 0.092 / 0.098, B = 6 0.105 /
0.118, (4, 16384, 1024) 0.282 / 0.306. An earlier walk had been slower there on an H200 (B = 4: float32
0.083 against 0.073 ms, bfloat16 0.085 against 0.069); the current one is not yet timed on an H200."""
SCAN_FORWARD_MIN_FILL = 3 / 16
"""The forward with the running product (``linear_scan_fwd``, not ``single_pass``) takes the pipelined walk
from this fraction of the SMs' worth of 64-channel chains (2-byte types from
:data:`SCAN_FORWARD_LONG_LENGTH` steps: :data:`SCAN_FORWARD_LONG_MIN_FILL`). H100, GPU time (CUDA graph),
float32 walk (32-channel programs) against the plan before it, in ms: (4, 4096, 1024) 0.096 / 0.261,
(1, 8192, 2048) 0.162 / 0.206; against the chunked plan on one warp with 128-step chunks: (2, 4096, 1024)
0.083 / 0.087, (2, 8192, 1024) 0.161 / 0.157, (3, 8192, 1024) 0.163 / 0.222, (2, 16384, 1024) 0.321 /
0.299."""
SCAN_FORWARD_LONG_LENGTH = 4096
"""From this many steps the 2-byte forward with the running product walks from
:data:`SCAN_FORWARD_LONG_MIN_FILL`."""
SCAN_FORWARD_LONG_MIN_FILL = 3 / 8
"""From :data:`SCAN_FORWARD_LONG_LENGTH` steps the 2-byte forward with the running product takes the walk
from this fraction of the SMs' worth of 64-channel chains (49.5 of 132): below it the chunked plan on one
warp with short chunks outruns the walk, whose time grows with T alone. H100, GPU time (CUDA graph),
bfloat16, walk against that chunked plan (128-step chunks; 256 at T = 65536), in ms: 32 chains (2, 4096,
1024) 0.079 / 0.058, (2, 8192, 1024) 0.156 / 0.109, (2, 16384, 1024) 0.309 / 0.199; 48 chains (3, 4096,
1024) 0.079 / 0.077, (3, 8192, 1024) 0.156 / 0.145; but 64 chains (4, 4096, 1024) 0.080 / 0.109, (4, 8192,
1024) 0.157 / 0.194."""
CHUNKED_ONE_WARP_CHAINS = 32
"""From this many rows x 32-channel blocks the chunked plan of the forward with the running product
(``linear_scan_fwd`` where the walk does not run) takes one warp per program instead of four, and chunks
of at least 128 steps, the longest that still give 32 x SMs programs (four warps: 1024 steps, 4 x SMs).
H100, GPU time (CUDA graph), one warp against four (2048-step chunks), in ms: (1, 65536, 1024) (32 chains)
bfloat16 0.504 / 0.744, float32 0.629 / 0.780; but (1, 65536, 256) (8 chains) bfloat16 0.208 / 0.197,
float32 0.230 / 0.209. One warp, chunks of 128 / 256 / 512 / 1024 / 2048 steps: (1, 65536, 1024) bfloat16
0.390 / 0.382 / 0.400 / 0.427 / 0.504, float32 0.599 / 0.591 / 0.602 / 0.610 / 0.631; (2, 16384, 1024)
bfloat16 0.199 / 0.205 / 0.221 / 0.258; (1, 4096, 1024) bfloat16 0.029 / 0.041 / 0.066, float32 0.047 /
0.063 / 0.100."""
SPLIT_MIN_FILL = 9 / 16
"""The log scan's 2-byte forward takes the split walk from this fraction of the SMs' worth of 64-channel
chains (float32 keeps :data:`PIPELINED_MIN_FILL`). H100, GPU time (CUDA graph) of the bfloat16 forward at
T = 4096, D = 1024 against the single pass, in ms: B = 4 (64 chains) 0.068 / 0.070 but (4, 16384, 1024)
0.246 / 0.220, B = 5 0.067 / 0.079, B = 6 0.069 / 0.090; float32 B = 6 0.126 / 0.125."""


class ScanPlan(NamedTuple):
    """Launch configuration: tile (BLOCK_T, BLOCK_J, BLOCK_V), warps, chunk length and counts; for the
    pipelined walks also their pipeline depth and channels per thread (0: the compiler's choice). The split
    walk's tile has BLOCK_T // num_warps steps per warp. The segment kernel's chunk is its segment length,
    ``num_stages`` its pipeline depth and ``per_sm`` its programs per SM (0: one program per segment)."""

    strategy: str
    block_t: int
    block_j: int
    block_v: int
    num_warps: int
    chunk: int
    num_chunks: int
    num_jblocks: int
    num_stages: int = 0
    columns: int = 0
    per_sm: int = 0


@contextlib.contextmanager
def force_strategy(name: str, chunk: int | None = None, block_t: int | None = None) -> Iterator[None]:
    """Within the block, every k = 1 / diagonal scan uses strategy ``name``: "sequential", "chunked",
    "lookback" (the single-pass kernel), "segment" (the k = 1 recurrence's forward by segments read twice,
    :func:`_segment_kernel`), "pipelined" (the pipelined walk) or "split" (the walk with a tile's steps
    split over warps); the last four only for the scans they serve, the others keep the heuristic's choice.

    ``chunk`` sets the chunk length of the chunked strategy (the segment length of "segment", rounded up to
    a multiple of the time tile) and ``block_t`` (a power of two) the time tile (defaults: the
    heuristic's). For tests: small tiles give many tiles per row on small shapes.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if block_t is not None and (block_t < 1 or block_t & (block_t - 1)):
        raise ValueError(f"block_t must be a power of two, got {block_t}")
    _FORCED.append((name, chunk, block_t))
    try:
        with _recipes.overriding():
            yield
    finally:
        _FORCED.pop()


def scan_plan(
    rows: int,
    length: int,
    dj: int,
    v: int,
    itemsize: int,
    sms: int = 132,
    max_block_t: int = 256,
    single_pass: bool = False,
    pipelined: bool = False,
    backward: bool = False,
    split: bool = False,
) -> ScanPlan:
    """Choose tiles and strategy for ``rows`` rows of ``length`` steps, ``dj`` coefficient channels x ``v``.

    ``split``: the caller can run the split walk (:func:`_split_walk_kernel`: the log scan's forward, whose
    exps one warp per SM issues too slowly), taken for enough chains (:data:`SPLIT_MIN_FILL` for 2-byte
    types, else :data:`PIPELINED_MIN_FILL`); its tiles in :func:`_split_tile`.

    ``pipelined``: the caller can run the pipelined walk (the k = 1 scans and their adjoints, ``backward``),
    taken for enough chains (the recurrence's forward :data:`FORWARD_MIN_FILL`, the running product's
    :data:`SCAN_FORWARD_MIN_FILL` or :data:`SCAN_FORWARD_LONG_MIN_FILL`, the recurrence's adjoint
    :data:`PIPELINED_MIN_FILL`, float32 :data:`ADJOINT_FLOAT32_MIN_FILL`, the adjoint with the running
    product :data:`SCAN_ADJOINT_MIN_FILL`). Its tiles (channels x steps, warps, stages):

    - recurrence (``single_pass``): forward 64 x 32 (2-byte types 64 x 64; float32 with at most SMs chains
      of 32 channels 32 x 64, with at most SMs chains of 16 channels 16 x 128, with or without the running
      product) on one warp, 4 stages, two channels per thread (each channel's steps in one thread, but for
      16 channels eight threads split the steps four ways); backward on four warps: float32 64 x 32, 4
      stages (at most SMs chains of 32 channels: 32 x 64, 4 stages; fewer than :data:`PIPELINED_MIN_FILL` x
      SMs chains of 64: 64 x 64, 3 stages), 2-byte types 64 x 64, 3 stages, and with at most 2 x SMs chains
      of 32 channels 32 x 64. On an H200 (GPU time, ms; forward / backward): (8, 16384, 1024) float32 0.386
      / 0.684 against 0.490 / 0.745 for the single-pass kernel, bfloat16 0.262 / 0.501 against 0.429 / 0.521
      (64 x 32 forward: 0.285; the backward tiles of then, float32 64 x 64 with the carry folded, bfloat16
      32 x 128). The backward on an H100 (GPU time, ms, T = 4096 / 16384 / 65536, B = 8, D = 1024) against
      those: bfloat16 32 x 64 0.139 / 0.537 / 2.540 against 0.157 / 0.658 / 2.809 (64 x 64: 0.156 / 0.608 /
      2.416), float32 64 x 32 0.234 / 0.926 / 3.697 against 0.257 / 0.956 / 3.748.
    - with the running product (not ``single_pass``): the recurrence's forward tiles (64 x 32, 2-byte types
      64 x 64, one warp, 4 stages, two channels per thread). The float32 16 x 128 tile, H100, GPU time (CUDA
      graph) against 32 x 64, in ms: (1, 8192, 2048) 0.111 / 0.162, (2, 16384, 1024) 0.218 / 0.320 (the
      chunked plan there: 0.299); the recurrence, which takes the single pass there, 0.091 / 0.139 (single
      pass 0.084). Backward (two value columns) float32 32 x 32 on four warps, 3 stages, the carry folded in
      (four channels per thread; at most SMs chains of 32 channels: 32 x 64, 4 stages; fewer than
      :data:`PIPELINED_MIN_FILL` x SMs chains of 64: 64 x 64), 2-byte types 32 x 64 likewise without the
      fold. H200, (8, 16384, 1024), forward / backward: float32 0.530 / 0.843 against 1.246 / 2.354 for the
      sequential plan, bfloat16 0.359 / 0.790 against 1.092 / 1.702 (3 forward stages: 0.616 and 0.430;
      float32 backward 32 x 128, 2 stages: 0.893; 64 x 64 then). The float32 backward on an H100 (GPU time,
      ms, T = 4096 / 16384 / 65536, B = 8): 32 x 32 0.281 / 1.118 / 4.469 against 0.307 / 1.127 / 4.496 on
      64 x 64 tiles. Earlier, against the 64 x 32 bfloat16 forward and 32 x 64 float32 backward before them
      (GPU time, ms, T = 4096 / 16384 / 65536): bfloat16 forward 0.082 / 0.317 / 1.250 against 0.088 / 0.340
      / 1.492, float32 backward 0.243 / 0.971 / 3.893 against 0.257 / 1.031 / 4.138 (a bfloat16 backward of
      64 channels: 1.4x-1.5x slower).

    ``single_pass``: the scan needs no running product (X), so for k = 1 the single-pass ``lookback``
    kernel can take it (see :data:`LOOKBACK_MIN_CHAINS`). Its tile (channels x steps, warps), each
    channel's steps in one thread where there is one warp:

    - float32 with >= 64 chains of 128 channels: 128 x 16, one warp (16 bytes per lane);
    - float32 with fewer: 32 x 64, two warps;
    - bfloat16/float16: 32 x 64 forward, 32 x 32 backward, one warp;
    - at most :data:`LOOKBACK_FEW_CHAINS` chains of 32 channels (any dtype but float64): 32 x 128
      (from :data:`LOOKBACK_LONG_TILES` steps 32 x 256; 2-byte types 16 x 256), four warps;
    - float64: 64 x 16, one warp, from 16 chains of 64 channels (not re-timed with the narrow tiles).

    On an H200, forward / backward in ms: 1 x 65536 x 256 fp32 32 x 128 x 4 warps 0.114 / 0.136 against
    0.307 / 0.493 for 128 x 16 (2 chains); 2 x 65536 x 1024 fp32 32 x 64 x 2 warps 0.512 / 0.789 against
    0.655 / 0.803; 8 x 16384 x 1024 bf16 32 x 32 0.432 / 0.518 against 0.426 / 0.612 for 128 x 16. The
    2-byte forward's 64 steps, H100, GPU time (CUDA graph) against 32 steps, in ms: 1 x 8192 x 2048 0.073 /
    0.078, 2 x 16384 x 1024 0.136 / 0.147, 4 x 65536 x 512 0.513 / 0.560, 1 x 65536 x 1024 0.291 / 0.336;
    the log forward's single pass 0.073 / 0.079, 0.126 / 0.145 and 0.448 / 0.533 at the first three. The
    adjoint keeps 32 steps: with 64 it was level (H200, 1 x 8192 x 2048: 0.082 against 0.081 ms).

    k = 1 (v = 1): narrow single-warp programs, BLOCK_J = 8 channels (16 for 2-byte types: 32-byte rows)
    x BLOCK_T = 2048 / BLOCK_J rows (at most 256). Sequential when those programs number >= 2 x SMs or
    length <= 2048; otherwise chunked, with 32 channels x 64 rows and 4 warps per program (1 warp for the
    forward with the running product from :data:`CHUNKED_ONE_WARP_CHAINS` chains). On an H200
    (8 x 16384 x 1024, fp32) the sequential 8 x 256 single-warp tile ran the forward at 1.6x the copy
    floor, the former 64 x 32 four-warp chunked plan at 2.9x; for 1 x 65536 x 256 the chunked 32 x 64
    tile with 1024-step chunks ran at 3.5x, the former 64-channel, 512-step plan at 7.2x.

    v > 1 (the diagonal scan): BLOCK_V = next_pow2(v); BLOCK_J * BLOCK_V = 64 channels (128 for 2-byte
    types); BLOCK_T so a tile holds 2048 elements, clipped to [8, 64]; 4 warps (8 past 2048 elements);
    sequential when rows x channel blocks >= SMs or length <= 2048.

    Chunks: a power of two >= 512 steps (1024 for k = 1 on four warps), the largest that still gives 4 x SMs
    programs (row, chunk, channel block; k = 1 on one warp: >= 128 steps, 32 x SMs programs).
    ``max_block_t`` caps BLOCK_T (64 for CPU tensors: the interpreter runs every row of a tile, masked or
    not).
    """
    forced = _FORCED[-1] if _FORCED else None
    plan = _cached_plan if type(rows) is type(length) is type(dj) is int else _make_plan  # not SymInts
    return plan(
        rows, length, dj, v, itemsize, sms, max_block_t, single_pass, pipelined, backward, split, forced
    )


def _make_plan(
    rows: int,
    length: int,
    dj: int,
    v: int,
    itemsize: int,
    sms: int,
    max_block_t: int,
    single_pass: bool,
    pipelined: bool,
    backward: bool,
    split: bool,
    forced: tuple[str, int | None, int | None] | None,
) -> ScanPlan:
    block_v = next_pow2(max(v, 1))
    if forced is not None and forced[0] == "segment":
        if block_v == 1 and single_pass and not backward:
            block_j, block_t, num_warps, stages, seg, per_sm = _segment_tile(dj)
            block_t = forced[2] or min(block_t, max_block_t)
            seg = cdiv(max(forced[1] or seg, block_t), block_t) * block_t
            njb = cdiv(max(dj, 1), block_j)
            segments = cdiv(max(length, 1), seg)
            return ScanPlan("segment", block_t, block_j, 1, num_warps, seg, segments, njb, stages, 0, per_sm)
        forced = None  # a scan the segment kernel does not serve keeps the heuristic's plan
    if block_v == 1 and split and not backward:
        fill = SPLIT_MIN_FILL if itemsize <= 2 else PIPELINED_MIN_FILL
        ok = _pipelined_ok(rows, length, dj, itemsize, sms, fill) if forced is None else forced[0] == "split"
        if ok:
            block_j, block_t, num_warps, stages = _split_tile(dj, itemsize)
            block_t = (forced[2] if forced is not None else None) or min(block_t, max_block_t)
            num_warps = min(num_warps, block_t)
            njb = cdiv(max(dj, 1), block_j)
            return ScanPlan("split", block_t, block_j, 1, num_warps, max(length, 1), 1, njb, stages, 2)
    if forced is not None and forced[0] == "split":
        forced = None  # a scan the split walk does not serve keeps the heuristic's plan
    if backward and not single_pass:
        fill = SCAN_ADJOINT_MIN_FILL
    elif backward and itemsize == 4:
        one_wave = _chains(rows, dj, 32) <= sms
        fill = ADJOINT_FLOAT32_MIN_FILL if one_wave else ADJOINT_FLOAT32_WIDE_MIN_FILL
    elif backward:
        fill = PIPELINED_MIN_FILL
    elif single_pass:
        fill = FORWARD_MIN_FILL
    elif itemsize <= 2 and length >= SCAN_FORWARD_LONG_LENGTH:
        fill = SCAN_FORWARD_LONG_MIN_FILL
    else:
        fill = SCAN_FORWARD_MIN_FILL
    if forced is not None:
        walk = forced[0] == "pipelined"
    else:
        walk = _pipelined_ok(rows, length, dj, itemsize, sms, fill)
    if block_v == 1 and pipelined and walk:
        block_j, block_t, num_warps, stages, columns = _pipelined_tile(
            rows, dj, itemsize, sms, backward, not single_pass
        )
        block_t = (forced[2] if forced is not None else None) or min(block_t, max_block_t)
        njb = cdiv(max(dj, 1), block_j)
        return ScanPlan("pipelined", block_t, block_j, 1, num_warps, max(length, 1), 1, njb, stages, columns)
    if forced is not None and forced[0] == "pipelined":
        forced = None  # a scan the pipelined walk does not serve keeps the heuristic's plan
    lookback = forced is not None or (
        _lookback_chains_ok(rows, dj, itemsize) and length >= LOOKBACK_MIN_LENGTH
    )
    if block_v == 1 and single_pass and (forced is None or forced[0] == "lookback") and lookback:
        block_j, block_t, num_warps = _lookback_tile(rows, dj, itemsize, length, backward)
        block_t = (forced[2] if forced is not None else None) or min(block_t, max_block_t)
        njb, tiles = cdiv(max(dj, 1), block_j), cdiv(max(length, 1), block_t)
        return ScanPlan("lookback", block_t, block_j, 1, num_warps, block_t, tiles, njb)
    if block_v == 1:
        narrow = 16 if itemsize <= 2 else 8
        block_j = min(next_pow2(max(dj, 1)), narrow)
        block_t = max(8, min(max_block_t, 2048 // block_j))
        num_warps, min_chunk, enough, per_sm = 1, 1024, 2 * sms, 4
        if _chains(rows, dj, block_j) < enough and length > 2048:
            block_j, block_t = min(next_pow2(max(dj, 1)), 32), 64
            one = not (single_pass or backward) and _chains(rows, dj, 32) >= CHUNKED_ONE_WARP_CHAINS
            num_warps, min_chunk, per_sm = (1, 128, 32) if one else (4, 1024, 4)
    else:
        width = 128 if itemsize <= 2 else 64
        block_j = max(1, min(next_pow2(max(dj, 1)), width // block_v))
        block_t = max(8, min(64, 2048 // (block_j * block_v)))
        num_warps = 4 if block_t * block_j * block_v <= 2048 else 8
        min_chunk, enough, per_sm = 512, sms, 4
    njb = cdiv(max(dj, 1), block_j)
    programs = rows * njb
    strategy = "sequential" if programs >= enough or length <= 2048 else "chunked"
    chunk: int | None = None
    if forced is not None and forced[0] != "lookback":
        strategy, chunk, forced_t = forced
        block_t = forced_t or block_t
    if strategy == "chunked" and chunk is None:
        wanted = cdiv(per_sm * sms, max(programs, 1))
        chunk = max(min_chunk, 1 << (cdiv(length, wanted).bit_length() - 1))
    if strategy == "sequential" or chunk is None or chunk >= length:
        return ScanPlan("sequential", block_t, block_j, block_v, num_warps, max(length, 1), 1, njb)
    return ScanPlan("chunked", block_t, block_j, block_v, num_warps, chunk, cdiv(length, chunk), njb)


def _chains(rows: int, dj: int, width: int) -> int:
    """Rows x ``width``-channel blocks: the chains a plan of ``width``-channel programs walks."""
    return rows * cdiv(max(dj, 1), width)


def _pipelined_ok(rows: int, length: int, dj: int, itemsize: int, sms: int, fill: float) -> bool:
    """Enough 64-channel chains for a walk (at least ``fill`` x SMs), T long enough, and not float64 (not
    timed)."""
    return itemsize <= 4 and length >= LOOKBACK_MIN_LENGTH and _chains(rows, dj, 64) >= fill * sms


def _pipelined_tile(
    rows: int, dj: int, itemsize: int, sms: int, backward: bool, with_x: bool = False
) -> tuple[int, int, int, int, int]:
    """(BLOCK_J, BLOCK_T, warps, stages, channels per thread) of the pipelined walk; see :func:`scan_plan`.
    ``with_x``: the scan also carries the running product (forward) or its adjoint (backward)."""
    width = next_pow2(max(dj, 1))
    if not backward:
        if itemsize == 4:
            # the narrowest float32 chains that fit in one wave (at most one per SM), longer tiles for fewer
            for narrow, steps in ((16, 128), (32, 64)):
                if _chains(rows, dj, narrow) <= sms:
                    return min(narrow, width), steps, 1, 4, 2
        return min(64, width), 64 if itemsize <= 2 else 32, 1, 4, 2
    if itemsize == 4:
        columns = 4 if with_x else 0  # the running product's adjoint folds the carry, four channels a thread
        if _chains(rows, dj, 32) <= sms:
            return min(32, width), 64, 4, 4, columns  # float32 chains of 32 channels fit in one wave
        if _chains(rows, dj, 64) < PIPELINED_MIN_FILL * sms:
            return min(64, width), 64, 4, 3, columns
        return (min(32, width), 32, 4, 3, 4) if with_x else (min(64, width), 32, 4, 4, 0)
    if with_x or (itemsize <= 2 and _chains(rows, dj, 32) <= 2 * sms):
        return min(32, width), 64, 4, 3, 0
    return min(64, width), 64, 4, 3, 0


def _split_tile(dj: int, itemsize: int) -> tuple[int, int, int, int]:
    """(BLOCK_J, BLOCK_T, warps, stages) of the split walk: 64 channels, two per thread; float32 eight warps
    of 16 steps (128-step tiles), 3 stages; 2-byte types four warps of 16 steps, 4 stages. H200, GPU time
    of the log forward (exp on load) at (8, 16384, 1024) against the single pass, in a probe of this kernel
    without the flag: float32 0.445 against 0.505 ms (four warps of 32 steps 0.449, of 16 steps 0.457),
    bfloat16 0.240 against 0.392 ms (3 stages 0.253, eight warps 0.271); the library's kernel: float32 0.459
    against 0.506 ms (0.478 with the flag's maximum reduced across warps on every tile), bfloat16 1.01
    against 1.56 ms at (8, 65536, 1024). On the plain k = 1 forward it is
    slower than the one-warp walk (float32 0.425 against 0.384 ms, bfloat16 0.231 against 0.228), which
    keeps that."""
    block_j = min(64, next_pow2(max(dj, 1)))
    if itemsize <= 2:
        return block_j, 64, 4, 4
    return block_j, 128, 8, 3


def _segment_tile(dj: int) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_J, BLOCK_T, warps, stages, segment steps, programs per SM) of the segment kernel."""
    return min(32, next_pow2(max(dj, 1))), 64, 1, 3, 512, 2


def _lookback_chains_ok(rows: int, dj: int, itemsize: int) -> bool:
    """Enough chains for the single-pass kernel: :data:`LOOKBACK_MIN_CHAINS` of 32 channels; float64, whose
    tile stays 64 channels wide, keeps its former rule of 16 chains of 64 channels."""
    if itemsize == 8:
        return _chains(rows, dj, 64) >= 16
    return _chains(rows, dj, 32) >= LOOKBACK_MIN_CHAINS


def _lookback_tile(rows: int, dj: int, itemsize: int, length: int, backward: bool) -> tuple[int, int, int]:
    """(BLOCK_J, BLOCK_T, warps) of the single-pass kernel; see :func:`scan_plan`."""
    width = next_pow2(max(dj, 1))
    if itemsize == 8:
        return min(64, width), 16, 1
    if _chains(rows, dj, 32) <= LOOKBACK_FEW_CHAINS:
        if itemsize <= 2:
            return min(16, width), 256, 4
        return min(32, width), 256 if length >= LOOKBACK_LONG_TILES else 128, 4
    if itemsize <= 2:
        return min(32, width), 32 if backward else 64, 1
    if _chains(rows, dj, 128) < 64:
        return min(32, width), 64, 2
    return min(128, width), 16, 1


_cached_plan = functools.lru_cache(maxsize=512)(_make_plan)
""":func:`_make_plan` memoised: a plan is a pure function of its arguments, and planning on every call
costs microseconds of host time."""


def _strategy(rows: int, length: int, dj: int, v: int, itemsize: int, sms: int = 132) -> str:
    """ "sequential" or "chunked": the strategy :func:`scan_plan` picks for these sizes."""
    return scan_plan(rows, length, dj, v, itemsize, sms).strategy


# ---------------------------------------------------------------------------------------------------------
# Drivers shared with the diagonal scan
# ---------------------------------------------------------------------------------------------------------

_FLAGS = (
    "WALK_REV",
    "SHIFT",
    "SUMMARY",
    "CARRY",
    "HAS_UX",
    "X_ONE",
    "HAS_INIT",
    "WRITE_X",
    "WRITE_H",
    "DA",
    "PREV_X",
    "HAS_PREV0",
    "DINIT",
)


_LOOKBACK_PTRS = ("coef", "u", "init", "hout", "prevh", "prev0", "da", "dinit", "lb")
_LOOKBACK_FLAGS = (
    "WALK_REV", "SHIFT", "HAS_INIT", "DA", "HAS_PREV0", "DINIT", "EXP_COEF", "EXP_U", "LOG_GRADS", "BAIL",
    "H0_SLOT",
)  # fmt: skip
LOOKBACK_REPLAY = 4
"""Summaries one replay step of the single-pass kernel's look-back loads at once."""


@functools.lru_cache(maxsize=1024)
def _meta(names: tuple[str, ...], given: tuple[tuple[str, int], ...]) -> MappingProxyType[str, int]:
    """The constexpr flags of a launch: each of ``names`` as an int, 0 where ``given`` leaves it out
    (read-only, memoised: building it costs several microseconds of host time per launch)."""
    flags = dict(given)
    return MappingProxyType({name: int(flags.get(name, 0)) for name in names})


def _run(
    plan: ScanPlan,
    ptrs: dict[str, Tensor],
    rows: int,
    length: int,
    dj: int,
    v: int,
    chunk: int,
    nc: int,
    **flags: int,
) -> None:
    """One launch of :func:`_scan_kernel`; pointers not named in ``ptrs`` are None (the flags that would
    read or write them are off, so the kernel never touches them; a None argument is cheaper to launch
    than a tensor)."""
    names = ("coef", "u", "ux", "init", "hcarry", "xcarry", "hout", "xout", "pout", "prevh", "prevx",
             "prev0", "da", "dinit")  # fmt: skip
    args = list(map(ptrs.get, names))
    meta = _meta(_FLAGS, tuple(flags.items()))
    grid = (rows * nc * plan.num_jblocks,)
    launch(
        _scan_kernel, grid, *args, length, dj, v, chunk, nc, plan.num_jblocks, **meta,
        BLOCK_T=plan.block_t, BLOCK_J=plan.block_j, BLOCK_V=plan.block_v, FP64=is_fp64(ptrs["coef"]),
        num_warps=plan.num_warps,
    )  # fmt: skip


def _plan_for(
    coef: Tensor,
    v: int,
    single_pass: bool = False,
    pipelined: bool = False,
    backward: bool = False,
    split: bool = False,
) -> ScanPlan:
    rows, length, dj = coef.shape
    max_block_t = 256 if coef.device.type == "cuda" else 64
    sms = num_sms(coef.device)
    return scan_plan(
        rows, length, dj, v, coef.element_size(), sms, max_block_t, single_pass, pipelined, backward, split
    )


_PIPELINED_PTRS = ("coef", "u", "ux", "init", "hout", "xout", "prevh", "prevx", "prev0", "da", "dinit", "lb")
_PIPELINED_FLAGS = (*_LOOKBACK_FLAGS, "WRITE_X", "HAS_UX", "PREV_X")


def _run_walk(
    kernel: Any,
    names: tuple[str, ...],
    flag_names: tuple[str, ...],
    plan: ScanPlan,
    ptrs: dict[str, Tensor],
    flags: dict[str, int],
    fix_dj: bool,
    **tile: int,
) -> Tensor | None:
    """One launch of a walk kernel (one program per chain: :func:`_pipelined_kernel`,
    :func:`_split_walk_kernel`) with the pointers ``names`` (None where ``ptrs`` has none), the flags
    ``flag_names`` (0 where ``flags`` has none), DJ as a constant where ``fix_dj`` and the tile's own
    constants ``tile``. With BAIL returns the int32 flag (one element, 1 if set), else None."""
    coef = ptrs["coef"]
    rows, length, dj = coef.shape
    args = list(map(ptrs.get, names))
    meta = _meta(flag_names, tuple(flags.items()))
    flag = torch.zeros(1, dtype=torch.int32, device=coef.device) if meta["BAIL"] else None
    fixed = dj if fix_dj and type(dj) is int else 0  # not a SymInt
    launch(
        kernel, (rows * plan.num_jblocks,), *args, flag, length, dj, plan.num_jblocks, **meta,
        FAST=fast_math(coef), FIXED_DJ=fixed, STAGES=plan.num_stages, COLUMNS=plan.columns,
        BLOCK_J=plan.block_j, FP64=is_fp64(coef), num_warps=plan.num_warps, **tile,
    )  # fmt: skip
    return flag


def _run_pipelined(plan: ScanPlan, ptrs: dict[str, Tensor], **flags: int) -> Tensor | None:
    """One launch of :func:`_pipelined_kernel` (one program per chain), called like :func:`_run_lookback`.
    With BAIL returns the int32 flag (one element, 1 if set), else None. DJ is a constant for one-warp
    tiles."""
    return _run_walk(
        _pipelined_kernel, _PIPELINED_PTRS, _PIPELINED_FLAGS, plan, ptrs, flags, plan.num_warps == 1,
        BLOCK_T=plan.block_t,
    )  # fmt: skip


_SPLIT_PTRS = ("coef", "u", "init", "hout")
_SPLIT_FLAGS = ("HAS_INIT", "EXP_COEF", "EXP_U", "BAIL", "H0_SLOT")


def _run_split(plan: ScanPlan, ptrs: dict[str, Tensor], **flags: int) -> Tensor | None:
    """One launch of :func:`_split_walk_kernel` (one program per chain), called like :func:`_run_pipelined`
    with the flags it takes (others ignored). With BAIL returns the int32 flag (one element, 1 if set)."""
    warps = plan.num_warps
    return _run_walk(
        _split_walk_kernel, _SPLIT_PTRS, _SPLIT_FLAGS, plan, ptrs, flags, True, WARPS=warps,
        SUB=plan.block_t // warps,
    )  # fmt: skip


def _lookback_buffers(coef: Tensor, plan: ScanPlan, counters: int) -> tuple[int, Tensor, Tensor, Tensor]:
    """(chains, statuses, summaries, final states) of a launch over ``plan``'s tiles taken in chain order:
    one zeroed int32 status per tile and ``counters`` more after them, the summaries (tiles, 2, BLOCK_J)
    and final states (tiles, BLOCK_J) in the accumulation type."""
    rows = coef.shape[0]
    chains = rows * plan.num_jblocks
    tiles = chains * plan.num_chunks
    acc = _acc_dtype(coef)
    flag_buf = torch.zeros(tiles + counters, dtype=torch.int32, device=coef.device)
    agg = torch.empty((tiles, 2, plan.block_j), dtype=acc, device=coef.device)
    inc = torch.empty((tiles, plan.block_j), dtype=acc, device=coef.device)
    return chains, flag_buf, agg, inc


def _run_lookback(plan: ScanPlan, ptrs: dict[str, Tensor], **flags: int) -> Tensor:
    """One launch of :func:`_lookback_kernel` (one program per tile) with its status buffers, called like
    :func:`_run`: pointers it does not name are None (never touched); flags it does not take are ignored,
    those it takes default to 0. Returns the int32 status buffer; its last element is the flag of a BAIL
    launch (1 if set)."""
    coef = ptrs["coef"]
    _, length, dj = coef.shape
    chains, flag_buf, agg, inc = _lookback_buffers(coef, plan, 2)  # the tile counter, the BAIL flag
    tiles = chains * plan.num_chunks
    args = list(map(ptrs.get, _LOOKBACK_PTRS))
    meta = _meta(_LOOKBACK_FLAGS, tuple(flags.items()))
    launch(
        _lookback_kernel, (tiles,), *args, agg, inc, flag_buf, length, dj, plan.num_jblocks, chains,
        plan.num_chunks, **meta, FAST=fast_math(coef), SPARSE=sparse_every(),
        REPLAY=LOOKBACK_REPLAY, BLOCK_T=plan.block_t, BLOCK_J=plan.block_j, FP64=is_fp64(coef),
        num_warps=plan.num_warps,
    )  # fmt: skip
    return flag_buf


_SEGMENT_PTRS = ("coef", "u", "init", "hout")


def _run_segment(plan: ScanPlan, ptrs: dict[str, Tensor], **flags: int) -> None:
    """One launch of :func:`_segment_kernel` with its status buffer and summaries, called like
    :func:`_run_lookback` with the flags it takes (WALK_REV, HAS_INIT; others ignored)."""
    coef = ptrs["coef"]
    _, length, dj = coef.shape
    chains, flag_buf, agg, inc = _lookback_buffers(coef, plan, 1)  # the segment counter
    tiles = chains * plan.num_chunks
    programs = min(tiles, plan.per_sm * num_sms(coef.device)) if plan.per_sm else tiles
    launch(
        _segment_kernel, (programs,), *map(ptrs.get, _SEGMENT_PTRS), agg, inc, flag_buf, length, dj,
        plan.num_jblocks, chains, plan.num_chunks, WALK_REV=int(flags.get("WALK_REV", 0)),
        HAS_INIT=int(flags.get("HAS_INIT", 0)), SPARSE=sparse_every(), REPLAY=LOOKBACK_REPLAY,
        PERSIST=int(programs < tiles),
        SEG=plan.chunk, STAGES=plan.num_stages, BLOCK_T=plan.block_t, BLOCK_J=plan.block_j,
        FP64=is_fp64(coef), num_warps=plan.num_warps,
    )  # fmt: skip


def _acc_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def scan_forward(
    coef: Tensor, u: Tensor, init: Tensor | None, v: int, want_x: bool, reverse: bool = False
) -> tuple[Tensor | None, Tensor]:
    """States of h_t = a_t h_{t-1} + b_t: coef (R, L, DJ), u (R, L, DJ v), init (R, DJ v) or None (zeros).

    Returns (X, H): X (R, L, DJ) the running product of ``coef`` when ``want_x`` (else None), H like ``u``.
    ``reverse`` runs the recurrence from t = L down to 1. Inputs must be contiguous, of one dtype.
    """
    rows, length, dj = coef.shape
    plan = _plan_for(coef, v, single_pass=not want_x, pipelined=True)
    hout = torch.empty_like(u)
    xout = torch.empty_like(coef) if want_x else None
    outs = {"hout": hout, **({"xout": xout} if xout is not None else {})}
    inits = {"init": init} if init is not None else {}
    flags = {"X_ONE": 1, "WRITE_X": int(want_x), "WRITE_H": 1, "HAS_INIT": int(init is not None)}
    if plan.strategy == "pipelined":
        _run_pipelined(plan, {"coef": coef, "u": u, **inits, **outs}, WALK_REV=int(reverse), **flags)
        return xout, hout
    if plan.strategy == "lookback":
        _run_lookback(plan, {"coef": coef, "u": u, **inits, **outs}, WALK_REV=int(reverse), **flags)
        return None, hout
    if plan.strategy == "segment":
        _run_segment(plan, {"coef": coef, "u": u, **inits, **outs}, WALK_REV=int(reverse), **flags)
        return None, hout
    if plan.strategy == "sequential":
        _run(plan, {"coef": coef, "u": u, **inits, **outs}, rows, length, dj, v, length, 1,
             WALK_REV=int(reverse), **flags)  # fmt: skip
        return xout, hout
    nc, acc = plan.num_chunks, _acc_dtype(coef)
    sum_p = torch.empty((rows, nc, dj), dtype=acc, device=coef.device)
    sum_h = torch.empty((rows, nc, dj * v), dtype=acc, device=coef.device)
    _run(plan, {"coef": coef, "u": u, "hout": sum_h, "pout": sum_p}, rows, length, dj, v, plan.chunk, nc,
         WALK_REV=int(reverse), SUMMARY=1)  # fmt: skip
    car_h = torch.empty_like(sum_h)
    car_x = torch.empty_like(sum_p)
    _run(plan, {"coef": sum_p, "u": sum_h, **inits, "hout": car_h, "xout": car_x}, rows, nc, dj, v, nc, 1,
         X_ONE=1, WRITE_X=int(want_x), WRITE_H=1, HAS_INIT=int(init is not None))  # fmt: skip
    _run(plan, {"coef": coef, "u": u, **inits, "hcarry": car_h, "xcarry": car_x, **outs}, rows, length, dj,
         v, plan.chunk, nc, WALK_REV=int(reverse), CARRY=1, **flags)  # fmt: skip
    return xout, hout


def scan_backward(
    coef: Tensor,
    grad_h: Tensor,
    grad_x: Tensor | None,
    prev_h: Tensor,
    prev0: Tensor | None,
    prev_x: Tensor | None,
    v: int,
    want_dinit: bool,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Adjoint of :func:`scan_forward` -> (da (R, L, DJ), du like ``grad_h``, d(init) (R, DJ v) or None).

    g_t = grad_h_t + a_{t+1} g_{t+1} (and the same for grad_x, a-like, when given); du = g;
    da_t = sum_v g_t H_{t-1} + gx_t X_{t-1}, with H_{t-1} from ``prev_h`` (``prev0`` or 0 before t = 1) and
    X_{t-1} from ``prev_x`` (1 before t = 1); d(init) = a_1 g_1. ``reverse`` as in :func:`scan_forward`.
    All tensors contiguous, of one dtype.
    """
    rows, length, dj = coef.shape
    plan = _plan_for(coef, v, single_pass=grad_x is None and prev_x is None, pipelined=True, backward=True)
    da = torch.empty_like(coef)
    du = torch.empty_like(grad_h)
    dinit = torch.empty((rows, dj * v), dtype=coef.dtype, device=coef.device) if want_dinit else None
    walk = int(not reverse)
    has_ux = grad_x is not None
    ux = {"ux": grad_x} if grad_x is not None else {}
    reads = {"prevh": prev_h, **({"prevx": prev_x} if prev_x is not None else {})}
    reads.update({"prev0": prev0} if prev0 is not None else {})
    outs = {"hout": du, "da": da, **({"dinit": dinit} if dinit is not None else {})}
    flags = {"WRITE_H": 1, "DA": 1, "PREV_X": int(prev_x is not None), "HAS_PREV0": int(prev0 is not None),
             "DINIT": int(want_dinit), "HAS_UX": int(has_ux)}  # fmt: skip
    if plan.strategy == "pipelined":
        _run_pipelined(plan, {"coef": coef, "u": grad_h, **ux, **reads, **outs}, WALK_REV=walk, SHIFT=1,
                       **flags)  # fmt: skip
        return da, du, dinit
    if plan.strategy == "lookback":
        _run_lookback(plan, {"coef": coef, "u": grad_h, **reads, **outs}, WALK_REV=walk, SHIFT=1, **flags)
        return da, du, dinit
    if plan.strategy == "sequential":
        _run(plan, {"coef": coef, "u": grad_h, **ux, **reads, **outs}, rows, length, dj, v, length, 1,
             WALK_REV=walk, SHIFT=1, **flags)  # fmt: skip
        return da, du, dinit
    nc, acc = plan.num_chunks, _acc_dtype(coef)
    sum_p = torch.empty((rows, nc, dj), dtype=acc, device=coef.device)
    sum_h = torch.empty((rows, nc, dj * v), dtype=acc, device=coef.device)
    sum_x = torch.empty_like(sum_p)
    _run(plan, {"coef": coef, "u": grad_h, **ux, "hout": sum_h, "xout": sum_x, "pout": sum_p}, rows, length,
         dj, v, plan.chunk, nc, WALK_REV=walk, SHIFT=1, SUMMARY=1, HAS_UX=int(has_ux))  # fmt: skip
    car_h = torch.empty_like(sum_h)
    car_x = torch.empty_like(sum_p)
    _run(plan, {"coef": sum_p, "u": sum_h, "ux": sum_x, "hout": car_h, "xout": car_x}, rows, nc, dj, v, nc,
         1, HAS_UX=int(has_ux), WRITE_X=int(has_ux), WRITE_H=1)  # fmt: skip
    _run(plan, {"coef": coef, "u": grad_h, **ux, **reads, **outs, "hcarry": car_h, "xcarry": car_x}, rows,
         length, dj, v, plan.chunk, nc, WALK_REV=walk, SHIFT=1, CARRY=1, **flags)  # fmt: skip
    return da, du, dinit


# ---------------------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------------------


def linear_envelope(a: Tensor, b: Tensor) -> str | None:
    """None when the k = 1 kernels take ``a``, ``b`` (B, T, D), else the reason (reads shapes only).

    Any B and D and any T >= 1 are taken.
    """
    if a.dim() != 3 or tuple(b.shape) != tuple(a.shape):
        return (
            f"the linear kernel takes a, b of one shape (B, T, D), got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[1] < 1:
        return f"T must be >= 1 for the linear kernel, got T={a.shape[1]}"
    return None


def _check_envelope(reason: str | None) -> None:
    if reason is not None:
        raise ValueError(reason)


def check_kernel_device(name: str, x: Tensor) -> None:
    """Raise ValueError unless ``x`` is on a device the kernels run on."""
    if not on_kernel_device(x):
        raise ValueError(
            f"{name} must be a CUDA tensor (or a CPU tensor under TRITON_INTERPRET=1), got device {x.device}"
        )


def _check_btd(names: Sequence[str], tensors: Sequence[Tensor], h0: Tensor | None = None) -> None:
    """Check (B, T, D) inputs of one shape, dtype and device, and the initial state ``h0`` (B, D) when given:
    one common-case test, the detailed checks (which name what is wrong) only when it fails."""
    if common_case(tensors[0], tensors[1:], h0):
        return
    first = check_float_tensor(names[0], tensors[0], 3, "(B, T, D)")
    for name, x in zip(names[1:], tensors[1:], strict=True):
        check_float_tensor(name, x, 3, "(B, T, D)")
        check_shape(name, x, tuple(first.shape), f"like {names[0]} (B, T, D)")
    check_same_device_dtype(dict(zip(names, tensors, strict=True)))
    check_kernel_device(names[0], first)
    _check_envelope(linear_envelope(first, tensors[1]))
    if h0 is not None:
        check_float_tensor("h0", h0, 2, "(B, D)")
        check_shape("h0", h0, (first.shape[0], first.shape[2]), "(B, D)")
        check_same_device_dtype({names[0]: first, "h0": h0})


@triton_op("mingru::linear_scan_fwd", mutates_args=())
def linear_scan_fwd(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Linear scan: a, b (B, T, D) -> (A, Bc) (B, T, D) in the input dtype.

    A_t = a_t ... a_1 and Bc_t = a_t Bc_{t-1} + b_t (Bc_0 = 0); fp32 accumulation (fp64 for fp64).
    Raises TypeError/ValueError on bad dtypes, shapes, devices or outside :func:`linear_envelope`.
    """
    return _scan_fwd(a, b)


def _btd_kind(first: Tensor, *same: Tensor) -> Any:
    """The recipe key of valid (B, T, D) inputs of one shape, dtype and device: (shape, dtype)."""
    return common_case(first, same) and (first.shape, first.dtype)


def _recurrence_kind(first: Tensor, *rest: Tensor) -> Any:
    """The recipe key of valid inputs (B, T, D) x k and an initial state (B, D), ``rest[0]``."""
    return common_case(first, rest[1:], rest[0]) and (first.shape, first.dtype)


@_recipes.replayed("linear_scan_fwd", _btd_kind)
def _scan_fwd(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    _check_btd(("a", "b"), (a, b))
    a, b = a.contiguous(), b.contiguous()
    A, Bc = scan_forward(a, b, None, 1, True)
    assert A is not None
    return A, Bc


@triton_op("mingru::linear_scan_bwd", mutates_args=())
def linear_scan_bwd(a: Tensor, A: Tensor, Bc: Tensor, gA: Tensor, gBc: Tensor) -> tuple[Tensor, Tensor]:
    """Adjoint of :func:`linear_scan_fwd`: all (B, T, D) -> (da, db).

    qA_t = gA_t + a_{t+1} qA_{t+1}, qB_t = gBc_t + a_{t+1} qB_{t+1}; db = qB and
    da_t = qA_t A_{t-1} + qB_t Bc_{t-1} (A_0 = 1, Bc_0 = 0).
    """
    return _scan_bwd(a, A, Bc, gA, gBc)


@_recipes.replayed("linear_scan_bwd", _btd_kind)
def _scan_bwd(a: Tensor, A: Tensor, Bc: Tensor, gA: Tensor, gBc: Tensor) -> tuple[Tensor, Tensor]:
    _check_btd(("a", "A", "Bc", "gA", "gBc"), (a, A, Bc, gA, gBc))
    a, A, Bc, gA, gBc = (x.contiguous() for x in (a, A, Bc, gA, gBc))
    da, db, _ = scan_backward(a, gBc, gA, Bc, None, A, 1, False)
    return da, db


@_recipes.replayed("linear_recurrence_fwd", lambda a, b, h0: _recurrence_kind(a, h0, b))
def _recurrence_fwd(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    _check_btd(("a", "b"), (a, b), h0)
    a, b, h0 = a.contiguous(), b.contiguous(), h0.contiguous()
    _, h = scan_forward(a, b, h0, 1, False)
    return h


@_recipes.replayed("linear_recurrence_bwd", _recurrence_kind)
def _recurrence_bwd(a: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    _check_btd(("a", "h", "grad_h"), (a, h, grad_h), h0)
    a, h0, h, grad_h = (x.contiguous() for x in (a, h0, h, grad_h))
    da, db, dh0 = scan_backward(a, grad_h, None, h, h0, None, 1, True)
    assert dh0 is not None
    return da, db, dh0


@triton_op("mingru::linear_recurrence_fwd", mutates_args=())
def linear_recurrence_fwd(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """h_t = a_t h_{t-1} + b_t from h0: a, b (B, T, D), h0 (B, D) -> h (B, T, D) in the input dtype.

    Only h is written (the layer path). Raises as :func:`linear_scan_fwd`.
    """
    return _recurrence_fwd(a, b, h0)


@triton_op("mingru::linear_recurrence_bwd", mutates_args=())
def linear_recurrence_bwd(a: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Adjoint of :func:`linear_recurrence_fwd` -> (da, db (B, T, D), dh0 (B, D)).

    g_t = grad_h_t + a_{t+1} g_{t+1}; db = g, da_t = g_t h_{t-1} (h_0 = h0), dh0 = a_1 g_1.
    """
    return _recurrence_bwd(a, h0, h, grad_h)


scan = eager_path(
    "LinearScan", linear_scan_fwd, _scan_fwd, _scan_bwd, lambda x, out: (x[0], *out), zero_unused=True
)
"""``scan(a, b)``: :func:`linear_scan_fwd` for the dispatch (``SCAN_IMPLS``), eagerly without the op's
dispatch (:func:`~mingru_triton._launch.eager_path`)."""

recurrence = eager_path(
    "LinearRecurrence", linear_recurrence_fwd, _recurrence_fwd, _recurrence_bwd, lambda x, h: (x[0], x[2], h)
)
"""``recurrence(a, b, h0)``: :func:`linear_recurrence_fwd` for the layers, eagerly without the op's dispatch
(:func:`~mingru_triton._launch.eager_path`)."""


def _setup_scan(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], *output)


def _backward_scan(ctx, gA, gBc):
    a, A, Bc = ctx.saved_tensors
    return linear_scan_bwd(a, A, Bc, grad_or_zeros(gA, A), grad_or_zeros(gBc, Bc))


def _setup_recurrence(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[2], output)


def _backward_recurrence(ctx, grad_h):
    a, h0, h = ctx.saved_tensors
    return linear_recurrence_bwd(a, h0, h, grad_or_zeros(grad_h, h))


linear_scan_fwd.register_autograd(_backward_scan, setup_context=_setup_scan)
linear_recurrence_fwd.register_autograd(_backward_recurrence, setup_context=_setup_recurrence)
