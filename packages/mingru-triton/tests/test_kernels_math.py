"""The kernels' single-instruction exp and reciprocal, their bfloat16 widening and their sine and cosine
(:mod:`mingru_triton._math`): when the FAST flag is on, what sm_90 code it gives (compiled on the CPU, no GPU
needed), and on CUDA that it leaves every output of the gated, log and k = 1 kernels bit for bit as Triton's
own exp, division and conversion give them; ``sincos`` within 2 units in the last place of the exact values
(under the interpreter and on CUDA)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl
from kernel_cases import marked, on_cuda, on_interpreter

from mingru.dispatch import interpret_requested
from mingru_triton import gated, linear
from mingru_triton import log as log_kernels
from mingru_triton._launch import fast_math, plain_math
from mingru_triton._math import fast_div, fast_exp, fast_rcp, sincos, widen


@triton.jit
def _special_kernel(x_ptr, y_ptr, FAST: tl.constexpr):
    offs = tl.arange(0, 128)
    x = tl.load(x_ptr + offs)
    e = fast_exp(-tl.abs(x), FAST)
    y = fast_rcp(1.0 + e, FAST) + fast_div(e, 1.0 + e, FAST)
    tl.store(y_ptr + offs, y)


@triton.jit
def _widen_kernel(x_ptr, y_ptr, FAST: tl.constexpr):
    offs = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    tl.store(y_ptr + offs, widen(tl.load(x_ptr + offs), FAST))


@triton.jit
def _sincos_kernel(x_ptr, s_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s, c = sincos(tl.load(x_ptr + offs))
    tl.store(s_ptr + offs, s)
    tl.store(c_ptr + offs, c)


def _sm90_ptx(fn, signature: dict[str, str], constants: dict[str, int], num_warps: int) -> str:
    """PTX of ``fn`` for an H100/H200 (sm_90), compiled here without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    source = ASTSource(fn=fn, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    return compiled.asm["ptx"]


def _instructions(ptx: str) -> dict[str, int]:
    """Count of each exp, reciprocal and division instruction in ``ptx`` (inline assembly blocks included)."""
    ops = re.findall(r"\b((?:ex2|rcp|div)\.[a-z0-9.]+)", ptx)
    return {op: ops.count(op) for op in set(ops)}


def test_fast_flag_follows_dtype_interpreter_and_plain_math(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert fast_math(torch.empty(1, dtype=dtype)) == 1
    assert fast_math(torch.empty(1, dtype=torch.float64)) == 0
    with plain_math():
        assert fast_math(torch.empty(1)) == 0
    assert fast_math(torch.empty(1)) == 1
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fast_math(torch.empty(1)) == 0


compiles = pytest.mark.skipif(interpret_requested(), reason="compiles kernels, which the interpreter cannot")


@compiles
def test_fast_flag_compiles_to_the_ftz_instructions_without_range_fixups() -> None:
    """FAST: only ex2.approx.ftz (one per exp) and rcp.approx.ftz (one per reciprocal and per division);
    without it, Triton's exp (ex2.approx with its subnormal fix-up) and division (div.full)."""
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32"}
    fast = _instructions(_sm90_ptx(_special_kernel, signature, {"FAST": 1}, 4))
    plain = _instructions(_sm90_ptx(_special_kernel, signature, {"FAST": 0}, 4))
    assert set(fast) == {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32"}, fast
    assert fast["rcp.approx.ftz.f32"] == 2 * fast["ex2.approx.ftz.f32"]
    assert "ex2.approx.f32" in plain and "div.full.f32" in plain and not any("ftz" in op for op in plain), (
        plain
    )


def _as_torch_compile_copies(kernel, folder: Path):  # type: ignore[no-untyped-def]
    """``kernel`` as the code ``torch.compile`` generates defines it: its source and that of every JIT
    function it names (Inductor's own collector), in a fresh module that imports only triton."""
    wrapper = pytest.importorskip("torch._inductor.codegen.wrapper")
    collect = getattr(wrapper, "user_defined_triton_kernel_transitive_closure_source_code", None)
    if collect is None:
        pytest.skip("this torch has no user_defined_triton_kernel_transitive_closure_source_code")
    path = folder / f"{kernel.__name__}_as_compiled.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + collect(kernel))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel.__name__)


@compiles
@pytest.mark.parametrize("kernel", ["gated forward", "log single pass"])
def test_kernels_take_the_flag(kernel: str, tmp_path: Path) -> None:
    """The MinGRU-log forward and the log scan's single pass use only the ftz forms when FAST is on, also
    as copied into ``torch.compile``'s generated code (which resolves JIT functions by name alone)."""
    if kernel == "gated forward":
        fn = gated._gated_fwd_kernel
        signature = {"pre_ptr": "*bf16", "h0_ptr": "*fp32", "h_ptr": "*fp32", "L": "i32", "H": "i32"}
        signature["NJB"] = "i32"
        constants = {"LSTM": 0, "LOG_G": 1, "NEG": 0, "STAGES": 3, "BLOCK_T": 64, "BLOCK_J": 16, "FP64": 0}
        warps = 4
    else:
        fn = linear._lookback_kernel
        pointers = ("coef", "u", "init", "hout", "prevh", "prev0", "da", "dinit", "lb", "agg", "inc")
        signature = {f"{name}_ptr": "*fp32" for name in pointers}
        signature.update(flag_ptr="*i32", L="i32", DJ="i32", NJB="i32", CHAINS="i32", NT="i32")
        constants = dict.fromkeys(
            ("WALK_REV", "SHIFT", "DA", "HAS_PREV0", "DINIT", "LOG_GRADS", "H0_SLOT"), 0
        )
        constants.update(HAS_INIT=1, EXP_COEF=1, EXP_U=1, BAIL=1, SPARSE=1, REPLAY=4, BLOCK_T=16, BLOCK_J=128)
        constants["FP64"] = 0
        warps = 1
    fn = _as_torch_compile_copies(fn, tmp_path)
    fast = _instructions(_sm90_ptx(fn, signature, {**constants, "FAST": 1}, warps))
    plain = _instructions(_sm90_ptx(fn, signature, {**constants, "FAST": 0}, warps))
    assert fast.get("ex2.approx.ftz.f32", 0) > 0 and "ex2.approx.f32" not in fast, fast
    assert "div.full.f32" not in fast, fast
    assert plain.get("ex2.approx.f32", 0) == fast["ex2.approx.ftz.f32"], (plain, fast)


def _gated_case(kind: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    g = gated.branches(list(gated.KINDS).index(kind))
    pre = torch.randn(4, 1500, g * 300, device="cuda", generator=generator).mul_(3).to(dtype)
    h0 = torch.randn(4, 300, device="cuda", generator=generator)
    grad = torch.randn(4, 1500, 300, device="cuda", generator=generator)
    return pre, h0, grad


@marked(on_cuda)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", list(gated.KINDS))
def test_gated_kernels_give_the_bits_of_plain_math_on_cuda(kind: str, dtype: torch.dtype) -> None:
    """Logits of up to about 15 (no subnormal exp): states, d pre and d h0 equal bit for bit."""
    pre, h0, grad = _gated_case(kind, dtype)
    code = list(gated.KINDS).index(kind)

    def run() -> tuple[torch.Tensor, ...]:
        h = gated.gated_recurrence_fwd(pre, h0, code)
        return (h, *gated.gated_recurrence_bwd(pre, h0, h, grad, code))

    fast = run()
    with plain_math():
        plain = run()
    for what, got, want in zip(("h", "d pre", "d h0"), fast, plain, strict=True):
        assert torch.equal(got, want), f"{kind} {dtype}: {what} differs from plain math"


@marked(on_cuda)
@pytest.mark.parametrize("strategy", ["lookback", "pipelined"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_log_single_pass_gives_the_bits_of_plain_math_on_cuda(strategy: str, dtype: torch.dtype) -> None:
    """The log recurrence and its adjoint on the k = 1 kernels, with -inf log values: equal bit for bit."""
    generator = torch.Generator(device="cuda").manual_seed(1)
    shape = (8, 4096, 512)
    log_coeffs = torch.nn.functional.logsigmoid(torch.randn(shape, device="cuda", generator=generator) + 2)
    log_b = torch.randn(shape, device="cuda", generator=generator) - 1
    log_b[:, ::7, ::5] = float("-inf")
    h0 = torch.randn(shape[0], shape[2], device="cuda", generator=generator)
    grad = torch.randn(shape, device="cuda", generator=generator)
    args = [x.to(dtype).requires_grad_() for x in (log_coeffs, log_b, h0)]

    def run() -> tuple[torch.Tensor, ...]:
        h = log_kernels.log_recurrence_fwd(*args)
        return (h, *torch.autograd.grad(h, args, grad.to(dtype)))

    with log_kernels.force_strategy(strategy):
        assert log_kernels._single_pass_plan(args[0]) is not None
        fast = run()
        with plain_math():
            plain = run()
    for what, got, want in zip(("h", "d log a", "d log b", "d h0"), fast, plain, strict=True):
        assert torch.isfinite(got).all(), f"{strategy} {dtype}: {what} is not finite"
        assert torch.equal(got, want), f"{strategy} {dtype}: {what} differs from plain math"


def _pipelined_forward_ptx(fast: int) -> str:
    pointers = ("coef", "u", "ux", "init", "hout", "xout", "prevh", "prevx", "prev0", "da", "dinit", "lb")
    signature = {f"{name}_ptr": "*bf16" for name in pointers}
    signature.update(flag_ptr="*i32", L="i32", DJ="i32", NJB="i32")
    flags = ("WALK_REV", "SHIFT", "DA", "HAS_PREV0", "DINIT", "WRITE_X", "HAS_UX", "PREV_X", "EXP_COEF")
    constants = dict.fromkeys((*flags, "EXP_U", "LOG_GRADS", "BAIL", "H0_SLOT", "FP64"), 0)
    constants.update(HAS_INIT=1, FIXED_DJ=1024, STAGES=4, COLUMNS=2, BLOCK_T=64, BLOCK_J=64, FAST=fast)
    return _sm90_ptx(linear._pipelined_kernel, signature, constants, 1)


@compiles
def test_pipelined_walk_widens_bfloat16_pairs_with_a_shift_and_a_mask() -> None:
    """FAST: the k = 1 forward walk's bfloat16 tiles (two channels per register) become float32 through
    ``shl`` and ``and`` of the register (the inline assembly of :func:`widen`), not Triton's conversion; the
    state before the walk still goes through it."""
    fast, plain = _pipelined_forward_ptx(1), _pipelined_forward_ptx(0)
    widened = len(re.findall(r"and\.b32\s+%r\d+, %r\d+, 0xffff0000;", fast))
    cvt_fast, cvt_plain = fast.count("cvt.f32.bf16"), plain.count("cvt.f32.bf16")
    assert widened > 0 and "0xffff0000" not in plain, widened
    assert 0 < cvt_fast < cvt_plain, (cvt_fast, cvt_plain)


@marked(on_cuda)
def test_widen_gives_the_bits_of_the_conversion_for_every_bfloat16_on_cuda() -> None:
    """All 65536 bfloat16 bit patterns, FAST and not: the float32 bits torch gives; NaN stays NaN."""
    x = torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    want = x.float()
    for fast in (1, 0):
        y = torch.empty_like(want)
        _widen_kernel[(x.numel() // 1024,)](x, y, FAST=fast)
        nan = want.isnan()
        assert torch.equal(y.isnan(), nan), f"FAST={fast}: NaN where the conversion has none, or the reverse"
        assert torch.equal(y[~nan].view(torch.int32), want[~nan].view(torch.int32)), f"FAST={fast}"


@marked(on_cuda)
@pytest.mark.parametrize("op", ["recurrence", "scan"])
def test_pipelined_walk_gives_the_bits_of_plain_math_in_bfloat16_on_cuda(op: str) -> None:
    """The k = 1 recurrence (with h0) and ``linear_scan_fwd`` (with the running product) on the pipelined
    walk, forward and adjoint, widened or converted: equal bit for bit."""
    generator = torch.Generator(device="cuda").manual_seed(2)
    shape = (8, 2048, 1024)
    a = (torch.rand(shape, device="cuda", generator=generator) * 0.2 + 0.8).bfloat16().requires_grad_()
    b = torch.randn(shape, device="cuda", generator=generator).bfloat16().requires_grad_()
    h0 = torch.randn(shape[0], shape[2], device="cuda", generator=generator).bfloat16().requires_grad_()
    grads = [torch.randn(shape, device="cuda", generator=generator).bfloat16() for _ in range(2)]

    def run() -> tuple[torch.Tensor, ...]:
        if op == "recurrence":
            outs: tuple[torch.Tensor, ...] = (linear.linear_recurrence_fwd(a, b, h0),)
            inputs = (a, b, h0)
        else:
            outs, inputs = linear.linear_scan_fwd(a, b), (a, b)
        return (*outs, *torch.autograd.grad(outs, inputs, grads[: len(outs)]))

    plan = linear._plan_for(a.detach(), 1, single_pass=op == "recurrence", pipelined=True)
    assert plan.strategy == "pipelined", plan
    fast = run()
    with plain_math():
        plain = run()
    for i, (got, want) in enumerate(zip(fast, plain, strict=True)):
        assert torch.isfinite(got).all(), f"{op}: output {i} is not finite"
        assert torch.equal(got, want), f"{op}: output {i} differs from plain math"


SINCOS_BLOCK = 256


def _sincos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sincos` of a float32 or float64 ``x`` (a multiple of SINCOS_BLOCK long), one tile per block."""
    s, c = torch.empty_like(x), torch.empty_like(x)
    _sincos_kernel[(x.numel() // SINCOS_BLOCK,)](x, s, c, BLOCK=SINCOS_BLOCK)
    return s, c


def _ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in units of the last place of float32 at |exact| (float64 ``exact``)."""
    magnitude = exact.abs().float()
    unit = (torch.nextafter(magnitude, torch.full_like(magnitude, float("inf"))) - magnitude).double()
    return (got.double() - exact).abs() / unit


def _check_sincos(device: str, randoms: int) -> None:
    """Every reduced range the fast path takes (|x| <= 2^16): random angles, the float32 neighbours of
    multiples of pi/2 (where the reduced angle is smallest), signed zeros and tiny values, within 2 units in
    the last place of float64's sine and cosine (a subnormal x gives sin x = x or 0, cos x = 1); then tiles
    holding an angle past 2^16, an infinity or a NaN, which take Triton's own functions for the whole tile,
    within 2 units as well (NaN where it should be)."""
    generator = torch.Generator().manual_seed(5)
    turns = torch.arange(1, 41723, dtype=torch.float64) * (torch.pi / 2)
    near = turns.float()
    parts = [
        (torch.rand(randoms, generator=generator, dtype=torch.float64) * 2 - 1) * 65536,
        (torch.rand(randoms, generator=generator, dtype=torch.float64) * 2 - 1) * 4,
        near, -near, torch.nextafter(near, torch.full_like(near, 1e6)),
        torch.tensor([0.0, -0.0, 1e-30, -1e-40, 65536.0, -65536.0]),
    ]  # fmt: skip
    x = torch.cat([p.float() for p in parts])
    x = torch.cat([x, x.new_full((-x.numel() % SINCOS_BLOCK,), 0.5)])
    s, c = _sincos(x.to(device))
    s, c = s.cpu(), c.cpu()
    # compiled kernels flush subnormal float32 (|x| < 2^-126) to zero, as Triton's own sin does
    normal = x.abs() >= torch.finfo(torch.float32).tiny
    exact = x.double()
    for name, got, want in (("sin", s, torch.sin(exact)), ("cos", c, torch.cos(exact))):
        err = _ulps(got[normal], want[normal])
        worst = int(err.argmax())
        assert err.max() <= 2.0, f"{name}: {float(err.max()):.2f} ulp at x = {float(x[normal][worst])!r}"
    tiny = x[~normal]
    assert ((s[~normal] == tiny) | (s[~normal] == 0)).all() and (c[~normal] == 1).all()
    zeros = torch.tensor([0.0, -0.0]).repeat(SINCOS_BLOCK // 2)
    s, c = _sincos(zeros.to(device))
    assert torch.equal(torch.signbit(s.cpu()), torch.signbit(zeros)), "sin(+-0.0) lost the sign of zero"
    assert (s == 0).all() and (c == 1).all()
    # fallback tiles: one entry past the reduction's range takes the whole tile to tl.sin / tl.cos
    odd = torch.tensor([1e5, -3.0e38, 70000.5, 123456.0])
    tiles = torch.linspace(-10, 10, 3 * SINCOS_BLOCK).float()
    tiles[:: SINCOS_BLOCK // 2][: odd.numel()] = odd
    special = torch.tensor([float("inf"), float("-inf"), float("nan")])
    tiles[SINCOS_BLOCK * 2 : SINCOS_BLOCK * 2 + 3] = special
    s, c = _sincos(tiles.to(device))
    exact = tiles.double()
    finite = torch.isfinite(tiles)
    for name, got, want in (("sin", s.cpu(), torch.sin(exact)), ("cos", c.cpu(), torch.cos(exact))):
        assert got[~finite].isnan().all(), f"{name} of inf / NaN is not NaN"
        err = _ulps(got[finite], want[finite])
        assert err.max() <= 2.0, f"{name} in the fallback tiles: {float(err.max()):.2f} ulp"


@triton.jit
def _fma_kernel(x_ptr, y_ptr):
    offs = tl.arange(0, 16)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, tl.fma(x, x, -(x * x)))


def _fma_rounds_once() -> bool:
    """Whether ``tl.fma`` rounds once here: (1 + 2^-12)^2 - fl((1 + 2^-12)^2) is 2^-24, not 0. Older Tritons'
    interpreters (3.4) multiply and add, rounding twice; compiled kernels always fuse."""
    x = torch.full((16,), 1.0 + 2.0**-12)
    y = torch.empty_like(x)
    _fma_kernel[(1,)](x, y)
    return bool((y == 2.0**-24).all())


@marked(on_interpreter)
def test_sincos_within_two_ulps_interpreted() -> None:
    if not _fma_rounds_once():
        pytest.skip(
            f"triton {triton.__version__}'s interpreter rounds tl.fma twice: the range reduction is inexact"
        )
    _check_sincos("cpu", 4096)


@marked(on_cuda)
def test_sincos_within_two_ulps_on_cuda() -> None:
    _check_sincos("cuda", 1 << 20)


@marked(on_cuda)
def test_sincos_of_float64_is_tl_sin_and_tl_cos_on_cuda() -> None:
    """float64 keeps Triton's own functions: within 2 units of float64's last place of torch's."""
    x = torch.linspace(-1e4, 1e4, 64 * SINCOS_BLOCK, dtype=torch.float64, device="cuda")
    s, c = _sincos(x)
    for got, want in ((s, torch.sin(x)), (c, torch.cos(x))):
        unit = torch.nextafter(want.abs(), torch.full_like(want, float("inf"))) - want.abs()
        assert ((got - want).abs() <= 2 * unit).all()
