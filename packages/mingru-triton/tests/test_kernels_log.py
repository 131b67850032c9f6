"""The fused log-space scan kernels against the float64 eager reference, forward and backward.

Interpreter tests (CPU tensors, TRITON_INTERPRET=1) use small shapes and force each strategy; CUDA tests use
real sizes, the automatic strategy and one scan of more than 2^31 elements.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import Tensor

pytest.importorskip("triton")

from kernel_cases import HALF_TYPES, assert_close, kernel_device, on_cuda, on_interpreter

from mingru.scans.log import parallel_scan_log_ref, safe_log
from mingru_triton import _launch, linear
from mingru_triton import log as log_kernels
from mingru_triton.log import (
    force_log_space,
    force_strategy,
    log_envelope,
    log_recurrence_fwd,
    parallel_scan_log_fwd,
)

NEG_INF = float("-inf")


def recurrence_ref(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    """Eager h_t = exp(lc_t) h_{t-1} + exp(lb_t) from h0 of any sign (as mingru.min_gru.log_recurrence)."""
    h = parallel_scan_log_ref(log_coeffs, torch.cat((safe_log(h0).unsqueeze(1), log_b), dim=1))
    return h + torch.cumsum(log_coeffs, dim=1).exp() * h0.clamp(max=0).unsqueeze(1)


def log_inputs(
    shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """log_coeffs = log sigmoid (negative, gates in (0, 1)) and log_values (B, T+1, D) of moderate size."""
    gen = torch.Generator().manual_seed(seed)
    batch, steps, width = shape
    log_coeffs = torch.nn.functional.logsigmoid(torch.randn(shape, generator=gen, dtype=torch.float64) + 2)
    log_values = torch.randn((batch, steps + 1, width), generator=gen, dtype=torch.float64) - 1
    return log_coeffs.to(device, dtype), log_values.to(device, dtype)


def check_log_scan(log_coeffs: Tensor, log_values: Tensor, what: str) -> None:
    """Forward and both gradients of parallel_scan_log_fwd against the float64 reference (with autograd)."""
    dtype, steps = log_coeffs.dtype, log_coeffs.shape[1]
    lc = log_coeffs.detach().requires_grad_()
    lv = log_values.detach().requires_grad_()
    h = parallel_scan_log_fwd(lc, lv)
    grad = torch.randn(h.shape, generator=torch.Generator().manual_seed(1)).to(h.device, dtype)
    h.backward(grad)
    lc64 = log_coeffs.detach().double().requires_grad_()
    lv64 = log_values.detach().double().requires_grad_()
    ref = parallel_scan_log_ref(lc64, lv64)
    ref.backward(grad.double())
    assert h.dtype == dtype and lc.grad is not None and lv.grad is not None
    for name, value in (("h", h), ("d_log_coeffs", lc.grad), ("d_log_values", lv.grad)):
        assert not value.isnan().any(), f"{what}: NaN in {name}"
    assert_close(h, ref, dtype, steps, f"{what} h")
    assert_close(lc.grad, lc64.grad, dtype, steps, f"{what} d_log_coeffs")
    assert_close(lv.grad, lv64.grad, dtype, steps, f"{what} d_log_values")


def check_recurrence(log_coeffs: Tensor, log_b: Tensor, h0: Tensor, what: str) -> None:
    """Forward and the three gradients of log_recurrence_fwd against the float64 eager recurrence."""
    dtype, steps = log_coeffs.dtype, log_coeffs.shape[1]
    inputs = [x.detach().requires_grad_() for x in (log_coeffs, log_b, h0)]
    h = log_recurrence_fwd(*inputs)
    grad = torch.randn(h.shape, generator=torch.Generator().manual_seed(2)).to(h.device, dtype)
    h.backward(grad)
    inputs64 = [x.detach().double().requires_grad_() for x in (log_coeffs, log_b, h0)]
    ref = recurrence_ref(*inputs64)
    ref.backward(grad.double())
    assert h.dtype == dtype
    assert not h.isnan().any(), f"{what}: NaN in h"
    assert_close(h, ref, dtype, steps, f"{what} h")
    for name, x, x64 in zip(("d_log_coeffs", "d_log_b", "d_h0"), inputs, inputs64, strict=True):
        assert x.grad is not None and x64.grad is not None
        assert not x.grad.isnan().any(), f"{what}: NaN in {name}"
        assert_close(x.grad, x64.grad, dtype, steps, f"{what} {name}")


def signed_h0(batch: int, width: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """h0 (B, D) with positive, negative and zero entries."""
    gen = torch.Generator().manual_seed(3)
    h0 = torch.randn((batch, width), generator=gen, dtype=torch.float64)
    h0.view(-1)[::3] = 0.0
    return h0.to(device, dtype)


SHAPES = [(2, 1, 3), (1, 1, 1), (2, 37, 5), (1, 300, 2)]
STRATEGIES = log_kernels.STRATEGIES
SPACES = ("linear", "log")


def in_space(space: str) -> contextlib.AbstractContextManager[None]:
    """The forward's tile combine: "linear" (the default for tiles of log coefficients <= 0) or "log"."""
    return force_log_space() if space == "log" else contextlib.nullcontext()


def shape_id(shape: tuple[int, int, int]) -> str:
    return "B{}-T{}-D{}".format(*shape)


class TestInterpreter:
    pytestmark = on_interpreter

    @pytest.mark.parametrize("space", SPACES)
    @pytest.mark.parametrize("strategy", STRATEGIES)
    @pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
    def test_log_scan_matches_reference(self, shape: tuple[int, int, int], strategy: str, space: str) -> None:
        with force_strategy(strategy), in_space(space):
            check_log_scan(*log_inputs(shape, torch.float32, kernel_device()), f"{strategy} {space} {shape}")

    @pytest.mark.parametrize("space", SPACES)
    @pytest.mark.parametrize("strategy", STRATEGIES)
    @pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
    def test_recurrence_matches_reference(
        self, shape: tuple[int, int, int], strategy: str, space: str
    ) -> None:
        device = kernel_device()
        log_coeffs, log_values = log_inputs(shape, torch.float32, device)
        h0 = signed_h0(shape[0], shape[2], torch.float32, device)
        with force_strategy(strategy), in_space(space):
            check_recurrence(log_coeffs, log_values[:, 1:], h0, f"{strategy} {space} {shape}")

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_growing_tiles_combine_in_log_space(self, strategy: str) -> None:
        """Tiles with a log coefficient > 0 take the log-space combine, the others the linear one, in one row.

        With lc = 3 over 40 steps the running product reaches e^120, past float32; the states stay near
        e^-30 because lb = -150 before t = 60, so only a log-space combine of those tiles gives them
        without inf or NaN. (Forward only: the adjoint runs in linear space; its lam reaches e^120 here.)
        """
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 90, 3), torch.float32, device)
        log_coeffs[:, 20:60] = 3.0
        log_values[:, :61] = -150.0  # log h0 and log b_t up to t = 60
        h0 = signed_h0(2, 3, torch.float32, device) * 1e-30
        with force_strategy(strategy):
            h = parallel_scan_log_fwd(log_coeffs, log_values)
            h_rec = log_recurrence_fwd(log_coeffs, log_values[:, 1:], h0)
        ref = parallel_scan_log_ref(log_coeffs.double(), log_values.double())
        ref_rec = recurrence_ref(log_coeffs.double(), log_values[:, 1:].double(), h0.double())
        assert torch.isfinite(h).all() and torch.isfinite(h_rec).all() and (h[:, 59] > 0).all()
        assert_close(h, ref, torch.float32, 90, f"{strategy} growing h")
        assert_close(h_rec, ref_rec, torch.float32, 90, f"{strategy} growing recurrence h")

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_float64(self, strategy: str) -> None:
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 35, 3), torch.float64, device)
        h0 = signed_h0(2, 3, torch.float64, device)
        with force_strategy(strategy):
            check_log_scan(log_coeffs, log_values, f"{strategy} float64")
            check_recurrence(log_coeffs, log_values[:, 1:], h0, f"{strategy} float64")

    @pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_half_inputs(self, strategy: str, dtype: torch.dtype) -> None:
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 24, 3), dtype, device)
        h0 = signed_h0(2, 3, dtype, device)
        with force_strategy(strategy):
            check_log_scan(log_coeffs, log_values, f"{strategy} {dtype}")
            check_recurrence(log_coeffs, log_values[:, 1:], h0, f"{strategy} {dtype}")

    @pytest.mark.parametrize("space", SPACES)
    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_minus_infinity_gives_no_nan(self, strategy: str, space: str) -> None:
        device = kernel_device()
        log_coeffs, log_values = log_inputs((3, 21, 4), torch.float32, device)
        log_values[0] = NEG_INF  # a whole row of zero values and h0 = 0: h = 0, all gradients 0
        log_values[1, :, 1] = NEG_INF
        log_values[2, 0] = NEG_INF  # h0 = 0 only
        log_coeffs[1, 5:9] = NEG_INF  # a = 0: the state restarts
        log_coeffs[2, :, 2] = NEG_INF
        with force_strategy(strategy), in_space(space):
            check_log_scan(log_coeffs, log_values, f"{strategy} -inf")
            h0 = signed_h0(3, 4, torch.float32, device)
            h0[0] = 0.0
            h0[1] = -torch.linspace(0.5, 2.0, 4)
            check_recurrence(log_coeffs, log_values[:, 1:], h0, f"{strategy} -inf")
            h = parallel_scan_log_fwd(log_coeffs, log_values)
        assert torch.equal(h[0], torch.zeros_like(h[0]))

    def test_zero_h0_gradient_is_a1_lam1(self) -> None:
        """d h0 = a_1 lam_1 for h0 = 0 (the derivative of the linear recurrence, whatever the sign)."""
        log_coeffs, log_values = log_inputs((1, 6, 2), torch.float64, kernel_device())
        h0 = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
        log_recurrence_fwd(log_coeffs, log_values[:, 1:], h0).sum().backward()
        expected = torch.cumsum(log_coeffs, dim=1).exp().sum(dim=1)
        assert h0.grad is not None
        torch.testing.assert_close(h0.grad, expected, rtol=1e-12, atol=1e-12)

    def test_non_contiguous_inputs(self) -> None:
        device = kernel_device()
        log_coeffs, log_values = log_inputs((5, 33, 2), torch.float32, device)
        lc_t = log_coeffs.transpose(0, 2).contiguous().transpose(0, 2)
        lv_t = log_values.transpose(0, 2).contiguous().transpose(0, 2)
        assert not lc_t.is_contiguous() and not lv_t.is_contiguous()
        check_log_scan(lc_t, lv_t, "non-contiguous")
        h0 = signed_h0(5, 4, torch.float32, device)[:, ::2]
        check_recurrence(lc_t, log_values[:, 1:].transpose(0, 2).contiguous().transpose(0, 2), h0, "nc")

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_gradcheck_float64(self, strategy: str) -> None:
        device = kernel_device()
        shape = (1, 3, 2) if strategy == "sequential" else (1, 20, 2)
        log_coeffs, log_values = log_inputs(shape, torch.float64, device)
        h0 = signed_h0(shape[0], shape[2], torch.float64, device)
        h0[h0 == 0] = 0.5  # the derivative in h0 is continuous, but finite differences at 0 cross a kink
        args = [x.requires_grad_() for x in (log_coeffs, log_values, h0)]
        # Fast mode (one random projection of the Jacobian) on the tiled strategies: the full Jacobian of 40
        # outputs took 18-24 s a strategy under the interpreter; the sequential one keeps the full check.
        fast = strategy != "sequential"
        with force_strategy(strategy):
            assert torch.autograd.gradcheck(parallel_scan_log_fwd, tuple(args[:2]), fast_mode=fast)
            assert torch.autograd.gradcheck(
                log_recurrence_fwd, (args[0], args[1][:, 1:], args[2]), fast_mode=fast
            )

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_reverse_time(self, strategy: str) -> None:
        """REVERSE = 1 scans from t = T-1 down to 0: the forward scan of the time-flipped inputs, flipped."""
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 35, 3), torch.float64, device)
        log_b, h0 = log_values[:, 1:].contiguous(), signed_h0(2, 3, torch.float64, device)
        h = torch.empty_like(log_coeffs)
        grad = torch.randn_like(h)
        d_lc, d_lb, d_h0 = torch.empty_like(h), torch.empty_like(h), torch.zeros_like(h0)
        with force_strategy(strategy):
            log_kernels._scan_fwd(log_coeffs, log_b, h0, h, b_shift=0, lean=True, reverse=True)
            log_kernels._scan_bwd(log_coeffs, log_b, h0, h, grad, d_lc, d_lb, d_h0, b_shift=0, reverse=True)
        inputs = [
            x.flip(1).requires_grad_() if x.dim() == 3 else x.requires_grad_() for x in (log_coeffs, log_b)
        ]
        h0_ref = h0.clone().requires_grad_()
        ref = recurrence_ref(inputs[0], inputs[1], h0_ref)
        ref.backward(grad.flip(1))
        torch.testing.assert_close(h, ref.flip(1).detach(), rtol=1e-10, atol=1e-10)
        assert inputs[0].grad is not None and inputs[1].grad is not None
        torch.testing.assert_close(d_lc, inputs[0].grad.flip(1), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(d_lb, inputs[1].grad.flip(1), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(d_h0, h0_ref.grad, rtol=1e-10, atol=1e-10)

    @pytest.mark.parametrize(
        ("strategy", "block_t"),
        [("lookback", None), ("pipelined", None), ("pipelined", 4), ("split", None), ("split", 8)],
    )
    def test_recurrence_runs_k1_kernel(
        self, strategy: str, block_t: int | None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under force_strategy("lookback") or ("pipelined") log_recurrence_fwd, parallel_scan_log_fwd (log h0
        in slot 0 of its values: H0_SLOT) and their adjoints run that k = 1 kernel with exp(lc) as the
        coefficient, -inf inputs included (a log h0 of -inf among them); block_t = 4 gives the walk 18 tiles
        per row. Under "split" the two forwards run the split walk (off CUDA its tile is eight warps of 8
        steps, two tiles per row; block_t = 8 gives eight warps of one step, 9 tiles per row, the last
        partial) and the adjoints keep their own plan."""
        flags: list[dict[str, int]] = []
        runner = {"pipelined": "_run_pipelined", "split": "_run_split"}.get(strategy, "_run_lookback")
        original = getattr(linear, runner)

        def spy(plan: linear.ScanPlan, ptrs: dict[str, Tensor], **kw: int) -> Tensor | None:
            assert plan.strategy == strategy and plan.block_t == (block_t or plan.block_t)
            flags.append(kw)
            return original(plan, ptrs, **kw)

        monkeypatch.setattr(linear, runner, spy)
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 70, 5), torch.float32, device)
        log_coeffs[1, 30:33] = NEG_INF
        log_values[0, 40:, 2] = NEG_INF
        log_values[1, 0, 3] = NEG_INF
        h0 = signed_h0(2, 5, torch.float32, device)
        with force_strategy(strategy), linear.force_strategy(strategy, None, block_t):
            check_recurrence(log_coeffs, log_values[:, 1:], h0, f"{strategy} adjoint")
            check_log_scan(log_coeffs, log_values, f"{strategy}, log h0")
        seen = [(f.get("EXP_U", 0), f.get("LOG_GRADS", 0), f.get("H0_SLOT", 0)) for f in flags]
        if strategy == "split":
            assert seen == [(1, 0, 0), (1, 0, 1)]
        else:
            assert seen == [(1, 0, 0), (0, 1, 0), (1, 0, 1), (0, 1, 1)]

    def test_lookback_replay_is_bitwise(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A look-back of the single pass that replays summaries gives the log recurrence and its adjoint
        the same bits as one that does not."""
        flags: list[dict[str, int]] = []
        original = linear._run_lookback

        def spy(plan: linear.ScanPlan, ptrs: dict[str, Tensor], **kw: int) -> Tensor:
            flags.append(kw)
            return original(plan, ptrs, **kw)

        monkeypatch.setattr(linear, "_run_lookback", spy)
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 70, 5), torch.float32, device)
        log_coeffs[1, 30:33] = NEG_INF
        h0 = signed_h0(2, 5, torch.float32, device)
        # 2-step tiles (35 per row); with every 4th publishing its final state the walks replay summaries
        runs = []
        grad = torch.randn_like(log_coeffs)
        for every in (1, 4):
            with (
                _launch.sparse_final_states(every),
                force_strategy("lookback"),
                linear.force_strategy("lookback", None, 2),
            ):
                h = torch.empty_like(log_coeffs)
                outs = (torch.empty_like(h), torch.empty_like(h), torch.zeros_like(h0))
                log_kernels._scan_fwd(
                    log_coeffs, log_values[:, 1:], h0, h, b_shift=0, lean=True, reverse=False
                )
                log_kernels._scan_bwd(log_coeffs, log_values[:, 1:].contiguous(), h0, h, grad, *outs,
                                      b_shift=0, reverse=False)  # fmt: skip
                runs.append((h, *outs))
        assert len(flags) == 4
        for x, y in zip(*runs, strict=True):
            assert torch.equal(x, y)

    @pytest.mark.parametrize("strategy", ["lookback", "pipelined", "split"])
    def test_recurrence_forward_single_pass_falls_back(
        self, strategy: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The k = 1 kernels' forward of log_recurrence_fwd (and of parallel_scan_log_fwd) scans exp(lc),
        exp(lb) in linear space; one log coefficient > 0 anywhere raises its flag and the gated log kernel
        redoes the scan (same bits as the log kernel alone). Under force_log_space the k = 1 kernel does
        not run."""
        gates: list[Tensor] = []
        runner = {"pipelined": "_run_pipelined", "split": "_run_split"}.get(strategy, "_run_lookback")
        original = getattr(linear, runner)

        def spy(plan: linear.ScanPlan, ptrs: dict[str, Tensor], **kw: int) -> Tensor:
            gate = original(plan, ptrs, **kw)
            assert gate is not None
            gates.append(gate)
            return gate

        monkeypatch.setattr(linear, runner, spy)
        device = kernel_device()
        log_coeffs, log_values = log_inputs((2, 45, 3), torch.float32, device, seed=4)
        log_b, h0 = log_values[:, 1:], signed_h0(2, 3, torch.float32, device)
        with force_strategy("sequential"):
            log_only = log_recurrence_fwd(log_coeffs, log_b, h0)
        with force_strategy(strategy), linear.force_strategy(strategy, None, 4):
            single = log_recurrence_fwd(log_coeffs, log_b, h0)
            assert [int(g[-1].item()) for g in gates] == [0]
            assert not torch.equal(single, log_only)  # not the log kernel's bits: the single pass ran
            assert_close(single, recurrence_ref(log_coeffs.double(), log_b.double(), h0.double()),
                         torch.float32, 45, strategy)  # fmt: skip
            growing = log_coeffs.clone()
            growing[1, 38, 2] = 0.25
            fallback = log_recurrence_fwd(growing, log_b, h0)
            assert [int(g[-1].item()) for g in gates] == [0, 1]
            with force_log_space():
                log_recurrence_fwd(growing, log_b, h0)
            assert len(gates) == 2
        with force_strategy("sequential"):
            assert torch.equal(fallback, log_recurrence_fwd(growing, log_b, h0))
        assert_close(fallback, recurrence_ref(growing.double(), log_b.double(), h0.double()), torch.float32,
                     45, "fallback")  # fmt: skip
        # parallel_scan_log_fwd (log h0 in its values) takes the same kernel and the same fallback
        with force_strategy(strategy), linear.force_strategy(strategy, None, 4):
            values_single = parallel_scan_log_fwd(log_coeffs, log_values)
            values_fallback = parallel_scan_log_fwd(growing, log_values)
        assert [int(g[-1].item()) for g in gates] == [0, 1, 0, 1]
        with force_strategy("sequential"):
            assert not torch.equal(values_single, parallel_scan_log_fwd(log_coeffs, log_values))
            assert torch.equal(values_fallback, parallel_scan_log_fwd(growing, log_values))
        assert_close(values_single, parallel_scan_log_ref(log_coeffs.double(), log_values.double()),
                     torch.float32, 45, f"{strategy}, log h0")  # fmt: skip

    def test_unused_output_grad(self) -> None:
        log_coeffs, log_values = log_inputs((1, 3, 2), torch.float32, kernel_device())
        lc = log_coeffs.requires_grad_()
        h = parallel_scan_log_fwd(lc, log_values)
        (grad,) = torch.autograd.grad((h * 0).sum(), lc)
        assert torch.equal(grad, torch.zeros_like(grad))

    def test_bad_inputs_raise_with_names(self) -> None:
        log_coeffs, log_values = log_inputs((1, 4, 2), torch.float32, kernel_device())
        with pytest.raises(ValueError, match="log_values must have shape"):
            parallel_scan_log_fwd(log_coeffs, log_values[:, 1:])
        with pytest.raises(TypeError, match="log_values must have the same dtype"):
            parallel_scan_log_fwd(log_coeffs, log_values.double())
        with pytest.raises(ValueError, match="h0 must have shape"):
            log_recurrence_fwd(log_coeffs, log_values[:, 1:], log_coeffs[:, 0, :1])


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((64, 4096, 4096), "sequential"),
        ((4, 64, 64), "sequential"),
        ((1, 1, 1), "sequential"),
        ((1, 2**20, 64), "chunked"),
        ((2, 65536, 256), "chunked"),
        ((1, 100_000, 512), "chunked"),
        ((8, 100_000, 512), "sequential"),  # 512 narrow programs: 2 per SM on 132 SMs
    ],
    ids=lambda v: str(v),
)
def test_strategy_heuristic(shape: tuple[int, int, int], expected: str) -> None:
    assert log_kernels._strategy(*shape) == expected


def test_single_pass_adjoint_heuristic() -> None:
    """The adjoint of log_recurrence_fwd takes the k = 1 single-pass plan where that heuristic does
    (T >= 1024), and so does the forward from T = LOOKBACK_FORWARD_MIN_LENGTH (2048), or the split walk
    for enough chains of 64 channels (128; 2-byte types from 75)."""
    big = torch.empty((8, 16384, 1024), device="meta")
    plan = log_kernels._single_pass_plan(big, backward=True)
    assert plan is not None and (plan.strategy, plan.block_j, plan.block_t) == ("lookback", 128, 16)
    plan = log_kernels._single_pass_plan(big)  # off CUDA 64-step tiles: eight warps of 8 steps
    assert plan is not None
    assert (plan.strategy, plan.block_j, plan.block_t, plan.num_warps) == ("split", 64, 64, 8)
    # 2-byte types take the split walk from 9/16 of 132 = 74.25 chains, float32 from 7/8 = 115.5
    for rows, dtype, strategy in [
        (5, torch.bfloat16, "split"),  # 80 chains
        (4, torch.bfloat16, "lookback"),
        (5, torch.float16, "split"),
        (7, torch.float32, "lookback"),  # 112 chains
        (8, torch.float32, "split"),
    ]:
        lc = torch.empty((rows, 4096, 1024), dtype=dtype, device="meta")
        plan = log_kernels._single_pass_plan(lc)
        assert plan is not None and plan.strategy == strategy, (rows, dtype)
        plan = log_kernels._single_pass_plan(lc, backward=True)  # the adjoint keeps the single pass
        assert plan is not None and plan.strategy == "lookback", (rows, dtype)
    forward = log_kernels.LOOKBACK_FORWARD_MIN_LENGTH
    short = torch.empty((8, 1024, 1024), device="meta")
    assert log_kernels._single_pass_plan(short) is not None
    assert log_kernels._single_pass_plan(short, min_length=forward) is None  # the forward from T = 2048
    assert log_kernels._single_pass_plan(torch.empty((8, 2048, 1024), device="meta"), min_length=forward)
    assert log_kernels._single_pass_plan(torch.empty((8, 1023, 1024), device="meta")) is None  # short T
    few = log_kernels._single_pass_plan(torch.empty((1, 65536, 256), device="meta"))  # 8 chains of 32
    # off CUDA the tile has at most 64 steps (256 on CUDA from T = 65536)
    assert few is not None and (few.block_j, few.block_t, few.num_warps) == (32, 64, 4)
    assert log_kernels._single_pass_plan(torch.empty((1, 65536, 224), device="meta")) is None  # 7 chains
    with force_strategy("sequential"):
        assert log_kernels._single_pass_plan(big) is None
    with force_strategy("lookback"):
        assert log_kernels._single_pass_plan(torch.empty((1, 3, 2), device="meta")) is not None
        assert log_kernels._plan(1, 2**20, 64).strategy == "chunked"  # the forward keeps its own plan


def test_plan_tiles_and_chunks() -> None:
    plan = log_kernels._plan(1, 2**20, 64)
    assert (plan.block_d, plan.block_t, plan.num_warps) == (32, 64, 4)
    assert plan.n_chunks * plan.chunk >= 2**20 > (plan.n_chunks - 1) * plan.chunk
    assert plan.chunk % plan.block_t == 0 and 2 <= plan.n_chunks <= 256
    assert log_kernels._plan(3, 5, 7) == log_kernels._Plan("sequential", 256, 8, 1, 5, 1)
    # enough rows x channels: single-warp tiles of 2048 elements with 32-byte rows
    for itemsize, block_d in ((4, 8), (2, 16)):
        plan = log_kernels._plan(8, 16384, 1024, itemsize=itemsize)
        assert (plan.strategy, plan.block_d, plan.block_t, plan.num_warps) == (
            "sequential",
            block_d,
            2048 // block_d,
            1,
        )
    # The tile never follows T: a compiled graph with a dynamic T keeps one kernel configuration.
    assert {log_kernels._plan(3, t, 7).block_t for t in (1, 5, 100, 1000)} == {256}
    with force_strategy("chunked"):
        assert log_kernels._plan(1, 300, 3, max_block_t=16).n_chunks == 4
    with pytest.raises(ValueError, match="must be one of"), force_strategy("fast"):
        pass


def test_envelope() -> None:
    small = torch.empty(2, 3, 4)
    assert log_envelope(small, torch.empty(2, 4, 4)) is None
    huge = torch.empty(1, 1, 1).expand(1, 2**31, 1)
    assert log_envelope(huge, huge) == "T must be < 2^31 for the log-scan kernel, got T=2147483648"
    reason = log_envelope(torch.empty(2, 3), small)
    assert reason is not None and "3-dim" in reason


@pytest.mark.parametrize("op", ["log", "recurrence"])
def test_envelope_violation_raises_value_error(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the device check; nothing is launched
    huge = torch.empty(1, 1, 1).expand(1, 2**31, 1)
    with pytest.raises(ValueError, match="T must be < 2\\^31"):
        if op == "log":
            parallel_scan_log_fwd(huge, torch.empty(1, 1, 1).expand(1, 2**31 + 1, 1))
        else:
            log_recurrence_fwd(huge, huge, torch.empty(1, 1))


# ------------------------------------------------------------------------------------------------ CUDA


def _cuda_case(shape: tuple[int, int, int], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return log_inputs(shape, dtype, torch.device("cuda"))


CUDA_SHAPES = [
    (8, 4096, 512),
    (5, 4096, 1000),
    (4, 1000, 3001),
    (2, 65536, 256),
    pytest.param((1, 2**20, 64), marks=pytest.mark.gpu_memory),
    (64, 2048, 128),
]
"""(64, 2048, 128) and, for 2-byte types, (5, 4096, 1000) (80 chains of 64 channels, the last partly masked)
run the split walk forward; (8, 4096, 512) and the others the single pass or the log kernel's own plans.
The 2^20-step case is marked ``gpu_memory``: its float64 reference takes about a GiB, and beside 13 other
test processes on an 80 GB card it ran out of memory."""


class TestCuda:
    pytestmark = on_cuda

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("shape", CUDA_SHAPES, ids=shape_id)
    def test_log_scan(self, shape: tuple[int, int, int], dtype: torch.dtype) -> None:
        check_log_scan(*_cuda_case(shape, dtype), f"{shape} {dtype}")

    @pytest.mark.parametrize("shape", CUDA_SHAPES, ids=shape_id)
    def test_recurrence(self, shape: tuple[int, int, int]) -> None:
        log_coeffs, log_values = _cuda_case(shape, torch.float32)
        h0 = signed_h0(shape[0], shape[2], torch.float32, torch.device("cuda"))
        check_recurrence(log_coeffs, log_values[:, 1:], h0, f"{shape}")

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_both_strategies_agree_with_reference(self, strategy: str) -> None:
        h0 = signed_h0(3, 200, torch.float32, torch.device("cuda"))
        with force_strategy(strategy):
            check_log_scan(*_cuda_case((3, 20000, 200), torch.float32), strategy)
            for dtype in (torch.float32, torch.bfloat16):
                log_coeffs, log_values = _cuda_case((3, 20000, 200), dtype)
                check_recurrence(log_coeffs, log_values[:, 1:], h0.to(dtype), f"{strategy} {dtype}")

    def test_float32_relative_error_at_65536_steps(self) -> None:
        """Every state within SPEC's 1e-5 relative error of the float64 answer at T = 65536. This shape (16
        chains) takes the single pass; the log kernel, which ran it before, gave up to 1.07e-6 on an H200."""
        log_coeffs, log_values = _cuda_case((4, 65536, 128), torch.float32)
        h = parallel_scan_log_fwd(log_coeffs, log_values)
        ref = parallel_scan_log_ref(log_coeffs.double(), log_values.double())
        assert ((h.double() - ref).abs() / ref.abs()).max().item() <= 1e-5

    @pytest.mark.gpu_memory
    def test_single_pass_forward_at_65536_steps_and_its_fallback(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """At a size the heuristic gives the single pass (16 chains), log_recurrence_fwd stays within 1e-6
        relative of the float64 answer at T = 65536 (a positive h0, so no state crosses zero); with one log
        coefficient > 0 the gated log kernel redoes the scan and gives the bits of the log kernel's plan."""
        log_coeffs, log_values = _cuda_case((2, 65536, 1024), torch.float32)
        log_b = log_values[:, 1:]
        h0 = signed_h0(2, 1024, torch.float32, torch.device("cuda")).abs() + 0.1
        assert log_kernels._single_pass_plan(log_coeffs) is not None
        h = log_recurrence_fwd(log_coeffs, log_b, h0)
        ref = recurrence_ref(log_coeffs.double(), log_b.double(), h0.double())
        assert ((h.double() - ref).abs() / ref.abs()).max().item() <= 1e-6
        growing = log_coeffs.clone()
        growing[1, 50000, 700] = 0.1
        got = log_recurrence_fwd(growing, log_b, h0)
        monkeypatch.setattr(log_kernels, "_single_pass_plan", lambda lc, min_length=0, backward=False: None)
        assert torch.equal(got, log_recurrence_fwd(growing, log_b, h0))

    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_gradcheck_float64(self, strategy: str) -> None:
        shape = (2, 7, 3) if strategy == "sequential" else (1, 600, 2)
        log_coeffs, log_values = _cuda_case(shape, torch.float64)
        h0 = signed_h0(shape[0], shape[2], torch.float64, torch.device("cuda"))
        h0[h0 == 0] = 0.5
        args = [x.requires_grad_() for x in (log_coeffs, log_values, h0)]
        fast = strategy != "sequential"
        with force_strategy(strategy):
            assert torch.autograd.gradcheck(parallel_scan_log_fwd, tuple(args[:2]), fast_mode=fast)
            assert torch.autograd.gradcheck(
                log_recurrence_fwd, (args[0], args[1][:, 1:], args[2]), fast_mode=fast
            )

    @pytest.mark.slow
    @pytest.mark.gpu_memory
    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_more_than_2_31_elements(self, strategy: str) -> None:
        """B * T * D > 2^31 (bf16): check channels at the end of each row, whose offsets pass 2^31."""
        batch, steps, width = 2, 2**19 + 3, 2100
        assert batch * steps * width > 2**31
        gen = torch.Generator(device="cuda").manual_seed(0)
        log_coeffs = torch.empty((batch, steps, width), device="cuda", dtype=torch.bfloat16)
        log_values = torch.empty((batch, steps + 1, width), device="cuda", dtype=torch.bfloat16)
        log_coeffs.uniform_(-0.7, -0.01, generator=gen)
        log_values.normal_(-1.0, 1.0, generator=gen)
        lc = log_coeffs.requires_grad_()
        lv = log_values.requires_grad_()
        with force_strategy(strategy):
            h = parallel_scan_log_fwd(lc, lv)
            grad = torch.ones_like(h)
            d_lc, d_lv = torch.autograd.grad(h, (lc, lv), grad)
        cols = torch.tensor([0, width - 3, width - 1], device="cuda")

        def pick(x: Tensor) -> Tensor:
            return x.detach().index_select(2, cols).double()

        lc64, lv64 = pick(log_coeffs).requires_grad_(), pick(log_values).requires_grad_()
        ref = parallel_scan_log_ref(lc64, lv64)
        ref_d_lc, ref_d_lv = torch.autograd.grad(ref, (lc64, lv64), torch.ones_like(ref))
        assert_close(pick(h), ref, torch.bfloat16, steps, "h")
        assert_close(pick(d_lc), ref_d_lc, torch.bfloat16, steps, "d_log_coeffs")
        assert_close(pick(d_lv), ref_d_lv, torch.bfloat16, steps, "d_log_values")
