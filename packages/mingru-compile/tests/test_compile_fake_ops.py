"""The fake-tensor contract of every ``torch.ops.mingru`` op, checked without running a kernel.

The ops are called directly (the dispatch would pick the references here). What works on a CPU-only build:

- ``FakeTensorMode`` with fake CUDA tensors: each op's Python body runs on fake tensors and its launches go
  through ``wrap_triton``, whose fake implementation allocates nothing and launches nothing.
- ``make_fx(tracing_mode="fake")`` on those fake CUDA tensors: one graph node per op.
- The registered autograd formula (``setup_context`` + ``backward`` of the op), called as a function on fake
  CUDA tensors and traced by ``make_fx``: the backward op appears and the gradients have the inputs' specs.

What does not, and why:

- Autograd proper on fake CUDA tensors (``requires_grad`` inputs, ``torch.autograd.grad``) needs a CUDA
  runtime: the autograd engine records each input's device stream when it builds the graph, and asking for
  a CUDA stream terminates the process (C++ ``std::terminate``, not a Python exception) on a CPU-only build
  ("PyTorch is not linked with support for cuda devices") and on a CUDA build without a driver. Those tests
  run only where ``torch.cuda.is_available()``.
- Fake CPU tensors: the ops take CPU tensors only under ``TRITON_INTERPRET=1`` and reject them otherwise,
  fake or not (the same ValueError); under the interpreter, ``wrap_triton`` hands fake tensors to the
  interpreter, which reads their data pointers and fails.
- Meta tensors: rejected like CPU tensors (the ops have no meta kernel; fake CUDA tensors are the way).
- Non-contiguous fake CUDA inputs without a CUDA runtime: the op's ``.contiguous()`` copy sets a CUDA device
  guard, which raises "PyTorch is not linked with support for cuda devices"; those samples are skipped there.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_map

import mingru_triton
from mingru_triton.samples import BACKWARD_OPS, FORWARD_OPS, OP_NAMES, OUTPUT_LIKE, output_like, sample_inputs

pytestmark = pytest.mark.compile
CUDA_RUNTIME = torch.cuda.is_available()
SAMPLE_IDS = [(name, i) for name in OP_NAMES for i in range(len(sample_inputs(name, "cpu")))]


def _op(name: str) -> Any:
    return getattr(torch.ops.mingru, name).default


def _fake_cuda(mode: FakeTensorMode, args: tuple[Any, ...], requires_grad: bool = False) -> tuple[Any, ...]:
    """Fake CUDA copies of the tensors of ``args`` (same shapes, strides and dtypes)."""

    def copy(leaf: Any) -> Any:
        if not isinstance(leaf, Tensor):
            return leaf
        with mode:
            fake = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype, device="cuda")
        return fake.requires_grad_(requires_grad and leaf.requires_grad)

    return tree_map(copy, args)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return torch.empty(shape, device="meta").stride()


def _assert_like(name: str, outputs: Any, args: tuple[Any, ...]) -> None:
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    assert len(outs) == len(OUTPUT_LIKE[name]), (name, len(outs))
    for i, (out, (shape, dtype, _)) in enumerate(zip(outs, output_like(name, args), strict=True)):
        got = (tuple(out.shape), out.dtype, out.device.type, out.stride())
        want = (shape, dtype, "cuda", _contiguous_strides(shape))
        assert got == want, f"{name} output {i}: (shape, dtype, device, stride) {got}, expected {want}"


def test_every_op_has_samples_and_a_contract() -> None:
    registered = {name for name in dir(torch.ops.mingru) if not name.startswith("_") and name != "name"}
    assert registered == set(OP_NAMES)
    assert {*FORWARD_OPS, *BACKWARD_OPS} == set(OP_NAMES)
    assert {name.removesuffix("_fwd") for name in FORWARD_OPS} == {
        name.removesuffix("_bwd") for name in BACKWARD_OPS
    }
    for name in OP_NAMES:
        assert getattr(mingru_triton, name)._name == name  # the public objects are the registered ops


def test_samples_reject_unknown_ops_and_integer_dtypes() -> None:
    with pytest.raises(ValueError, match="unknown mingru op 'cumsum'"):
        sample_inputs("cumsum", "cpu")
    with pytest.raises(ValueError, match="floating dtype"):
        sample_inputs("linear_scan_fwd", "cpu", torch.int32)


def _skip_copies_without_cuda(args: tuple[Any, ...]) -> None:
    if not CUDA_RUNTIME and any(isinstance(a, Tensor) and not a.is_contiguous() for a in args):
        pytest.skip("a non-contiguous fake CUDA input is copied under a CUDA device guard, which needs CUDA")


@pytest.mark.parametrize(("name", "index"), SAMPLE_IDS, ids=[f"{n}-{i}" for n, i in SAMPLE_IDS])
def test_op_outputs_on_fake_cuda_tensors(name: str, index: int) -> None:
    args, kwargs = sample_inputs(name, "cpu")[index]
    _skip_copies_without_cuda(args)
    mode = FakeTensorMode()
    fake_args = _fake_cuda(mode, args)
    with mode:
        out = _op(name)(*fake_args, **kwargs)
    _assert_like(name, out, fake_args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_op_output_dtype_follows_the_input_on_fake_cuda(name: str, dtype: torch.dtype) -> None:
    args, kwargs = sample_inputs(name, "cpu", dtype)[0]
    mode = FakeTensorMode()
    fake_args = _fake_cuda(mode, args)
    with mode:
        out = _op(name)(*fake_args, **kwargs)
    _assert_like(name, out, fake_args)


def test_op_on_fake_cuda_tensors_beyond_memory() -> None:
    mode = FakeTensorMode()
    with mode:
        a = torch.empty(4, 2**20, 1024, device="cuda", dtype=torch.bfloat16)  # 8 GiB if it were real
        A, Bc = _op("linear_scan_fwd")(a, a)
    assert A.shape == Bc.shape == (4, 2**20, 1024)


def test_single_pass_recurrence_on_fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """At sizes where the k = 1 recurrence and its adjoint take the pipelined walk or the single-pass kernel
    (status buffers allocated inside the op), the log scans (both forms) the split walk and their adjoints
    the single pass, the ops keep their contract on fake CUDA tensors and trace as one node."""
    from mingru_triton import linear

    plans: list[str] = []

    def spy(original: Any) -> Any:
        def run(plan: Any, *args: Any, **kwargs: Any) -> Any:
            plans.append(plan.strategy)
            return original(plan, *args, **kwargs)

        return run

    monkeypatch.setattr(linear, "_run_lookback", spy(linear._run_lookback))
    monkeypatch.setattr(linear, "_run_pipelined", spy(linear._run_pipelined))
    monkeypatch.setattr(linear, "_run_split", spy(linear._run_split))
    mode = FakeTensorMode()
    with mode:
        a = torch.empty(8, 4096, 1024, device="cuda")
        h0 = torch.empty(8, 1024, device="cuda")
        h = _op("linear_recurrence_fwd")(a, a, h0)
        da, db, dh0 = _op("linear_recurrence_bwd")(a, h0, h, h)
        few = torch.empty(3, 4096, 1024, device="cuda")  # 48 chains of 64 channels: the single pass
        h0_few = torch.empty(3, 1024, device="cuda")
        h_few = _op("linear_recurrence_fwd")(few, few, h0_few)
        grads_few = _op("linear_recurrence_bwd")(few, h0_few, h_few, h_few)
        d_lc, d_lb, d_h0 = _op("log_recurrence_bwd")(a, a, h0, h, h)
        long = torch.empty(8, 16384, 1024, device="cuda")
        h_log = _op("log_recurrence_fwd")(long, long, h0)
        log_values = torch.empty(8, 4097, 1024, device="cuda")  # log h0 in slot 0
        h_values = _op("parallel_scan_log_fwd")(a, log_values)
        d_values = _op("parallel_scan_log_bwd")(a, log_values, h_values, h_values)
    assert plans == ["pipelined"] * 2 + ["lookback"] * 3 + ["split"] * 2 + ["lookback"]
    assert h_values.shape == d_values[0].shape == (8, 4096, 1024) and d_values[1].shape == (8, 4097, 1024)
    assert h.shape == da.shape == db.shape == d_lc.shape == d_lb.shape == (8, 4096, 1024)
    assert [g.shape for g in grads_few] == [few.shape, few.shape, (3, 1024)] and h_few.shape == few.shape
    assert h_log.shape == (8, 16384, 1024)
    assert dh0.shape == d_h0.shape == (8, 1024)
    op = _op("linear_recurrence_fwd")
    graph = make_fx(lambda x, y, s: op(x, y, s), tracing_mode="fake")(a, a, h0)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and n.target is op]
    assert len(calls) == 1, graph.code


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_make_fx_traces_each_op_as_one_node(name: str) -> None:
    args, kwargs = sample_inputs(name, "cpu")[0]
    mode = FakeTensorMode()
    fake_args = _fake_cuda(mode, args)
    graph = make_fx(lambda *a: _op(name)(*a, **kwargs), tracing_mode="fake")(*fake_args)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and n.target is _op(name)]
    assert len(calls) == 1, graph.code
    value = calls[0].meta["val"]
    _assert_like(name, tuple(value) if isinstance(value, (list, tuple)) else value, fake_args)
    assert "triton_kernel_wrapper" not in graph.code  # the op stays opaque: no kernel in the traced graph


class _Ctx:
    """Enough of an autograd ctx for the ops' setup_context / backward functions."""

    needs_input_grad: tuple[bool, ...] = ()

    def save_for_backward(self, *tensors: Tensor) -> None:
        self.saved_tensors = tensors

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _formula_grads(name: str, *args: Any) -> tuple[Any, ...]:
    """The registered autograd formula of op ``name``, run as plain code: setup_context, then backward with
    ones as the output grads."""
    definition = getattr(mingru_triton, name)
    out = _op(name)(*args)
    ctx = _Ctx()
    definition._setup_context_fn(ctx, args, out)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(definition._backward_fn(ctx, *(torch.ones_like(o) for o in outs)))


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_registered_autograd_formula_traces_on_fake_cuda(name: str) -> None:
    args, _ = sample_inputs(name, "cpu")[0]
    mode = FakeTensorMode()
    fake_args = _fake_cuda(mode, args)
    graph = make_fx(lambda *a: _formula_grads(name, *a), tracing_mode="fake")(*fake_args)
    backward = _op(name.replace("_fwd", "_bwd"))
    assert sum(n.target is backward for n in graph.graph.nodes if n.op == "call_function") == 1, graph.code
    with mode:
        grads = _formula_grads(name, *fake_args)
    for i, (arg, grad) in enumerate(zip(fake_args, grads, strict=False)):
        if isinstance(arg, Tensor) and arg.is_floating_point() and grad is not None:
            assert (grad.shape, grad.dtype, grad.device) == (arg.shape, arg.dtype, arg.device), (name, i)


@pytest.mark.skipif(not CUDA_RUNTIME, reason="autograd on fake CUDA tensors aborts the process without CUDA")
@pytest.mark.parametrize("name", FORWARD_OPS)
def test_autograd_through_the_op_traces_on_fake_cuda(name: str) -> None:
    args, kwargs = sample_inputs(name, "cpu")[0]
    mode = FakeTensorMode()
    fake_args = _fake_cuda(mode, args, requires_grad=True)
    wrt = [i for i, a in enumerate(fake_args) if isinstance(a, Tensor) and a.requires_grad]

    def grads(*a: Any) -> tuple[Tensor, ...]:
        out = _op(name)(*a, **kwargs)
        loss = sum(o.sum() for o in tree_flatten(out)[0])
        return torch.autograd.grad(loss, [a[i] for i in wrt])  # type: ignore[arg-type]

    graph = make_fx(grads, tracing_mode="fake")(*fake_args)
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert _op(name) in targets and _op(name.replace("_fwd", "_bwd")) in targets, graph.code


def test_fake_cpu_and_meta_tensors_are_rejected_like_real_cpu_tensors() -> None:
    args, _ = sample_inputs("linear_scan_fwd", "cpu")[0]
    message = r"a must be a CUDA tensor \(or a CPU tensor under TRITON_INTERPRET=1\), got device"
    with pytest.raises(ValueError, match=message + " cpu"):
        _op("linear_scan_fwd")(*args)
    with FakeTensorMode(), pytest.raises(ValueError, match=message + " cpu"):
        _op("linear_scan_fwd")(torch.empty(2, 3, 4), torch.empty(2, 3, 4))
    with pytest.raises(ValueError, match=message + " meta"):
        _op("linear_scan_fwd")(torch.empty(2, 3, 4, device="meta"), torch.empty(2, 3, 4, device="meta"))
