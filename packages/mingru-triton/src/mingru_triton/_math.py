"""Elementwise math of the kernels: exp and reciprocal as single hardware instructions.

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
