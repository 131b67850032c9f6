"""Compile a callable with no graph break, and check that it computes what eager PyTorch computes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_map

from mingru_compile._report import CompileReport, _clear_counters, _Recorder, _reset_dynamo

Backend = Literal["eager", "aot_eager", "inductor"]
BACKENDS: tuple[str, ...] = ("eager", "aot_eager", "inductor")

F = TypeVar("F", bound=Callable[..., Any])


def compile_fullgraph(fn: F, *, backend: Backend = "aot_eager", dynamic: bool | None = None) -> F:
    """``torch.compile(fn, fullgraph=True, backend=backend)``: any graph break raises when it is called.

    Args:
        fn: a function or ``nn.Module``.
        backend: ``"eager"`` (Dynamo capture only), ``"aot_eager"`` (also traces the backward with
            AOTAutograd) or ``"inductor"`` (generates code; needs a C++ compiler on CPU).
        dynamic: passed to ``torch.compile``.

    Raises:
        ValueError: ``backend`` is not one of the three above.
    """
    if backend not in BACKENDS:
        raise ValueError(f"compile_fullgraph: backend must be one of {BACKENDS}; got {backend!r}")
    compiled: F = torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)  # type: ignore[assignment]
    return compiled


def assert_compiles_like_eager(
    fn: Callable[..., Any],
    *args: Any,
    kwargs: Mapping[str, Any] | None = None,
    backend: Backend = "aot_eager",
    rtol: float | None = None,
    atol: float | None = None,
    check_grad: bool = True,
    dynamic: bool | None = None,
) -> CompileReport:
    """Run ``fn`` eagerly and compiled with ``fullgraph=True``; compare outputs and gradients.

    Each run gets its own detached copies of the tensor arguments (``requires_grad`` kept). With
    ``check_grad`` the loss ``sum_i <out_i, w_i>`` over the floating outputs (fixed random weights
    ``w_i``, the same for both runs) is differentiated with respect to every argument that requires
    grad and, when ``fn`` is an ``nn.Module``, every trainable parameter; the gradients are compared.
    Dynamo's caches are reset first, so each call compiles afresh.

    Args:
        fn: function or module to check.
        *args: its positional arguments.
        kwargs: its keyword arguments.
        backend: see :func:`compile_fullgraph`.
        rtol, atol: tolerances, both or neither (neither: the per-dtype defaults of
            ``torch.testing.assert_close``).
        check_grad: also compare gradients.
        dynamic: passed to ``torch.compile``.

    Returns:
        A :class:`~mingru_compile.CompileReport` of the compiled run (graphs, breaks, the captured graphs);
        ``grads`` holds the compiled gradients when they were compared.

    Raises:
        AssertionError: outputs differ in structure, dtype, device, shape or value (beyond the
            tolerances), or gradients differ; the message names the output or input and how much.
        ValueError: only one of ``rtol``/``atol``; ``check_grad`` with no input requiring grad or no
            output requiring grad.
        torch._dynamo.exc.Unsupported: ``fn`` has a graph break.
    """
    if (rtol is None) != (atol is None):
        raise ValueError(
            f"assert_compiles_like_eager: give both rtol and atol or neither; got {rtol=}, {atol=}"
        )
    if backend not in BACKENDS:
        raise ValueError(f"assert_compiles_like_eager: backend must be one of {BACKENDS}; got {backend!r}")
    call_kwargs = dict(kwargs or {})
    _reset_dynamo()
    eager_inputs = _detached_copies((args, call_kwargs))
    compiled_inputs = _detached_copies((args, call_kwargs))
    eager_out = fn(*eager_inputs[0], **eager_inputs[1])
    recorder = _Recorder(backend)
    try:
        compiled_out = torch.compile(fn, fullgraph=True, backend=recorder, dynamic=dynamic)(
            *compiled_inputs[0], **compiled_inputs[1]
        )
        report = recorder.report([compiled_out], [])
    finally:
        _clear_counters()

    _, eager_spec = tree_flatten(eager_out)
    _, compiled_spec = tree_flatten(compiled_out)
    if eager_spec != compiled_spec:
        raise AssertionError(
            f"compiled ({backend}) output structure differs from eager: "
            f"eager {eager_spec}, compiled {compiled_spec}"
        )
    eager_leaves = tree_flatten_with_path(eager_out)[0]
    compiled_leaves = [leaf for _, leaf in tree_flatten_with_path(compiled_out)[0]]
    for (path, expected), actual in zip(eager_leaves, compiled_leaves, strict=True):
        _assert_leaf_close(f"output{keystr(path)}", actual, expected, backend, rtol, atol)

    if not check_grad:
        return report
    eager_wrt = _grad_inputs(eager_inputs, fn)
    compiled_wrt = _grad_inputs(compiled_inputs, fn)
    if not eager_wrt:
        raise ValueError(
            "assert_compiles_like_eager: check_grad=True needs a tensor argument with requires_grad=True "
            "or a module with trainable parameters; got none (pass check_grad=False to compare outputs only)"
        )
    eager_loss = _weighted_loss(eager_out)
    compiled_loss = _weighted_loss(compiled_out)
    if eager_loss is None or compiled_loss is None:
        raise ValueError(
            "assert_compiles_like_eager: check_grad=True but no output requires grad; got outputs "
            f"{[type(leaf).__name__ for _, leaf in eager_leaves]}"
        )
    eager_grads = torch.autograd.grad(eager_loss, [t for _, t in eager_wrt], allow_unused=True)
    compiled_grads = torch.autograd.grad(compiled_loss, [t for _, t in compiled_wrt], allow_unused=True)
    for (name, _), expected_grad, actual_grad in zip(eager_wrt, eager_grads, compiled_grads, strict=True):
        where = f"gradient of {name}"
        if (expected_grad is None) != (actual_grad is None):
            raise AssertionError(
                f"{where}: eager gives {_describe(expected_grad)}, "
                f"compiled ({backend}) gives {_describe(actual_grad)}"
            )
        if expected_grad is not None:
            _assert_leaf_close(where, actual_grad, expected_grad, backend, rtol, atol)
    report.grads.append(tuple(compiled_grads))
    return report


def _detached_copies(tree: Any) -> Any:
    """Copy every tensor in ``tree`` (detached, same ``requires_grad``); other leaves are shared."""

    def copy(leaf: Any) -> Any:
        if isinstance(leaf, Tensor):
            return leaf.detach().clone().requires_grad_(leaf.requires_grad)
        return leaf

    return tree_map(copy, tree)


def _grad_inputs(
    inputs: tuple[Sequence[Any], Mapping[str, Any]], fn: Callable[..., Any]
) -> list[tuple[str, Tensor]]:
    """(name, tensor) of every argument that requires grad, then of every trainable module parameter."""
    named: list[tuple[str, Tensor]] = []
    args, kwargs = inputs
    for i, arg in enumerate(args):
        if isinstance(arg, Tensor) and arg.requires_grad:
            named.append((f"args[{i}]", arg))
    for key, value in kwargs.items():
        if isinstance(value, Tensor) and value.requires_grad:
            named.append((f"kwargs[{key!r}]", value))
    if isinstance(fn, nn.Module):
        named.extend((f"parameter {name}", p) for name, p in fn.named_parameters() if p.requires_grad)
    return named


def _weighted_loss(out: Any) -> Tensor | None:
    """``sum_i <out_i, w_i>`` over floating outputs that require grad, with weights fixed by a seed."""
    generator = torch.Generator().manual_seed(0)
    loss: Tensor | None = None
    for leaf in tree_flatten(out)[0]:
        if isinstance(leaf, Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            weight = torch.randn(leaf.shape, generator=generator, dtype=torch.float64).to(leaf)
            term = (leaf * weight).sum()
            loss = term if loss is None else loss + term
    return loss


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}, dtype {value.dtype}, device {value.device}"
    return "no gradient (unused input)" if value is None else repr(value)


def _assert_leaf_close(
    where: str, actual: Any, expected: Any, backend: str, rtol: float | None, atol: float | None
) -> None:
    if not isinstance(expected, Tensor):
        if actual != expected:
            raise AssertionError(f"{where}: eager gives {expected!r}, compiled ({backend}) gives {actual!r}")
        return
    if not isinstance(actual, Tensor):
        raise AssertionError(
            f"{where}: eager gives {_describe(expected)}, compiled ({backend}) gives {actual!r}"
        )
    torch.testing.assert_close(
        actual.detach(),
        expected.detach(),
        rtol=rtol,
        atol=atol,
        msg=lambda detail: f"{where}: compiled ({backend}) differs from eager.\n{detail}",
    )
