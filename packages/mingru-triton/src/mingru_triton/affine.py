"""Matrix affine scan kernels: k x k transitions acting on k x v states.

Shapes: A (B, T, n, k, k), Bm (B, T, n, k, v), H0 (B, n, k, v). Forward math: Abar_t = A_t ... A_1 (newest on
the left), Bbar_t = A_t Bbar_{t-1} + B_t from Bbar_0 = 0, and the lean recurrence H_t = A_t H_{t-1} + B_t
from H0. Adjoint: L_t = G_t + A_{t+1}^T L_{t+1} (reverse in time), dB_t = L^B_t and
dA_t = L^A_t Abar_{t-1}^T + L^B_t X_{t-1}^T with X = Bbar (X_0 = 0) or H (X_0 = H0); dH0 = A_1^T L^B_1.

Every step multiplies small register tiles padded to powers of two (at least 2). Products use ``tl.dot``
in IEEE float32 when all tile sides are >= 16 and the input is not float64, else a broadcast multiply and
sum; on that broadcast path the step loops load their inputs ahead (:data:`BROADCAST_PREFETCH`) and the
adjoint's step kernel holds several (batch, head) rows per program (:data:`ADJOINT_GROUP_ENTRIES`). Carries
are float32 (float64 for float64 inputs).

Envelope: k <= 32 and v <= 64 (:func:`affine_envelope`). Strategies (:func:`_strategy`): "sequential", one
program per (batch, head) walking T; "chunked", three launches: phase 1 summarises each time chunk (its
composed transition and its zero-start end state), phase 2 scans the summaries per (batch, head), phase 3
replays every chunk from its carry-in, recomputing from the inputs and writing the outputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op

from mingru._checks import check_float_tensor, check_same_device_dtype, check_shape
from mingru_triton import _recipes
from mingru_triton._launch import (
    _PLAIN,
    FLOAT_DTYPES,
    cdiv,
    eager_path,
    launch,
    next_pow2,
    num_sms,
    on_kernel_device,
    sqrt_chunk,
)

__all__ = [
    "affine_envelope",
    "affine_recurrence_bwd",
    "affine_recurrence_fwd",
    "affine_scan_bwd",
    "affine_scan_fwd",
    "force_strategy",
    "recurrence",
    "scan",
]

MAX_K = 32
"""Largest transition size k the kernels take."""
MAX_V = 64
"""Largest number of state columns v the kernels take."""
MIN_CHUNK = 64
"""Shortest time chunk the chunked strategy picks on its own (KP <= 4; twice that for larger tiles)."""
STRATEGIES = ("sequential", "chunked")
DOT_STAGES = 3
"""Software-pipelining depth (``tl.range(num_stages=...)``) of the per-step loops on the tl.dot path; the
broadcast path (small tiles) keeps 1 and loads ahead instead (:data:`BROADCAST_PREFETCH`). On an H200
(B * n = 64, T = 4096) 3 stages ran 1.06x-1.3x faster for k = 16 and 32 and up to 2x slower for k = 2
(float32)."""
ADJOINT_GROUP_ENTRIES = 32
"""k x k tile entries a program of the adjoint's step kernel (:func:`_bwd_kernel`) holds over its rows on the
broadcast path: it takes max(1, ADJOINT_GROUP_ENTRIES // KP^2) rows (b, h) at once (8 for k <= 2, 2 for
k <= 4), so that a small tile leaves fewer lanes of a warp holding copies. Rows next to each other are
heads of one batch entry: a group's tiles at a step lie next to each other in memory."""
BROADCAST_PREFETCH = 2
"""Steps (chunks, in the carries) ahead that the loops of the broadcast path (:func:`_mm` without tl.dot)
load their inputs into registers, 0 to 2: the forward's for tiles of 8 x 8 and up, the adjoint's for 4 x 4
and up (:func:`_prefetch`; smaller ones load each step's own). On an H100 at (B, T, n) = (4, 4096, 16),
against loading each step's own, it ran k = v = 8 1.07x-1.18x faster forward and 1.00x-1.15x
forward+backward; k = v = 4 1.01x-1.22x faster forward+backward but 0.91x-1.07x forward; k = v = 2
1.1x-1.4x slower (the instructions a program issues per step bind it more than its loads)."""

_forced: tuple[str, int | None] | None = None


# ----------------------------------------------------------------------------------------------- kernels


@triton.jit
def _mm(a, b, DOT: tl.constexpr):
    """a (M, K) @ b (K, N): IEEE ``tl.dot`` when ``DOT`` (every side >= 16), else multiply + sum.

    The product is written b[None] * a[..., None] on purpose: Triton's combine pass rewrites exactly
    ``sum(a[:, :, None] * b[None, :, :], 1)`` with M, N >= 16 into a ``tt.dot``, in TF32 up to Triton 3.6
    and for any K, so on sm_80+ it ran on tensor cores (mma m16n8k8) and a K < 8 product (L^B X^T with
    v = 4, k = 16) came out wrong. With the operands swapped the pattern does not match and the sum stays
    a plain float32 (or float64) multiply + reduce on every Triton version.
    """
    c = tl.dot(a, b, input_precision="ieee") if DOT else tl.sum(b[None, :, :] * a[:, :, None], axis=1)
    return c


@triton.jit
def _fwd_loads(a_ptr, b_ptr, base, t, end, n, kk, kv, o_kk, o_kv, m_kk, m_kv):
    """Step t's (A_t, B_t) tiles in their input dtype (a conversion next to a load would wait on it), zero
    from ``end`` on."""
    step = base + t * n
    a_t = tl.load(a_ptr + step * kk + o_kk, mask=m_kk & (o_kk * 0 + t < end), other=0.0)
    b_t = tl.load(b_ptr + step * kv + o_kv, mask=m_kv & (o_kv * 0 + t < end), other=0.0)
    return a_t, b_t


@triton.jit
def _fwd_kernel(
    a_ptr,
    b_ptr,
    h0_ptr,
    abar_ptr,
    h_ptr,
    ca_ptr,
    cb_ptr,
    T,
    n,
    k,
    v,
    chunk,
    NC,
    NL,
    C0,
    KP: tl.constexpr,
    VP: tl.constexpr,
    FP64: tl.constexpr,
    DOT_KK: tl.constexpr,
    DOT_KV: tl.constexpr,
    TRACK_P: tl.constexpr,
    WRITE_ABAR: tl.constexpr,
    WRITE_H: tl.constexpr,
    SUMMARY: tl.constexpr,
    CARRY: tl.constexpr,
    HAS_H0: tl.constexpr,
    STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """One program per (row = b * n + h, chunk): walks steps [c * chunk, min(T, (c + 1) * chunk)).

    The state starts at (I, 0), at (I, H0) when HAS_H0, or at the carries (ca, cb) of this chunk when CARRY.
    Writes Abar / H per step when asked; with SUMMARY stores the composed product and end state in (ca, cb).
    """
    ACC = tl.float64 if FP64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    row = pid // NL
    c = pid % NL + C0
    slot = row * NC + c
    b = row // n
    h = row % n
    start = c * chunk
    end = tl.minimum(start + chunk, T)
    rk = tl.arange(0, KP)
    ck = tl.arange(0, KP)
    cv = tl.arange(0, VP)
    m_kk = (rk[:, None] < k) & (ck[None, :] < k)
    m_kv = (rk[:, None] < k) & (cv[None, :] < v)
    o_kk = rk[:, None] * k + ck[None, :]
    o_kv = rk[:, None] * v + cv[None, :]
    s_kk = slot * KP * KP + rk[:, None] * KP + ck[None, :]
    s_kv = slot * KP * VP + rk[:, None] * VP + cv[None, :]
    kk = k * k
    kv = k * v
    base = b * T * n + h

    prod = (rk[:, None] == ck[None, :]).to(ACC)
    state = tl.zeros((KP, VP), dtype=ACC)
    if CARRY:
        state = tl.load(cb_ptr + s_kv)
        if TRACK_P:
            prod = tl.load(ca_ptr + s_kk)
    elif HAS_H0:
        state = tl.load(h0_ptr + row * kv + o_kv, mask=m_kv, other=0.0).to(ACC)

    if PREFETCH >= 1:
        ahead1 = _fwd_loads(a_ptr, b_ptr, base, start, end, n, kk, kv, o_kk, o_kv, m_kk, m_kv)
    if PREFETCH >= 2:
        ahead2 = _fwd_loads(a_ptr, b_ptr, base, start + 1, end, n, kk, kv, o_kk, o_kv, m_kk, m_kv)
    for t in tl.range(start, end, num_stages=STAGES):
        step = base + t * n
        if PREFETCH == 0:
            a_t = tl.load(a_ptr + step * kk + o_kk, mask=m_kk, other=0.0).to(ACC)
            b_t = tl.load(b_ptr + step * kv + o_kv, mask=m_kv, other=0.0).to(ACC)
        else:
            a_t, b_t = ahead1
            nxt = _fwd_loads(a_ptr, b_ptr, base, t + PREFETCH, end, n, kk, kv, o_kk, o_kv, m_kk, m_kv)
            if PREFETCH == 1:
                ahead1 = nxt
            else:
                ahead1 = ahead2
                ahead2 = nxt
            a_t = a_t.to(ACC)
            b_t = b_t.to(ACC)
        state = _mm(a_t, state, DOT_KV) + b_t
        if TRACK_P:
            prod = _mm(a_t, prod, DOT_KK)
        if WRITE_H:
            tl.store(h_ptr + step * kv + o_kv, state.to(h_ptr.dtype.element_ty), mask=m_kv)
        if WRITE_ABAR:
            tl.store(abar_ptr + step * kk + o_kk, prod.to(abar_ptr.dtype.element_ty), mask=m_kk)

    if SUMMARY:
        tl.store(ca_ptr + s_kk, prod)
        tl.store(cb_ptr + s_kv, state)


@triton.jit
def _carry_loads(
    sp_ptr, sa_ptr, sb_ptr, row, NC, i,
    KP: tl.constexpr, VP: tl.constexpr, TRACK_A: tl.constexpr, ADD_A: tl.constexpr, TRACK_B: tl.constexpr,
    REVERSE: tl.constexpr,
):  # fmt: skip
    """The summary tiles (P, EA, EB) of phase 2's i-th chunk, zero from i = NC - 1 on (P in place of one not
    read)."""
    slot = row * NC + (NC - 1 - i if REVERSE else i)
    t_kk = tl.arange(0, KP)[:, None] * KP + tl.arange(0, KP)[None, :]
    t_kv = tl.arange(0, KP)[:, None] * VP + tl.arange(0, VP)[None, :]
    p = tl.load(sp_ptr + slot * KP * KP + t_kk, mask=t_kk * 0 + i < NC - 1, other=0.0)
    add_a = p
    add_b = p
    if TRACK_A and ADD_A:
        add_a = tl.load(sa_ptr + slot * KP * KP + t_kk, mask=t_kk * 0 + i < NC - 1, other=0.0)
    if TRACK_B:
        add_b = tl.load(sb_ptr + slot * KP * VP + t_kv, mask=t_kv * 0 + i < NC - 1, other=0.0)
    return p, add_a, add_b


@triton.jit
def _carry_kernel(
    h0_ptr,
    sp_ptr,
    sa_ptr,
    sb_ptr,
    ca_ptr,
    cb_ptr,
    n,
    k,
    v,
    NC,
    KP: tl.constexpr,
    VP: tl.constexpr,
    FP64: tl.constexpr,
    DOT_KK: tl.constexpr,
    DOT_KV: tl.constexpr,
    TRACK_A: tl.constexpr,
    TRACK_B: tl.constexpr,
    ADD_A: tl.constexpr,
    EYE_A: tl.constexpr,
    HAS_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Phase 2, one program per row: scan the chunk summaries (P_c, EA_c, EB_c) in chunk order (reversed
    when REVERSE), storing each chunk's carry-in (ca, cb) before applying its map: ka <- P_c ka (+ EA_c when
    ADD_A), kb <- P_c kb + EB_c. ka starts at I when EYE_A else 0; kb at H0 when HAS_H0 else 0."""
    ACC = tl.float64 if FP64 else tl.float32
    row = tl.program_id(0).to(tl.int64)
    rk = tl.arange(0, KP)
    ck = tl.arange(0, KP)
    cv = tl.arange(0, VP)
    t_kk = rk[:, None] * KP + ck[None, :]
    t_kv = rk[:, None] * VP + cv[None, :]
    m_kv = (rk[:, None] < k) & (cv[None, :] < v)
    ka = tl.zeros((KP, KP), dtype=ACC)
    if EYE_A:
        ka = (rk[:, None] == ck[None, :]).to(ACC)
    kb = tl.zeros((KP, VP), dtype=ACC)
    if HAS_H0:
        kb = tl.load(h0_ptr + row * k * v + rk[:, None] * v + cv[None, :], mask=m_kv, other=0.0).to(ACC)
    if PREFETCH >= 1:
        ahead1 = _carry_loads(sp_ptr, sa_ptr, sb_ptr, row, NC, 0, KP, VP, TRACK_A, ADD_A, TRACK_B, REVERSE)
    if PREFETCH >= 2:
        ahead2 = _carry_loads(sp_ptr, sa_ptr, sb_ptr, row, NC, 1, KP, VP, TRACK_A, ADD_A, TRACK_B, REVERSE)
    for i in tl.range(0, NC - 1, num_stages=STAGES):
        c = NC - 1 - i if REVERSE else i
        slot = row * NC + c
        if PREFETCH == 0:
            p = tl.load(sp_ptr + slot * KP * KP + t_kk)
        else:
            p, add_a, add_b = ahead1
            nxt = _carry_loads(sp_ptr, sa_ptr, sb_ptr, row, NC, i + PREFETCH, KP, VP, TRACK_A, ADD_A, TRACK_B,
                               REVERSE)  # fmt: skip
            if PREFETCH == 1:
                ahead1 = nxt
            else:
                ahead1 = ahead2
                ahead2 = nxt
        if TRACK_A:
            tl.store(ca_ptr + slot * KP * KP + t_kk, ka)
            ka = _mm(p, ka, DOT_KK)
            if ADD_A:
                if PREFETCH == 0:
                    ka += tl.load(sa_ptr + slot * KP * KP + t_kk)
                else:
                    ka += add_a
        if TRACK_B:
            tl.store(cb_ptr + slot * KP * VP + t_kv, kb)
            if PREFETCH == 0:
                kb = _mm(p, kb, DOT_KV) + tl.load(sb_ptr + slot * KP * VP + t_kv)
            else:
                kb = _mm(p, kb, DOT_KV) + add_b
    last = row * NC if REVERSE else row * NC + NC - 1
    if TRACK_A:
        tl.store(ca_ptr + last * KP * KP + t_kk, ka)
    if TRACK_B:
        tl.store(cb_ptr + last * KP * VP + t_kv, kb)


@triton.jit
def _bmm(a, b, DOT: tl.constexpr):
    """a (G, M, K) @ b (G, K, N), one product per group: IEEE ``tl.dot`` of the G = 1 tiles when ``DOT``,
    else multiply + sum (written like :func:`_mm`'s, with the group axis in front)."""
    if DOT:
        c = tl.dot(tl.reshape(a, (a.shape[1], a.shape[2])), tl.reshape(b, (b.shape[1], b.shape[2])),
                   input_precision="ieee")  # fmt: skip
        c = tl.reshape(c, (1, a.shape[1], b.shape[2]))
    else:
        c = tl.sum(b[:, None, :, :] * a[:, :, :, None], axis=2)
    return c


@triton.jit
def _bwd_loads(
    a_ptr, abar_ptr, x_ptr, h0_ptr, ga_ptr, gb_ptr, row, used, base, t, start, n, k, v,
    KP: tl.constexpr, VP: tl.constexpr,
    HAS_GA: tl.constexpr, HAS_GB: tl.constexpr, HAS_H0: tl.constexpr, SUMMARY: tl.constexpr,
):  # fmt: skip
    """The adjoint's loads at step t for the group's rows (``row`` (G, 1, 1), ``base`` their offsets at
    t = 0) in their input dtype, zero before ``start``: (G^A_t, G^B_t, A_t^T, Abar_{t-1}^T, X_{t-1}^T (H0^T
    at t = 0 when HAS_H0)); A_t^T in place of one not read."""
    rk = tl.arange(0, KP)[None, :, None]
    ck = tl.arange(0, KP)[None, None, :]
    cv = tl.arange(0, VP)[None, None, :]
    rv = tl.arange(0, VP)[None, :, None]
    m_kk = used & (rk < k) & (ck < k) & (ck * 0 + t >= start)
    m_kv = used & (rk < k) & (cv < v) & (cv * 0 + t >= start)
    m_vk = used & (rv < v) & (ck < k) & (ck * 0 + t >= start)
    o_kk_t = rk + ck * k
    o_vk_t = rv + ck * v
    zero = ck * 0
    step = base + t * n
    prev = step - n
    a_t = tl.load(a_ptr + step * k * k + o_kk_t, mask=m_kk, other=0.0)
    g_a = a_t
    g_b = a_t
    abar_t = a_t
    x_t = a_t
    if HAS_GA:
        g_a = tl.load(ga_ptr + step * k * k + rk * k + ck, mask=m_kk, other=0.0)
    if HAS_GB:
        g_b = tl.load(gb_ptr + step * k * v + rk * v + cv, mask=m_kv, other=0.0)
    if not SUMMARY:
        if HAS_GA:
            abar_t = tl.load(abar_ptr + prev * k * k + o_kk_t, mask=m_kk & (zero + t > 0), other=0.0)
        if HAS_GB:
            x_offs = x_ptr + prev * k * v + o_vk_t
            if HAS_H0:
                # one load of X_{t-1} or H0 (same dtype): a sum of two would wait on both
                x_offs = tl.where(zero + t == 0, h0_ptr + row * k * v + o_vk_t, x_offs)
                x_t = tl.load(x_offs, mask=m_vk, other=0.0)
            else:
                x_t = tl.load(x_offs, mask=m_vk & (zero + t > 0), other=0.0)
    return g_a, g_b, a_t, abar_t, x_t


@triton.jit
def _bwd_kernel(
    a_ptr,
    abar_ptr,
    x_ptr,
    h0_ptr,
    ga_ptr,
    gb_ptr,
    da_ptr,
    db_ptr,
    dh0_ptr,
    sp_ptr,
    sa_ptr,
    sb_ptr,
    T,
    n,
    k,
    v,
    chunk,
    NC,
    NL,
    C0,
    R,
    KP: tl.constexpr,
    VP: tl.constexpr,
    GROUP: tl.constexpr,
    FP64: tl.constexpr,
    DOT_KK: tl.constexpr,
    DOT_KV: tl.constexpr,
    HAS_GA: tl.constexpr,
    HAS_GB: tl.constexpr,
    HAS_H0: tl.constexpr,
    WRITE_DH0: tl.constexpr,
    SUMMARY: tl.constexpr,
    CARRY: tl.constexpr,
    STAGES: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """Adjoint, one program per (GROUP of the R rows, chunk), steps [c * chunk, min(T, (c + 1) * chunk)) in
    reverse.

    L^A (when HAS_GA) and L^B (when HAS_GB) start at 0, or at the carries (sa, sb) of this chunk when CARRY;
    L_t = A_{t+1}^T L_{t+1} + G_t. Without SUMMARY writes dB_t = L^B_t and
    dA_t = L^A_t Abar_{t-1}^T + L^B_t X_{t-1}^T (Abar_0 = I; X_0 = H0 when HAS_H0 else 0) and, for chunk 0
    when WRITE_DH0, dH0 = A_1^T L^B_1. With SUMMARY stores P = A_{s+1}^T ... A_e^T and the end states.
    """
    ACC = tl.float64 if FP64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    c = pid % NL + C0
    row = ((pid // NL) * GROUP + tl.arange(0, GROUP))[:, None, None]
    used = row < R
    slot = row * NC + c
    base = (row // n) * T * n + row % n
    start = c * chunk
    end = tl.minimum(start + chunk, T)
    rk = tl.arange(0, KP)[None, :, None]
    ck = tl.arange(0, KP)[None, None, :]
    cv = tl.arange(0, VP)[None, None, :]
    rv = tl.arange(0, VP)[None, :, None]
    m_kk = used & (rk < k) & (ck < k)
    m_kv = used & (rk < k) & (cv < v)
    m_vk = used & (rv < v) & (ck < k)
    o_kk = rk * k + ck
    o_kk_t = rk + ck * k
    o_kv = rk * v + cv
    o_vk_t = rv + ck * v
    s_kk = slot * KP * KP + rk * KP + ck
    s_kv = slot * KP * VP + rk * VP + cv
    kk = k * k
    kv = k * v
    eye = (rk == ck).to(ACC)
    zero = ck * 0  # scalar conditions are broadcast to tiles (the interpreter needs tensor masks)

    after = base + end * n
    a_next = tl.load(a_ptr + after * kk + o_kk_t, mask=m_kk & (zero + end < T), other=0.0).to(ACC)
    la = tl.zeros((GROUP, KP, KP), dtype=ACC)
    lb = tl.zeros((GROUP, KP, VP), dtype=ACC)
    prod = la + eye
    if CARRY:
        if HAS_GA:
            la = tl.load(sa_ptr + s_kk, mask=used, other=0.0)
        if HAS_GB:
            lb = tl.load(sb_ptr + s_kv, mask=used, other=0.0)

    if PREFETCH >= 1:
        ahead1 = _bwd_loads(a_ptr, abar_ptr, x_ptr, h0_ptr, ga_ptr, gb_ptr, row, used, base, end - 1, start,
                            n, k, v, KP, VP, HAS_GA, HAS_GB, HAS_H0, SUMMARY)  # fmt: skip
    if PREFETCH >= 2:
        ahead2 = _bwd_loads(a_ptr, abar_ptr, x_ptr, h0_ptr, ga_ptr, gb_ptr, row, used, base, end - 2, start,
                            n, k, v, KP, VP, HAS_GA, HAS_GB, HAS_H0, SUMMARY)  # fmt: skip
    for i in tl.range(0, end - start, num_stages=STAGES):
        t = end - 1 - i
        step = base + t * n
        if PREFETCH == 0:
            if HAS_GA:
                la = _bmm(a_next, la, DOT_KK)
                la += tl.load(ga_ptr + step * kk + o_kk, mask=m_kk, other=0.0).to(ACC)
            if HAS_GB:
                lb = _bmm(a_next, lb, DOT_KV)
                lb += tl.load(gb_ptr + step * kv + o_kv, mask=m_kv, other=0.0).to(ACC)
        else:
            g_a, g_b, a_t, abar_t, x_t = ahead1
            nxt = _bwd_loads(a_ptr, abar_ptr, x_ptr, h0_ptr, ga_ptr, gb_ptr, row, used, base, t - PREFETCH,
                             start, n, k, v, KP, VP, HAS_GA, HAS_GB, HAS_H0, SUMMARY)  # fmt: skip
            if PREFETCH == 1:
                ahead1 = nxt
            else:
                ahead1 = ahead2
                ahead2 = nxt
            if HAS_GA:
                la = _bmm(a_next, la, DOT_KK) + g_a.to(ACC)
            if HAS_GB:
                lb = _bmm(a_next, lb, DOT_KV) + g_b.to(ACC)
        if SUMMARY:
            prod = _bmm(a_next, prod, DOT_KK)
        if PREFETCH == 0:
            a_next = tl.load(a_ptr + step * kk + o_kk_t, mask=m_kk, other=0.0).to(ACC)
        else:
            a_next = a_t.to(ACC)
        if not SUMMARY:
            prev = step - n
            d_a = tl.zeros((GROUP, KP, KP), dtype=ACC)
            if HAS_GA:
                if PREFETCH == 0:
                    abar_t = tl.load(abar_ptr + prev * kk + o_kk_t, mask=m_kk & (zero + t > 0), other=0.0)
                d_a += _bmm(la, tl.where(zero + t > 0, abar_t.to(ACC), eye), DOT_KK)
            if HAS_GB:
                if PREFETCH == 0:
                    x_t = tl.load(x_ptr + prev * kv + o_vk_t, mask=m_vk & (zero + t > 0), other=0.0).to(ACC)
                    if HAS_H0:
                        x_h0 = tl.load(h0_ptr + row * kv + o_vk_t, mask=m_vk & (zero + t == 0), other=0.0)
                        x_t += x_h0.to(ACC)
                d_a += _bmm(lb, x_t.to(ACC), DOT_KV)
                tl.store(db_ptr + step * kv + o_kv, lb.to(db_ptr.dtype.element_ty), mask=m_kv)
            tl.store(da_ptr + step * kk + o_kk, d_a.to(da_ptr.dtype.element_ty), mask=m_kk)

    if SUMMARY:
        tl.store(sp_ptr + s_kk, prod, mask=used)
        if HAS_GA:
            tl.store(sa_ptr + s_kk, la, mask=used)
        if HAS_GB:
            tl.store(sb_ptr + s_kv, lb, mask=used)
    if WRITE_DH0:
        dh0 = _bmm(a_next, lb, DOT_KV)
        tl.store(dh0_ptr + row * kv + o_kv, dh0.to(dh0_ptr.dtype.element_ty), mask=m_kv & (cv * 0 + c == 0))


# ------------------------------------------------------------------------------------------ heuristics


def affine_envelope(A: Tensor, Bm: Tensor) -> str | None:
    """None when the affine kernels take A (B, T, n, k, k) and Bm (B, T, n, k, v), else the reason why not.

    Reads shapes only. Limits: 1 <= k <= 32 and 1 <= v <= 64 (any sizes, powers of two or not) and
    B * n < 2^31. Devices, dtypes and the agreement of the shapes are checked elsewhere.
    """
    if A.dim() != 5 or Bm.dim() != 5:
        return (
            f"the affine kernel takes A (B, T, n, k, k) and Bm (B, T, n, k, v), got shapes {tuple(A.shape)} "
            f"and {tuple(Bm.shape)}"
        )
    k, v = A.shape[-1], Bm.shape[-1]
    if not 1 <= k <= MAX_K:
        return f"k must be in [1, {MAX_K}] for the affine kernel, got k={k}"
    if not 1 <= v <= MAX_V:
        return f"v must be in [1, {MAX_V}] for the affine kernel, got v={v}"
    if A.shape[0] * A.shape[2] >= 2**31:
        return f"B * n must be < 2^31 for the affine kernel, got B * n = {A.shape[0] * A.shape[2]}"
    return None


@contextlib.contextmanager
def force_strategy(name: str, chunk: int | None = None) -> Iterator[None]:
    """Within the block every affine launch uses strategy ``name`` ("sequential" or "chunked"); ``chunk``
    sets the chunk length of the chunked strategy (default: a quarter of T). For tests and benchmarks."""
    global _forced
    if name not in STRATEGIES:
        raise ValueError(f"name must be one of {STRATEGIES}, got {name!r}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk}")
    previous, _forced = _forced, (name, chunk)
    try:
        with _recipes.overriding():
            yield
    finally:
        _forced = previous


def _strategy(rows: int, steps: int, sms: int = 132, kp: int = 2) -> tuple[str, int]:
    """(strategy, chunk length) for ``rows`` = B * n independent scans of ``steps`` steps of KP-padded tiles.

    Each step of a program waits on the previous one, so a program's time is its step count times a step's
    latency; the GPU fills only with many programs per SM. Chunks are max(base, isqrt(T)) steps long, with
    base = 64 for KP <= 4 and 128 above. On an H200 at B * n = 64, T = 4096, that choice (with
    :data:`DOT_STAGES`) was within 28% of the fastest of chunks 32, 64, 128 x pipelining x unrolling for
    every k in {2, 4, 8, 16, 32}, and within 2% for k >= 16; the earlier rule (about four programs per SM)
    ran 1.1x-4.7x slower. The isqrt(T) floor keeps phase 2 (one step per chunk) no longer than a chunk.
    Sequential (chunk = T) when the rows alone give >= 16 programs per SM or T < 2 chunks.
    """
    if _forced is not None:
        name, chunk = _forced
        if name == "sequential" or steps < 2:
            return "sequential", max(steps, 1)
        chunk = chunk if chunk is not None else cdiv(steps, 4)
        return "chunked", min(chunk, cdiv(steps, 2))
    chunk = sqrt_chunk(steps, MIN_CHUNK if kp <= 4 else 2 * MIN_CHUNK)
    if rows >= 16 * sms or steps < 2 * chunk:
        return "sequential", max(steps, 1)
    return "chunked", chunk


def _pow2(x: int) -> int:
    return max(2, next_pow2(x))


def _config(k: int, v: int, dtype: torch.dtype) -> dict[str, int]:
    """Tile sizes (k, v padded to powers of two >= 2), the tl.dot switches, num_warps and STAGES.

    tl.dot (IEEE, on the float32 accumulators) for float32, bfloat16 and float16 inputs when k and v are both
    >= 16, so that every product of a kernel takes the same path; float64 and smaller sizes multiply and sum
    (see :func:`_mm` for why that sum is written so that Triton cannot turn it into a TF32 tensor-core dot).
    The broadcast product of k = 32 spills registers: on an H200, bfloat16 k = v = 32 on that path ran 43x
    slower than float32 on tl.dot. num_warps: one per 1024 elements of the
    largest broadcast product (KP * KP * max(KP, VP)), 1 to 16; with tl.dot at least 4, and 8 for k > 16
    (fewer spill registers on sm_90).
    """
    kp, vp = _pow2(k), _pow2(v)
    fp64 = int(dtype == torch.float64)
    dot_kk = int(dtype != torch.float64 and kp >= 16 and vp >= 16)
    dot_kv = dot_kk
    broadcast = max(0 if dot_kk else kp**3, 0 if dot_kv else kp * kp * vp)
    warps = min(16, next_pow2(max(1, broadcast // 1024)))
    if dot_kk:
        warps = max(warps, 8 if kp >= 32 else 4)
    stages = DOT_STAGES if dot_kk else 1
    return {
        "KP": kp, "VP": vp, "FP64": fp64, "DOT_KK": dot_kk, "DOT_KV": dot_kv, "STAGES": stages,
        "num_warps": warps,
    }  # fmt: skip


def _prefetch(cfg: dict[str, int], adjoint: bool) -> int:
    """PREFETCH of the forward's or the adjoint's kernels (steps and carries): :data:`BROADCAST_PREFETCH` on
    the broadcast path from 8 x 8 tiles (forward) or 4 x 4 tiles (adjoint) up, else 0."""
    if cfg["DOT_KK"] or cfg["KP"] < (4 if adjoint else 8):
        return 0
    return BROADCAST_PREFETCH


# ---------------------------------------------------------------------------------------------- drivers


def _forward(A: Tensor, Bm: Tensor, H0: Tensor | None, Abar: Tensor | None, H: Tensor) -> None:
    """Write H (and Abar when given) for contiguous A, Bm (and H0)."""
    batch, steps, heads, k, _ = A.shape
    v = Bm.shape[-1]
    rows = batch * heads
    if rows * steps == 0:
        return
    cfg = _config(k, v, A.dtype)
    prefetch = _prefetch(cfg, adjoint=False)
    name, chunk = _strategy(rows, steps, num_sms(A.device), cfg["KP"])
    abar, has_h0 = int(Abar is not None), int(H0 is not None)
    h0 = H if H0 is None else H0
    out_a = H if Abar is None else Abar
    dims = (steps, heads, k, v)
    write = {"TRACK_P": abar, "WRITE_ABAR": abar, "WRITE_H": 1, "SUMMARY": 0}
    if name == "sequential":
        args: tuple[Any, ...] = (A, Bm, h0, out_a, H, H, H, *dims, steps, 1, 1, 0)
        launch(_fwd_kernel, (rows,), *args, CARRY=0, HAS_H0=has_h0, PREFETCH=prefetch, **write, **cfg)
        return
    nc = cdiv(steps, chunk)
    sp, sb = _buffers(rows * nc, cfg, A, (True, True))
    ca, cb = _buffers(rows * nc, cfg, A, (bool(abar), True))
    # phase 1: chunks 0 .. nc - 2 summarise themselves (the last one's summary is never used)
    args = (A, Bm, H, H, H, sp, sb, *dims, chunk, nc, nc - 1, 0)
    summary = {"TRACK_P": 1, "WRITE_ABAR": 0, "WRITE_H": 0, "SUMMARY": 1}
    launch(_fwd_kernel, (rows * (nc - 1),), *args, CARRY=0, HAS_H0=0, PREFETCH=prefetch, **summary, **cfg)
    # phase 2: carries in chunk order from (I, H0)
    args = (h0, sp, sp, sb, ca, cb, heads, k, v, nc)
    scan = {"TRACK_A": abar, "TRACK_B": 1, "ADD_A": 0, "EYE_A": 1, "HAS_H0": has_h0, "REVERSE": 0}
    launch(_carry_kernel, (rows,), *args, PREFETCH=prefetch, **scan, **cfg)
    # phase 3: every chunk replays from its carry
    args = (A, Bm, H, out_a, H, ca, cb, *dims, chunk, nc, nc, 0)
    launch(_fwd_kernel, (rows * nc,), *args, CARRY=1, HAS_H0=0, PREFETCH=prefetch, **write, **cfg)


def _backward(
    A: Tensor,
    Abar: Tensor | None,
    X: Tensor,
    H0: Tensor | None,
    gA: Tensor | None,
    gB: Tensor | None,
    dA: Tensor,
    dB: Tensor,
    dH0: Tensor | None,
) -> None:
    """Write dA, dB (when gB is given) and dH0 (when given) for contiguous inputs; X is Bbar or H."""
    batch, steps, heads, k, _ = A.shape
    v = X.shape[-1]
    rows = batch * heads
    if rows * steps == 0 or (gA is None and gB is None):
        return
    cfg = _config(k, v, A.dtype)
    name, chunk = _strategy(rows, steps, num_sms(A.device), cfg["KP"])
    has = {"HAS_GA": int(gA is not None), "HAS_GB": int(gB is not None)}
    ptrs = tuple(dA if x is None else x for x in (Abar, X, H0, gA, gB))
    outs = (dA, dB, dA if dH0 is None else dH0)
    dims = (steps, heads, k, v)
    step_meta = {"GROUP": _adjoint_group(cfg), "PREFETCH": _prefetch(cfg, adjoint=True), **cfg}
    blocks = cdiv(rows, step_meta["GROUP"])
    ends = {"HAS_H0": int(H0 is not None), "WRITE_DH0": int(dH0 is not None), "SUMMARY": 0}
    if name == "sequential":
        args: tuple[Any, ...] = (A, *ptrs, *outs, dA, dA, dA, *dims, steps, 1, 1, 0, rows)
        launch(_bwd_kernel, (blocks,), *args, CARRY=0, **ends, **has, **step_meta)
        return
    nc = cdiv(steps, chunk)
    tracked = (True, gA is not None, gB is not None)
    sp, sa, sb = _buffers(rows * nc, cfg, A, tracked)
    _, ca, cb = _buffers(rows * nc, cfg, A, (False, *tracked[1:]))
    # phase 1: chunks 1 .. nc - 1 summarise themselves (chunk 0's summary is never used)
    args = (A, *ptrs, *outs, sp, sa, sb, *dims, chunk, nc, nc - 1, 1, rows)
    summary = {"HAS_H0": 0, "WRITE_DH0": 0, "SUMMARY": 1}
    launch(_bwd_kernel, (blocks * (nc - 1),), *args, CARRY=0, **summary, **has, **step_meta)
    # phase 2: carries in reverse chunk order from L = 0
    args = (dA, sp, sa, sb, ca, cb, heads, k, v, nc)
    scan = {"TRACK_A": has["HAS_GA"], "TRACK_B": has["HAS_GB"], "ADD_A": 1, "EYE_A": 0, "HAS_H0": 0}
    launch(_carry_kernel, (rows,), *args, REVERSE=1, PREFETCH=step_meta["PREFETCH"], **scan, **cfg)
    # phase 3: every chunk replays from its carry
    args = (A, *ptrs, *outs, sp, ca, cb, *dims, chunk, nc, nc, 0, rows)
    launch(_bwd_kernel, (blocks * nc,), *args, CARRY=1, **ends, **has, **step_meta)


def _adjoint_group(cfg: dict[str, int]) -> int:
    """Rows per program of the adjoint's step kernel: max(1, :data:`ADJOINT_GROUP_ENTRIES` // KP^2) on the
    broadcast path, 1 with tl.dot."""
    return 1 if cfg["DOT_KK"] else max(1, ADJOINT_GROUP_ENTRIES // (cfg["KP"] * cfg["KP"]))


def _buffers(slots: int, cfg: dict[str, int], like: Tensor, wanted: tuple[bool, ...]) -> tuple[Tensor, ...]:
    """Per-(row, chunk) summary or carry tiles in the accumulation dtype: a (slots, KP, KP) tile for a
    wanted k x k entry and a (slots, KP, VP) tile for the last; an unwanted entry is a placeholder."""
    dtype = torch.float64 if cfg["FP64"] else torch.float32
    sides = [cfg["KP"]] * (len(wanted) - 1) + [cfg["VP"]]
    # a placeholder only where one is used (an allocation costs host time, recorded or not)
    placeholder = like if all(wanted) else like.new_empty((1,), dtype=dtype)
    return tuple(
        like.new_empty((slots, cfg["KP"], side), dtype=dtype) if want else placeholder
        for want, side in zip(wanted, sides, strict=True)
    )


# ------------------------------------------------------------------------------------------------ checks


def _check_kernel_inputs(A: Tensor, Bm: Tensor) -> None:
    """Raise ValueError when A is not on a kernel device or (A, Bm) is outside :func:`affine_envelope`."""
    if not on_kernel_device(A):
        raise ValueError(
            f"A must be a CUDA tensor (or a CPU tensor under TRITON_INTERPRET=1), got device {A.device}"
        )
    reason = affine_envelope(A, Bm)
    if reason is not None:
        raise ValueError(reason)


def _check_operands(A: object, X: object, name: str) -> None:
    """Check A (B, T, n, k, k) and ``name`` = X (B, T, n, k, v): floating, matching, one device and dtype."""
    A = check_float_tensor("A", A, 5, "(B, T, n, k, k)")
    X = check_float_tensor(name, X, 5, "(B, T, n, k, v)")
    if A.shape[-1] != A.shape[-2]:
        raise ValueError(f"A must hold square k x k matrices (B, T, n, k, k), got shape {tuple(A.shape)}")
    check_shape(name, X, (*A.shape[:4], X.shape[-1]), "(B, T, n, k, v) matching A")
    check_same_device_dtype({"A": A, name: X})


def _check_like(named: dict[str, Tensor | None], like: Tensor, layout: str) -> None:
    """Check every non-None tensor of ``named`` against ``like``'s shape, device and dtype."""
    for name, value in named.items():
        if value is not None:
            check_float_tensor(name, value, like.dim(), layout)
            check_shape(name, value, tuple(like.shape), layout)
            check_same_device_dtype({"A": like, name: value})


def _check_state(name: str, value: object, A: Tensor, v: int) -> Tensor:
    """Check that ``value`` is a (B, n, k, v) state matching A (same device and dtype)."""
    batch, _, heads, k, _ = A.shape
    value = check_float_tensor(name, value, 4, "(B, n, k, v)")
    check_shape(name, value, (batch, heads, k, v), "(B, n, k, v)")
    check_same_device_dtype({"A": A, name: value})
    return value


def _common_case(
    A: Any, X: Any, like_a: tuple[Any, ...] = (), like_x: tuple[Any, ...] = (), state: Any = None
) -> Any:
    """The recipe key of common, valid inputs, else False: plain tensors A (B, T, n, k, k) and X (B, T, n, k,
    v) of one floating dtype on one CUDA device (a device type recipes serve), within
    :func:`affine_envelope`, none empty; each of ``like_a`` like A, each of ``like_x`` like X, and ``state``
    (unless None) a (B, n, k, v) tensor of their dtype and device. The key is (A's shape, v, the dtype).
    Where it holds, an op's body runs only to be recorded: its detailed checks name what is wrong."""
    if type(A) not in _PLAIN or type(X) not in _PLAIN or A.dim() != 5 or X.dim() != 5:
        return False
    dtype = A.dtype
    if dtype not in FLOAT_DTYPES or X.dtype != dtype:
        return False
    device = _recipes.device_key(A)
    if device is None:
        return False
    batch, steps, heads, k, k2 = shape = A.shape
    v = X.shape[-1]
    if k != k2 or X.shape[:4] != shape[:4] or not (1 <= k <= MAX_K and 1 <= v <= MAX_V):
        return False
    if batch * steps * heads == 0 or batch * heads >= 2**31:
        return False
    others = [(x, shape) for x in like_a] + [(x, X.shape) for x in (X, *like_x)]
    if state is not None:
        others.append((state, (batch, heads, k, v)))
    for x, want in others:
        if type(x) not in _PLAIN or x.dtype != dtype or x.shape != want or not _recipes.on_device(x, device):
            return False
    return shape, v, dtype


# --------------------------------------------------------------------------------------------------- ops


@triton_op("mingru::affine_scan_fwd", mutates_args=())
def affine_scan_fwd(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    """Matrix affine prefix scan: A (B, T, n, k, k), Bm (B, T, n, k, v) -> (Abar like A, Bbar like Bm).

    Abar_t = A_t ... A_1 and Bbar_t = A_t Bbar_{t-1} + B_t (Bbar_0 = 0). Raises TypeError/ValueError on bad
    inputs and ValueError outside :func:`affine_envelope`.
    """
    return _scan_fwd(A, Bm)


@_recipes.replayed("affine_scan_fwd", lambda A, Bm: _common_case(A, Bm))
def _scan_fwd(A: Tensor, Bm: Tensor) -> tuple[Tensor, Tensor]:
    _check_operands(A, Bm, "Bm")
    _check_kernel_inputs(A, Bm)
    A, Bm = A.contiguous(), Bm.contiguous()
    Abar, Bbar = torch.empty_like(A), torch.empty_like(Bm)
    _forward(A, Bm, None, Abar, Bbar)
    return Abar, Bbar


@triton_op("mingru::affine_scan_bwd", mutates_args=())
def affine_scan_bwd(
    A: Tensor, Abar: Tensor, Bbar: Tensor, gAbar: Tensor | None, gBbar: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Adjoint of :func:`affine_scan_fwd` -> (dA like A, dB like Bbar); a None grad counts as zeros.

    L_t = G_t + A_{t+1}^T L_{t+1} on both grads; dB_t = L^B_t, dA_t = L^A_t Abar_{t-1}^T + L^B_t Bbar_{t-1}^T
    (Abar_0 = I, Bbar_0 = 0). Raises TypeError/ValueError on bad inputs.
    """
    return _scan_bwd(A, Abar, Bbar, gAbar, gBbar)


@_recipes.replayed("affine_scan_bwd", lambda A, Abar, Bbar, gA, gB: _common_case(A, Bbar, (Abar, gA), (gB,)))
def _scan_bwd(
    A: Tensor, Abar: Tensor, Bbar: Tensor, gAbar: Tensor | None, gBbar: Tensor | None
) -> tuple[Tensor, Tensor]:
    _check_operands(A, Bbar, "Bbar")
    _check_like({"Abar": Abar, "gAbar": gAbar}, A, "(B, T, n, k, k) like A")
    _check_like({"gBbar": gBbar}, Bbar, "(B, T, n, k, v) like Bbar")
    _check_kernel_inputs(A, Bbar)
    A, Abar, Bbar = A.contiguous(), Abar.contiguous(), Bbar.contiguous()
    gAbar = None if gAbar is None else gAbar.contiguous()
    gBbar = None if gBbar is None else gBbar.contiguous()
    dA = torch.empty_like(A) if gAbar is not None or gBbar is not None else torch.zeros_like(A)
    dB = torch.empty_like(Bbar) if gBbar is not None else torch.zeros_like(Bbar)
    _backward(A, Abar, Bbar, None, gAbar, gBbar, dA, dB, None)
    return dA, dB


@_recipes.replayed("affine_recurrence_fwd", lambda A, Bm, H0: _common_case(A, Bm, state=H0))
def _recurrence_fwd(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    _check_operands(A, Bm, "Bm")
    _check_state("H0", H0, A, Bm.shape[-1])
    _check_kernel_inputs(A, Bm)
    A, Bm, H0 = A.contiguous(), Bm.contiguous(), H0.contiguous()
    H = torch.empty_like(Bm)
    _forward(A, Bm, H0, None, H)
    return H


@triton_op("mingru::affine_recurrence_fwd", mutates_args=())
def affine_recurrence_fwd(A: Tensor, Bm: Tensor, H0: Tensor) -> Tensor:
    """H_t = A_t H_{t-1} + B_t from H0: A (B, T, n, k, k), Bm (B, T, n, k, v), H0 (B, n, k, v) -> H like Bm.

    Writes only H (no Abar). Raises TypeError/ValueError on bad inputs, ValueError outside the envelope.
    """
    return _recurrence_fwd(A, Bm, H0)


@_recipes.replayed("affine_recurrence_bwd", lambda A, H0, H, grad_H: _common_case(A, H, (), (grad_H,), H0))
def _recurrence_bwd(A: Tensor, H0: Tensor, H: Tensor, grad_H: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    _check_operands(A, H, "H")
    _check_state("H0", H0, A, H.shape[-1])
    _check_like({"grad_H": grad_H}, H, "(B, T, n, k, v) like H")
    _check_kernel_inputs(A, H)
    A, H0, H, grad_H = A.contiguous(), H0.contiguous(), H.contiguous(), grad_H.contiguous()
    dA, dB, dH0 = torch.empty_like(A), torch.empty_like(H), torch.zeros_like(H0)
    _backward(A, None, H, H0, None, grad_H, dA, dB, dH0)
    return dA, dB, dH0


@triton_op("mingru::affine_recurrence_bwd", mutates_args=())
def affine_recurrence_bwd(A: Tensor, H0: Tensor, H: Tensor, grad_H: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Adjoint of :func:`affine_recurrence_fwd` -> (dA like A, dB like H, dH0 like H0).

    L_t = grad_H_t + A_{t+1}^T L_{t+1}; dB_t = L_t, dA_t = L_t H_{t-1}^T (H_0 = H0), dH0 = A_1^T L_1.
    Raises TypeError/ValueError on bad inputs.
    """
    return _recurrence_bwd(A, H0, H, grad_H)


def _scan_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: tuple[Tensor, Tensor]) -> None:
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], *output)


def _scan_backward(ctx: Any, gAbar: Tensor | None, gBbar: Tensor | None) -> tuple[Tensor, Tensor]:
    A, Abar, Bbar = ctx.saved_tensors
    return affine_scan_bwd(A, Abar, Bbar, gAbar, gBbar)


def _recurrence_setup(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], inputs[2], output)


def _recurrence_backward(ctx: Any, grad_H: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    A, H0, H = ctx.saved_tensors
    if grad_H is None:
        grad_H = torch.zeros_like(H)
    return affine_recurrence_bwd(A, H0, H, grad_H)


affine_scan_fwd.register_autograd(_scan_backward, setup_context=_scan_setup)
affine_recurrence_fwd.register_autograd(_recurrence_backward, setup_context=_recurrence_setup)


scan = eager_path("AffineScan", affine_scan_fwd, _scan_fwd, _scan_bwd, lambda x, out: (x[0], *out))
"""``scan(A, Bm)``: :func:`affine_scan_fwd` for the dispatch (``SCAN_IMPLS``), eagerly without the op's
dispatch (:func:`~mingru_triton._launch.eager_path`); an unused output's gradient reaches the adjoint as
None."""

recurrence = eager_path(
    "AffineRecurrence", affine_recurrence_fwd, _recurrence_fwd, _recurrence_bwd, lambda x, h: (x[0], x[2], h)
)
"""``recurrence(A, Bm, H0)``: :func:`affine_recurrence_fwd` for the layers, eagerly without the op's dispatch
(:func:`~mingru_triton._launch.eager_path`)."""
