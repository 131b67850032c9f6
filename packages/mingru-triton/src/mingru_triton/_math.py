"""Elementwise math of the kernels: exp and reciprocal as single hardware instructions, sine and cosine from
one range reduction.

Triton's float32 ``tl.exp`` and ``1 / x`` already use the approximate special-function unit (``ex2.approx``,
and ``rcp`` through ``div.full``), but each wraps it in a range fix-up: a compare and two predicated
multiplies, so that subnormal results of exp and denominators above 2^126 come out right. The ``.ftz`` forms
here drop the fix-up. For every input and result in the normal float32 range they give the same bits as
Triton's; a subnormal input or result (magnitude below 2^-126, about 1.2e-38) becomes zero. The kernels use
them where that is below float32's resolution of what they compute: exponentials of gates and of log-space
coefficients and values, and reciprocals of 1 + e with e in [0, 1].

Kernels import the helpers by name: ``torch.compile`` copies a user kernel's source together with the JIT
functions it names, not with module attributes. ``FAST`` is a compile-time flag set by the launcher
(:func:`mingru_triton._launch.fast_math`): 1 for compiled kernels that accumulate in float32; 0 for float64
(these instructions have no float64 form) and under the Triton interpreter, which runs no inline assembly.
With 0 the plain Triton functions run.

:func:`sincos` is not under that flag: it runs in every float32 kernel (the interpreter too) and is exact to
2 units in the last place, like Triton's own ``tl.sin`` and ``tl.cos`` (CUDA's ``sinf`` and ``cosf``), but
not bit for bit the same as those.
"""

import triton
import triton.language as tl


@triton.jit
def fast_exp(x, FAST: tl.constexpr):
    """e^x: ``ex2.approx.ftz.f32`` of x log2(e) when FAST (results below 2^-126 become 0), else ``tl.exp``."""
    if FAST:
        y = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634], dtype=tl.float32, is_pure=True,
            pack=1,
        )  # fmt: skip
    else:
        y = tl.exp(x)
    return y


@triton.jit
def fast_rcp(x, FAST: tl.constexpr):
    """1 / x: ``rcp.approx.ftz.f32`` when FAST (for 2^-126 <= |x| <= 2^126 the bits of Triton's float32
    division), else ``1.0 / x``."""
    if FAST:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)  # fmt: skip
    else:
        y = 1.0 / x
    return y


@triton.jit
def fast_div(x, y, FAST: tl.constexpr):
    """x / y: x times ``rcp.approx.ftz.f32`` of y when FAST, as one opaque unit (so the product is never
    fused into a later addition: the bits of Triton's float32 division for such y), else ``x / y``."""
    if FAST:
        q = tl.inline_asm_elementwise(
            "{ .reg .f32 r; rcp.approx.ftz.f32 r, $2; mul.rn.f32 $0, $1, r; }", "=r,r,r", [x, y],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        q = x / y
    return q


@triton.jit
def widen(x, FAST: tl.constexpr):
    """``x`` in float32. For bfloat16 with FAST, each register of two values becomes a shift (the low one)
    and a mask (the high one): Triton's conversion spends a permute more on the high one. Same bits."""
    y = x.to(tl.float32)
    if FAST and x.dtype == tl.bfloat16:
        y = tl.inline_asm_elementwise(
            "{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x], dtype=tl.float32,
            is_pure=True, pack=2,
        )  # fmt: skip
    return y


@triton.jit
def _sincos_reduced(x):
    """(sin x, cos x) for float32 |x| <= 2^16: x = j pi/2 + r with j = round(2x/pi), r from three float32
    parts of pi/2 by fused multiply-adds (the first exact for such x); sin r and cos r from their Taylor
    series on |r| <= pi/4 (truncation below 3e-9 relative), then the quadrant j mod 4 picks and signs them."""
    j = (x * 0.6366197723675814 + 12582912.0) - 12582912.0
    r = tl.fma(j, -1.5707963705062866, x)
    r = tl.fma(j, 4.371138828673793e-08, r)
    r = tl.fma(j, 1.7151245100058819e-15, r)
    r2 = r * r
    ps = tl.fma(r2, 2.7557319223985893e-06, -1.9841269841269841e-04)
    ps = tl.fma(r2, ps, 8.333333333333333e-03)
    ps = tl.fma(r2, ps, -1.6666666666666666e-01)
    sin_r = tl.fma(r * r2, ps, r)
    pc = tl.fma(r2, -2.755731922398589e-07, 2.48015873015873e-05)
    pc = tl.fma(r2, pc, -1.388888888888889e-03)
    pc = tl.fma(r2, pc, 4.1666666666666664e-02)
    pc = tl.fma(r2, pc, -0.5)
    cos_r = tl.fma(r2, pc, 1.0)
    q = j.to(tl.int32)
    odd = (q & 1) != 0
    s = tl.where(odd, cos_r, sin_r)
    c = tl.where(odd, sin_r, cos_r)
    s = tl.where((q & 2) != 0, -s, s)
    c = tl.where(((q + 1) & 2) != 0, -c, c)
    # sin(-0) = -0: the reduction's additions give +0 there
    s = tl.where(x == 0.0, x, s)
    return s, c


@triton.jit
def sincos(x):
    """(sin x, cos x) of a float32 or float64 tile. float32: both from one range reduction
    (:func:`_sincos_reduced`, within 2 units in the last place of the exact values), Triton's ``tl.sin`` and
    ``tl.cos`` for the whole tile when any entry is above 2^16 in magnitude, infinite or NaN (one integer max
    over the tile decides); float64: ``tl.sin`` and ``tl.cos``."""
    if x.dtype == tl.float64:
        s = tl.sin(x)
        c = tl.cos(x)
    else:
        s, c = _sincos_reduced(x)
        # 0x47800000: the bits of 2^16; inf and NaN lie above it
        if tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF) > 0x47800000:
            s = tl.sin(x)
            c = tl.cos(x)
    return s, c
