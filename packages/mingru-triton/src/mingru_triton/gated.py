"""Triton kernels of the MinGRU and MinLSTM recurrences with the gates fused into the scan.

The layers' input projection gives the pre-activations ``pre`` (B, T, G H): MinGRU's gate logit k and
candidate v (G = 2), or MinLSTM's forget logit f, input logit i and candidate v (G = 3), in that order along
the last dimension. The gate is z = sigmoid(k) (MinLSTM: k = softplus(-f) - softplus(-i)), and

    h_t = a_t h_{t-1} + b_t,  a_t = 1 - z_t (1 - 2 z_t for negative gates),  b_t = z_t g(v_t),

with g(v) = v + 1/2 for v >= 0 and sigmoid(v) below (``log`` kinds, the paper's positive states) or g the
identity (``linear`` kinds). These are the values the layers' log-space and linear paths compute; here they
are formed in registers, so the forward reads ``pre`` and h0 and writes h alone, and the adjoint reads
``pre``, h0, h and grad h and writes d pre (one buffer, the projection's gradient) and d h0. Nothing else
(no gate tensors, no log coefficients) reaches memory.

One program per (row, block of channels) walks all of T in tiles whose loads are software-pipelined
(``tl.range`` stages), carrying BLOCK_J states from tile to tile. The adjoint walks back with
g_t = grad_h_t + a_{t+1} g_{t+1} (the coefficient of the next step recomputed from its pre-activations) and
forms every derivative from the stored states, so no division by a_t. Accumulation in float32 (float64 for
float64 inputs); h, h0 and grad h are in the state dtype (float32, or float64), ``pre`` and d pre in the
projection's dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op

from mingru._checks import check_float_tensor, check_shape
from mingru_triton import _recipes
from mingru_triton._launch import (
    _PLAIN,
    FLOAT_DTYPES,
    _run_eagerly,
    cdiv,
    eager_fast_path,
    eager_path,
    fast_math,
    grad_or_zeros,
    is_fp64,
    launch,
    on_kernel_device,
)
from mingru_triton._math import fast_div, fast_exp, fast_rcp

__all__ = [
    "KINDS",
    "GatedPlan",
    "adjoint",
    "force_plan",
    "gated_envelope",
    "gated_plan",
    "gated_recurrence_bwd",
    "gated_recurrence_fwd",
    "leaves_to_unfused",
    "recurrence",
]

KINDS: dict[str, tuple[int, int, int]] = {
    "gru-log": (0, 1, 0),
    "gru-linear": (0, 0, 0),
    "gru-negative": (0, 0, 1),
    "lstm-log": (1, 1, 0),
    "lstm-linear": (1, 0, 0),
}
"""The fused recurrences by name -> (LSTM, LOG_G, NEG): MinLSTM's two gate logits, the positive candidate
g of the log mode, the transition 1 - 2z. The ops take the index of the name in this dict (``kind``)."""
KIND_NAMES: tuple[str, ...] = tuple(KINDS)


def branches(kind: int) -> int:
    """G, the pre-activations per channel of recurrence ``kind``: 3 for MinLSTM, 2 for MinGRU."""
    return 3 if KINDS[KIND_NAMES[kind]][0] else 2


@triton.jit
def _acc(x, FP64: tl.constexpr):
    y = x.to(tl.float64) if FP64 else x.to(tl.float32)
    return y


@triton.jit
def _gate(k, FAST: tl.constexpr):
    """(z, 1 - z) = (sigmoid(k), sigmoid(-k)) from one exponential, each to its own relative precision."""
    e = fast_exp(-tl.abs(k), FAST)
    r = fast_rcp(1.0 + e, FAST)
    small = e * r
    return tl.where(k >= 0, r, small), tl.where(k >= 0, small, r)


@triton.jit
def _softplus(x):
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _compose(a1, h1, a2, h2):
    """Map (a2, h2) after map (a1, h1): x -> a2 (a1 x + h1) + h2."""
    return a1 * a2, a2 * h1 + h2


@triton.jit
def _load(ptr, mask, FP64: tl.constexpr):
    return _acc(tl.load(ptr, mask=mask, other=0.0), FP64)


@triton.jit
def _logits(ptr, mask, H, LSTM: tl.constexpr, FP64: tl.constexpr):
    """The gate logit k at ``ptr`` (MinLSTM: softplus(-f) - softplus(-i), f at ``ptr``, i at ``ptr + H``)
    and, for MinLSTM, f and i themselves (else k twice)."""
    f = _load(ptr, mask, FP64)
    if LSTM:
        i = _load(ptr + H, mask, FP64)
        k = _softplus(-f) - _softplus(-i)
    else:
        i = f
        k = f
    return k, f, i


@triton.jit
def _coefficient(z, zn, NEG: tl.constexpr):
    """a = 1 - z, or 1 - 2z = (1 - z) - z (NEG)."""
    a = zn - z if NEG else zn
    return a


@triton.jit
def _candidate(v, LOG_G: tl.constexpr, FAST: tl.constexpr):
    """(g(v), g'(v)): v + 1/2 and 1 for v >= 0, sigmoid(v) and its slope below (LOG_G); else v and 1."""
    if LOG_G:
        e = fast_exp(tl.minimum(v, 0.0), FAST)
        s = fast_div(e, 1.0 + e, FAST)  # sigmoid(v) for v < 0
        g = tl.where(v >= 0, v + 0.5, s)
        dg = tl.where(v >= 0, 1.0, s * (1.0 - s))
    else:
        g = v
        dg = v * 0.0 + 1.0
    return g, dg


@triton.jit
def _gated_fwd_kernel(
    pre_ptr,
    h0_ptr,
    h_ptr,
    L,
    H,
    NJB,
    LSTM: tl.constexpr,
    LOG_G: tl.constexpr,
    NEG: tl.constexpr,
    FAST: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    FP64: tl.constexpr,
):
    """One program: row r, channels jb * BLOCK_J + [0, BLOCK_J); h_t = a_t h_{t-1} + b_t over all L steps
    from h0 (R, H), a and b formed from ``pre`` (R, L, G H); writes h (R, L, H). Inputs contiguous.
    Addresses: a 64-bit base per tile, 32-bit offsets inside it."""
    pid = tl.program_id(0).to(tl.int64)
    r = pid // NJB
    jb = pid % NJB
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_j = offs_j < H
    lanes = tl.arange(0, BLOCK_T)
    width = (3 if LSTM else 2) * H
    vshift = (2 if LSTM else 1) * H
    pin = lanes[:, None] * width + offs_j[None, :]
    hin = lanes[:, None] * H + offs_j[None, :]
    last = (lanes == BLOCK_T - 1)[:, None]
    carry = _load(h0_ptr + r * H + offs_j, mask_j, FP64)
    for s0 in tl.range(0, L, BLOCK_T, num_stages=STAGES):
        m2 = (s0 + lanes < L)[:, None] & mask_j[None, :]
        step = r * L + s0
        pptr = pre_ptr + step * width + pin
        k, _, _ = _logits(pptr, m2, H, LSTM, FP64)
        z, zn = _gate(k, FAST)
        g, _ = _candidate(_load(pptr + vshift, m2, FP64), LOG_G, FAST)
        # Steps past L sit after every valid step in the tile: they change nothing that is stored.
        p, h = tl.associative_scan((_coefficient(z, zn, NEG), z * g), 0, _compose)
        h = h + p * carry[None, :]
        carry = tl.sum(tl.where(last, h, 0.0), axis=0)
        tl.store(h_ptr + step * H + hin, h.to(h_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _gated_bwd_kernel(
    pre_ptr,
    h0_ptr,
    h_ptr,
    dh_ptr,
    dfinal_ptr,
    dpre_ptr,
    dh0_ptr,
    L,
    H,
    NJB,
    DH_ROW,
    LSTM: tl.constexpr,
    LOG_G: tl.constexpr,
    NEG: tl.constexpr,
    HAS_DFINAL: tl.constexpr,
    FAST: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr,
    FP64: tl.constexpr,
):
    """Adjoint of :func:`_gated_fwd_kernel`, walking from t = L - 1 down to 0 (lane i of a tile is the
    i-th step back): g_t = dh_t + a_{t+1} g_{t+1}; with z = sigmoid(k) and h_{-1} = h0,
    d k = z (1 - z) g_t (g(v_t) - c h_{t-1}) (c = 2 for NEG, else 1), d v = g_t z g'(v_t); MinLSTM:
    d f = -d k sigmoid(-f), d i = d k sigmoid(-i). d h0 = a_0 g_0. ``dh`` rows start DH_ROW elements apart
    (L H where contiguous) and may be in any float dtype; HAS_DFINAL adds ``dfinal`` (R, H), the gradient
    of the final state, to dh at t = L - 1 (the walk's carry starts at it, with 1 standing for a_L)."""
    pid = tl.program_id(0).to(tl.int64)
    r = pid // NJB
    jb = pid % NJB
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_j = offs_j < H
    lanes = tl.arange(0, BLOCK_T)
    width = (3 if LSTM else 2) * H
    vshift = (2 if LSTM else 1) * H
    pin = -lanes[:, None] * width + offs_j[None, :]
    hin = -lanes[:, None] * H + offs_j[None, :]
    last = (lanes == BLOCK_T - 1)[:, None]
    h0 = _load(h0_ptr + r * H + offs_j, mask_j, FP64)
    carry = h0 * 0.0
    if HAS_DFINAL:
        carry = _load(dfinal_ptr + r * H + offs_j, mask_j, FP64)
    # a_L, the coefficient after the last step: 1 carries dfinal into g_{L-1}; else 0 (the carry is 0 too).
    past = 1.0 if HAS_DFINAL else 0.0
    d0 = h0 * 0.0
    for s0 in tl.range(0, L, BLOCK_T, num_stages=STAGES):
        t = L - 1 - s0 - lanes
        m2 = (t >= 0)[:, None] & mask_j[None, :]
        step = r * L + L - 1 - s0
        pptr = pre_ptr + step * width + pin
        hptr = h_ptr + step * H + hin
        dhptr = dh_ptr + r * DH_ROW + (L - 1 - s0) * H + hin
        # a_{t+1}, from the pre-activations one step later; ``past`` at t = L - 1 and in the padding.
        nok = ((t >= 0) & (t + 1 < L))[:, None] & mask_j[None, :]
        kn, _, _ = _logits(pptr + width, nok, H, LSTM, FP64)
        z_next, zn_next = _gate(kn, FAST)
        a_next = tl.where(nok, _coefficient(z_next, zn_next, NEG), past)
        p, g = tl.associative_scan((a_next, _load(dhptr, m2, FP64)), 0, _compose)
        g = g + p * carry[None, :]
        carry = tl.sum(tl.where(last, g, 0.0), axis=0)
        pok = (t >= 1)[:, None] & mask_j[None, :]
        h_prev = tl.where(pok, _load(hptr - H, pok, FP64), h0[None, :])
        k, f, i = _logits(pptr, m2, H, LSTM, FP64)
        z, zn = _gate(k, FAST)
        gv, dgv = _candidate(_load(pptr + vshift, m2, FP64), LOG_G, FAST)
        dk = z * zn * g * (gv - (2.0 * h_prev if NEG else h_prev))
        d0 += tl.sum(tl.where((t == 0)[:, None], _coefficient(z, zn, NEG) * g, 0.0), axis=0)
        ty = dpre_ptr.dtype.element_ty
        dptr = dpre_ptr + step * width + pin
        if LSTM:
            _, fn = _gate(f, FAST)
            _, i_n = _gate(i, FAST)
            tl.store(dptr, (-dk * fn).to(ty), mask=m2)
            tl.store(dptr + H, (dk * i_n).to(ty), mask=m2)
        else:
            tl.store(dptr, dk.to(ty), mask=m2)
        tl.store(dptr + vshift, (g * z * dgv).to(ty), mask=m2)
    tl.store(dh0_ptr + r * H + offs_j, d0.to(dh0_ptr.dtype.element_ty), mask=mask_j)


# ---------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------


class GatedPlan(NamedTuple):
    """Launch configuration of one walk: channels and steps per tile, warps, pipeline stages."""

    block_j: int
    block_t: int
    num_warps: int
    num_stages: int


_FORCED: list[GatedPlan] = []
FEW_CHAINS_MIN_LENGTH = 1024
FEW_CHAINS_FILL = 3 / 8
"""With fewer 16-channel programs than this fraction of the SMs and T >= :data:`FEW_CHAINS_MIN_LENGTH`,
:func:`leaves_to_unfused` holds and the layers keep their unfused path (the gates in PyTorch, then the k = 1
or log kernels, which spread T over the SMs). Below one program per SM the walk's time grows with T alone
(about 60 ns a step forward+backward on an H200), the unfused path's with B T H, so the crossover is a
program count. H200, MinGRU log, GPU time of forward+backward in ms, fused / unfused, float32 (bfloat16):
16 programs (1, 65536, 256) 3.93 / 1.57 (4.36 / 1.71); 32 programs (1, 16384, 512) 0.99 / 0.81
(1.10 / 0.88); 64 programs (2, 4096, 512), (4, 4096, 256), (1, 4096, 1024) 0.25 / 0.40 (0.28 / 0.44);
128 programs (1, 8192, 2048) 0.50 / 1.52 (0.55 / 1.66)."""


@contextlib.contextmanager
def force_plan(plan: GatedPlan) -> Iterator[None]:
    """Within the block every fused walk (forward and adjoint) uses ``plan`` (tests and the sweep)."""
    for name, value in zip(GatedPlan._fields, plan, strict=True):
        if value < 1 or (value & (value - 1) and name != "num_stages"):
            raise ValueError(f"{name} must be a power of two >= 1, got {value}")
    _FORCED.append(plan)
    try:
        with _recipes.overriding():
            yield
    finally:
        _FORCED.pop()


def gated_plan(backward: bool, lstm: bool = False, cpu: bool = False) -> GatedPlan:
    """The walk's tiles: 16 channels x 64 steps on four warps, 3 stages; MinLSTM's adjoint (``lstm``) 32 x 32;
    on the CPU (the interpreter runs every lane) tiles of 16 steps. The plan forced by :func:`force_plan`
    within its block.

    Each program computes the gates of its tile (an exponential and a reciprocal or more per element), so the
    walk wants many warps per SM: one-warp tiles, which serve the plain k = 1 walk, ran 3x-10x slower (the
    first version of these kernels, 64 x 32 on one warp: 1.09 / 3.10 ms float32, 0.76 / 2.82 ms bfloat16).
    On an H200 at (8, 4096, 1024), GPU time in ms of forward / adjoint, float32 and bfloat16 (12 tiles
    timed): MinGRU log 0.156 / 0.283 and 0.178 / 0.283; MinLSTM log 0.248 / 0.612 and 0.251 / 0.660 (its
    adjoint at 16 x 64: 0.645 and 0.744).
    """
    if _FORCED:
        return _FORCED[-1]
    block_j, block_t = (32, 32) if backward and lstm else (16, 64)
    return GatedPlan(block_j, 16 if cpu else block_t, 4, 3)


def leaves_to_unfused(rows: int, length: int, hidden: int, sms: int = 132) -> bool:
    """Whether ``rows`` x ``hidden`` channels of ``length`` steps are too few chains for the walk
    (:data:`FEW_CHAINS_FILL`): the layers then keep their unfused path."""
    return rows * cdiv(hidden, 16) < FEW_CHAINS_FILL * sms and length >= FEW_CHAINS_MIN_LENGTH


# ---------------------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------------------


def gated_envelope(pre: Tensor, h0: Tensor, kind: int) -> str | None:
    """None when the fused kernels take ``pre`` (B, T, G H) and ``h0`` (B, H) of recurrence ``kind``,
    else why not (shapes and dtypes only): T >= 1, H >= 1, h0 in the state dtype of ``pre``."""
    if not isinstance(kind, int) or not 0 <= kind < len(KINDS):
        return f"kind must be an int in [0, {len(KINDS)}), got {kind!r}"
    g = branches(kind)
    if pre.dim() != 3 or pre.shape[1] < 1 or pre.shape[2] < g or pre.shape[2] % g:
        return (
            f"the fused {KIND_NAMES[kind]} kernel takes pre (B, T, {g} H) with T >= 1 and H >= 1, "
            f"got {tuple(pre.shape)}"
        )
    want = _STATE_DTYPE.get(pre.dtype) or torch.promote_types(pre.dtype, torch.float32)
    if tuple(h0.shape) != (pre.shape[0], pre.shape[2] // g) or h0.dtype != want:
        return (
            f"the fused {KIND_NAMES[kind]} kernel takes h0 ({pre.shape[0]}, {pre.shape[2] // g}) in {want}, "
            f"got {tuple(h0.shape)} in {h0.dtype}"
        )
    return None


_STATE_DTYPE = {dtype: torch.promote_types(dtype, torch.float32) for dtype in FLOAT_DTYPES}
"""The state dtype of each input dtype the kernels take (float32; float64 for float64), looked up per call:
``torch.promote_types`` dispatches an aten op (host time, and an op no launch recipe replays)."""


def _common_case(pre: Tensor, h0: Tensor, kind: int, states: dict[str, Tensor]) -> bool:
    """Whether the inputs are plain, non-empty CUDA tensors of the shapes and dtypes the ops take: one cheap
    test, the detailed checks of :func:`_check` only when it fails (they cost microseconds of host time per
    call). ``GATED_IMPLS`` takes it for its envelope checks too."""
    if type(pre) not in _PLAIN or type(h0) not in _PLAIN or type(kind) is not int:
        return False
    state = _STATE_DTYPE.get(pre.dtype)
    if not 0 <= kind < len(KINDS) or pre.dim() != 3 or state is None:
        return False
    device = _recipes.device_key(pre)  # CUDA (tests: CPU stand-ins)
    if device is None or not _recipes.on_device(h0, device):
        return False
    rows, length, gh = pre.shape
    g = branches(kind)
    hidden = gh // g
    if rows < 1 or length < 1 or hidden < 1 or gh != g * hidden or h0.shape != (rows, hidden):
        return False
    if h0.dtype != state:
        return False
    shape = (rows, length, hidden)
    return all(
        type(x) in _PLAIN and x.shape == shape and x.dtype == h0.dtype and _recipes.on_device(x, device)
        for x in states.values()
    )


def _check(pre: Tensor, h0: Tensor, kind: int, states: dict[str, Tensor]) -> None:
    """Raise ValueError/TypeError naming what is wrong with the inputs of the fused ops."""
    if _common_case(pre, h0, kind, states):
        return
    pre = check_float_tensor("pre", pre, 3, "(B, T, G H)")
    h0 = check_float_tensor("h0", h0, 2, "(B, H)")
    reason = gated_envelope(pre, h0, kind)
    if reason is not None:
        raise ValueError(reason)
    rows, length = pre.shape[:2]
    for name, x in states.items():
        x = check_float_tensor(name, x, 3, "(B, T, H)")
        check_shape(name, x, (rows, length, h0.shape[1]), "(B, T, H)")
        if x.dtype != h0.dtype:
            raise ValueError(f"{name} must be in the state dtype {h0.dtype}, got {x.dtype}")
    for name, x in {"pre": pre, "h0": h0, **states}.items():
        if not on_kernel_device(x) or x.device != pre.device:
            raise ValueError(
                f"{name} must be a CUDA tensor (or a CPU tensor under TRITON_INTERPRET=1) on pre's device "
                f"{pre.device}, got device {x.device}"
            )


def _flags(kind: int) -> dict[str, int]:
    lstm, log_g, neg = KINDS[KIND_NAMES[kind]]
    return {"LSTM": lstm, "LOG_G": log_g, "NEG": neg}


def _plan(pre: Tensor, kind: int, backward: bool) -> GatedPlan:
    return gated_plan(backward, lstm=branches(kind) == 3, cpu=pre.device.type != "cuda")


def _forward(pre: Tensor, h0: Tensor, kind: int) -> Tensor:
    _check(pre, h0, kind, {})
    pre, h0 = pre.contiguous(), h0.contiguous()
    rows, length, _ = pre.shape
    hidden = h0.shape[1]
    h = torch.empty((rows, length, hidden), dtype=h0.dtype, device=pre.device)
    plan = _plan(pre, kind, backward=False)
    njb = cdiv(hidden, plan.block_j)
    launch(
        _gated_fwd_kernel, (rows * njb,), pre, h0, h, length, hidden, njb, **_flags(kind),
        FAST=fast_math(h0), STAGES=plan.num_stages, BLOCK_T=plan.block_t, BLOCK_J=plan.block_j,
        FP64=is_fp64(h0), num_warps=plan.num_warps,
    )  # fmt: skip
    return h


def _backward(
    pre: Tensor,
    h0: Tensor,
    h: Tensor,
    grad_h: Tensor,
    kind: int,
    d_final: Tensor | None = None,
    checked: bool = False,
) -> tuple[Tensor, Tensor]:
    """The adjoint's launch. Unless ``checked`` (by :func:`adjoint`: ``grad_h`` may be in pre's dtype, with
    rows of any stride, and ``d_final`` given), ``grad_h`` must pass :func:`_check` with the states."""
    if not checked:
        _check(pre, h0, kind, {"h": h, "grad_h": grad_h})
    pre, h0, h = pre.contiguous(), h0.contiguous(), h.contiguous()
    if not _rows_of(grad_h, h.shape):
        grad_h = grad_h.contiguous()
    rows, length, _ = pre.shape
    hidden = h0.shape[1]
    d_pre = torch.empty_like(pre)
    d_h0 = torch.empty_like(h0)
    plan = _plan(pre, kind, backward=True)
    njb = cdiv(hidden, plan.block_j)
    launch(
        _gated_bwd_kernel, (rows * njb,), pre, h0, h, grad_h, d_final, d_pre, d_h0, length, hidden, njb,
        grad_h.stride(0), **_flags(kind), HAS_DFINAL=int(d_final is not None), FAST=fast_math(h0),
        STAGES=plan.num_stages, BLOCK_T=plan.block_t, BLOCK_J=plan.block_j, FP64=is_fp64(h0),
        num_warps=plan.num_warps,
    )  # fmt: skip
    return d_pre, d_h0


def _rows_of(x: Tensor, shape: torch.Size) -> bool:
    """Whether ``x`` (of ``shape`` (B, T, H)) has contiguous (T, H) rows at any batch stride: the adjoint
    kernel's layout of grad h (a time slice of a longer tensor qualifies)."""
    return x.stride(2) == 1 and x.stride(1) == shape[2]


def _adjoint_common_case(
    pre: Tensor, h0: Tensor, kind: int, h: Tensor, grad_h: Tensor, d_final: Tensor | None
) -> bool:
    """:func:`_common_case` for :func:`adjoint`'s inputs: one cheap test before the checks that name what is
    wrong (grad h like h in the state dtype or pre's, d final like h0 or None)."""
    if not _common_case(pre, h0, kind, {"h": h}) or type(grad_h) not in _PLAIN:
        return False
    if grad_h.shape != h.shape or grad_h.dtype not in (h0.dtype, pre.dtype) or grad_h.device != pre.device:
        return False
    return d_final is None or (
        type(d_final) in _PLAIN
        and d_final.shape == h0.shape
        and d_final.dtype == h0.dtype
        and d_final.device == pre.device
    )


def _check_adjoint(
    pre: Tensor, h0: Tensor, kind: int, h: Tensor, grad_h: Tensor, d_final: Tensor | None
) -> None:
    """Raise ValueError/TypeError naming what is wrong with :func:`adjoint`'s inputs."""
    _check(pre, h0, kind, {"h": h})
    grad_h = check_float_tensor("grad_h", grad_h, 3, "(B, T, H)")
    check_shape("grad_h", grad_h, tuple(h.shape), "(B, T, H) like h")
    if grad_h.dtype not in (h0.dtype, pre.dtype) or grad_h.device != pre.device:
        raise ValueError(
            f"grad_h must be in the state dtype {h0.dtype} or pre's dtype {pre.dtype} on {pre.device}, "
            f"got {grad_h.dtype} on {grad_h.device}"
        )
    if d_final is not None:
        d_final = check_float_tensor("d_final", d_final, 2, "(B, H)")
        check_shape("d_final", d_final, tuple(h0.shape), "(B, H) like h0")
        if d_final.dtype != h0.dtype or d_final.device != pre.device:
            raise ValueError(
                f"d_final must be in the state dtype {h0.dtype} on {pre.device}, "
                f"got {d_final.dtype} on {d_final.device}"
            )


def adjoint(
    kind: int, pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor, d_final: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The adjoint of ``h = recurrence(kind, pre, h0)`` for a caller that runs it without autograd (the
    layers' recomputed chunks): ``grad_h`` (B, T, H) in the state dtype or in ``pre``'s dtype, read in place
    where its (T, H) rows are contiguous (a time slice of a longer gradient), plus ``d_final`` (B, H) in the
    state dtype, the gradient of the final state ``h[:, -1]``, or None. Returns (d pre (B, T, G H) in pre's
    dtype, d h0 (B, H)): what :func:`gated_recurrence_bwd` returns for ``grad_h`` with ``d_final`` added at
    the last step, without that sum in memory. Raises as :func:`gated_recurrence_bwd`."""
    if not _adjoint_common_case(pre, h0, kind, h, grad_h, d_final):
        _check_adjoint(pre, h0, kind, h, grad_h, d_final)
    if d_final is not None:
        d_final = d_final.contiguous()
    tensors = (pre, h0, h, grad_h) if d_final is None else (pre, h0, h, grad_h, d_final)
    if not eager_fast_path(*tensors):  # traced, or under a dispatch mode: the op, on the summed gradient
        grad = grad_h.to(h0.dtype, copy=True)
        if d_final is not None:
            grad.select(1, -1).add_(d_final)
        return gated_recurrence_bwd(pre, h0, h, grad, kind)
    return _run_eagerly(_BODIES[kind][2], tensors)


@triton_op("mingru::gated_recurrence_fwd", mutates_args=())
def gated_recurrence_fwd(pre: Tensor, h0: Tensor, kind: int) -> Tensor:
    """MinGRU/MinLSTM recurrence ``kind`` (index into :data:`KINDS`) from its pre-activations, fused:
    pre (B, T, G H), h0 (B, H) in the state dtype -> h (B, T, H) in the state dtype (float32; float64 for
    float64 ``pre``). Raises TypeError/ValueError on bad dtypes, shapes or devices."""
    if type(kind) is int and 0 <= kind < len(KINDS):
        return _BODIES[kind][0](pre, h0)
    return _forward(pre, h0, kind)  # raises, naming the kind


@triton_op("mingru::gated_recurrence_bwd", mutates_args=())
def gated_recurrence_bwd(
    pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor, kind: int
) -> tuple[Tensor, Tensor]:
    """Adjoint of :func:`gated_recurrence_fwd` -> (d pre (B, T, G H) in pre's dtype, d h0 (B, H))."""
    if type(kind) is int and 0 <= kind < len(KINDS):
        return _BODIES[kind][1](pre, h0, h, grad_h)
    return _backward(pre, h0, h, grad_h, kind)  # raises, naming the kind


def _setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, int], output: Tensor) -> None:
    pre, h0, kind = inputs
    ctx.save_for_backward(pre, h0, output)
    ctx.kind = kind


def _backward_op(ctx: Any, grad_h: Tensor | None) -> tuple[Tensor, Tensor, None]:
    pre, h0, h = ctx.saved_tensors
    d_pre, d_h0 = gated_recurrence_bwd(pre, h0, h, grad_or_zeros(grad_h, h), ctx.kind)
    return d_pre, d_h0, None


gated_recurrence_fwd.register_autograd(_backward_op, setup_context=_setup_context)


def _bodies(kind: int) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The eager bodies of recurrence ``kind``, each replayed from launch recipes (:mod:`._recipes`):
    ``forward(pre, h0)``, ``backward(pre, h0, h, grad_h)`` (the op's adjoint) and ``adjoint(pre, h0, h,
    grad_h[, d_final])`` (:func:`adjoint`'s, on inputs it has checked; ``grad_h`` of any layout, its strides
    in the key: a time slice with contiguous rows is read in place, by the recipe too)."""
    name = "gated " + KIND_NAMES[kind]

    def inputs(pre: Tensor, h0: Tensor) -> Any:
        return _common_case(pre, h0, kind, {}) and (pre.shape, pre.dtype)

    def states(pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor) -> Any:
        return _common_case(pre, h0, kind, {"h": h, "grad_h": grad_h}) and (pre.shape, pre.dtype)

    def checked(pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor, *d_final: Tensor) -> Any:
        return (pre.shape, pre.dtype, grad_h.dtype, grad_h.stride(), len(d_final))

    @_recipes.replayed(name + " fwd", inputs)
    def forward(pre: Tensor, h0: Tensor) -> Tensor:
        return _forward(pre, h0, kind)

    @_recipes.replayed(name + " bwd", states)
    def backward(pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor) -> tuple[Tensor, Tensor]:
        return _backward(pre, h0, h, grad_h, kind)

    @_recipes.replayed(name + " adjoint", checked, loose=(3,))
    def adjoint_body(pre: Tensor, h0: Tensor, h: Tensor, grad_h: Tensor, *d_final: Tensor) -> Any:
        return _backward(pre, h0, h, grad_h, kind, d_final[0] if d_final else None, True)

    return forward, backward, adjoint_body


_BODIES = tuple(_bodies(kind) for kind in range(len(KINDS)))


def _eager(kind: int) -> Callable[[Tensor, Tensor], Tensor]:
    name = "Gated" + KIND_NAMES[kind].title().replace("-", "")
    forward, backward, _ = _BODIES[kind]
    return eager_path(
        name, lambda pre, h0: gated_recurrence_fwd(pre, h0, kind), forward, backward, lambda x, h: (*x, h)
    )


_EAGER = tuple(_eager(kind) for kind in range(len(KINDS)))


def recurrence(kind: int, pre: Tensor, h0: Tensor) -> Tensor:
    """``gated_recurrence_fwd(pre, h0, kind)`` for the layers, eagerly without the op's dispatch
    (:func:`~mingru_triton._launch.eager_path`)."""
    return _EAGER[kind](pre, h0)
