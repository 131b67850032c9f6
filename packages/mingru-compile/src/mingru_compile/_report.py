"""Compile a callable, run it, and report what Dynamo did: graph count, graph breaks, recompiles, graphs.

A recording backend wraps the requested one (``eager``, ``aot_eager`` or ``inductor``): every graph Dynamo
hands over is kept, and with ``aot_eager`` the forward and backward graphs of AOTAutograd too, so a test can
ask which operators a compiled graph calls (for example whether a ``torch.ops.mingru`` kernel op is inside).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx

Call = tuple[Sequence[Any], Mapping[str, Any]]
"""One call of the compiled callable: ``(args, kwargs)``."""


def target_name(target: Any) -> str:
    """A readable name of an FX ``call_function`` target: ``"mingru::linear_scan_fwd"`` for a library op
    (overload or packet), else the function's qualified name."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return str(schema.name)
    qualified = getattr(target, "_qualified_op_name", None)
    if isinstance(qualified, str):
        return qualified
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", None) or (
        "torch" if getattr(torch, str(name), None) is target else None
    )
    if isinstance(name, str):
        return f"{module}.{name}" if isinstance(module, str) else name
    return str(target)


def _graph_targets(graphs: Iterable[fx.GraphModule]) -> collections.Counter[str]:
    """Operator counts over the graphs and the subgraphs they hold (the bodies of higher-order ops such as
    ``torch.utils.checkpoint`` regions and autograd Functions, which Dynamo keeps as submodules)."""
    counts: collections.Counter[str] = collections.Counter()
    for gm in graphs:
        for module in gm.modules():
            if not isinstance(module, fx.GraphModule):
                continue
            for node in module.graph.nodes:
                if node.op == "call_function":
                    counts[target_name(node.target)] += 1
    return counts


@dataclass
class CompileReport:
    """What compiling and running a callable did.

    Attributes:
        backend: the backend the graphs went to.
        graphs: graphs Dynamo compiled over all calls (a full graph compiled once: 1).
        graph_breaks: graph breaks Dynamo counted (always 0 with ``fullgraph=True``, where a break raises).
        break_reasons: why, one line per distinct break.
        recompiles: graphs compiled by the calls after the first (a new shape or value that failed a guard).
        recompile_reasons: the guard failures that caused them.
        outputs: what each call returned.
        grads: with ``backward=True``, per call the gradients of the inputs that require grad (then of a
            module's parameters), in that order; None for an unused one.
        dynamo_graphs: the graphs Dynamo captured.
        forward_graphs, backward_graphs: AOTAutograd's graphs (backend ``aot_eager`` only).
    """

    backend: str
    graphs: int
    graph_breaks: int
    break_reasons: tuple[str, ...]
    recompiles: int
    recompile_reasons: tuple[str, ...]
    outputs: list[Any] = field(repr=False)
    grads: list[tuple[Tensor | None, ...]] = field(repr=False)
    dynamo_graphs: list[fx.GraphModule] = field(repr=False)
    forward_graphs: list[fx.GraphModule] = field(repr=False)
    backward_graphs: list[fx.GraphModule] = field(repr=False)

    def targets(self, which: str = "dynamo") -> collections.Counter[str]:
        """How often each operator is called in the ``which`` graphs ("dynamo", "forward" or "backward"),
        their nested subgraphs included."""
        graphs = {
            "dynamo": self.dynamo_graphs,
            "forward": self.forward_graphs,
            "backward": self.backward_graphs,
        }
        if which not in graphs:
            raise ValueError(f"which must be one of {sorted(graphs)}, got {which!r}")
        return _graph_targets(graphs[which])

    def custom_ops(self, namespace: str = "mingru", which: str = "dynamo") -> set[str]:
        """The ``namespace::name`` operators called in the ``which`` graphs."""
        return {name for name in self.targets(which) if name.startswith(f"{namespace}::")}

    def kernel_launches(self, which: str = "forward") -> int:
        """User Triton kernel launches (``triton_kernel_wrapper_*`` nodes) in the ``which`` graphs.

        AOTAutograd decomposes a ``torch.library.triton_op`` into the launches of its kernels, so its forward
        and backward graphs hold these nodes where Dynamo's graph holds the op itself.
        """
        return sum(n for name, n in self.targets(which).items() if "triton_kernel_wrapper" in name)

    def summary(self) -> str:
        """One line: graphs, breaks and recompiles (and the reasons, when there are any)."""
        line = f"{self.graphs} graph(s), {self.graph_breaks} break(s), {self.recompiles} recompile(s)"
        reasons = [
            reason.strip().splitlines()[0] for reason in (*self.break_reasons, *self.recompile_reasons)
        ]
        return line + (": " + "; ".join(reasons) if reasons else "")


class _Recorder:
    """A Dynamo backend that keeps every graph it is given, then compiles it with the chosen backend."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.dynamo: list[fx.GraphModule] = []
        self.forward: list[fx.GraphModule] = []
        self.backward: list[fx.GraphModule] = []
        self._inner = self._make_inner(backend)

    def _make_inner(self, backend: str) -> Callable[..., Any]:
        if backend != "aot_eager":
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend(backend)
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        def keep(store: list[fx.GraphModule]) -> Callable[..., Any]:
            def compiler(gm: fx.GraphModule, example_inputs: Any) -> Any:
                store.append(gm)
                return boxed_nop(gm, example_inputs)

            return compiler

        return aot_autograd(
            fw_compiler=keep(self.forward),
            bw_compiler=keep(self.backward),
            inference_compiler=keep(self.forward),
        )

    def __call__(self, gm: fx.GraphModule, example_inputs: Any) -> Any:
        self.dynamo.append(gm)
        return self._inner(gm, example_inputs)

    def report(
        self, outputs: list[Any], grads: list[tuple[Tensor | None, ...]], first_graphs: int | None = None
    ) -> CompileReport:
        """The report from Dynamo's counters now; ``first_graphs``: graphs compiled by the first call (None:
        there was one call)."""
        from torch._dynamo.utils import counters, guard_failures

        # A graph whose analysis Dynamo restarted (e.g. after turning Python floats into tensors) reached
        # the backend and was then discarded, its nodes erased: only the graphs still alive are counted.
        self.dynamo[:] = [gm for gm in self.dynamo if len(gm.graph.nodes) > 0]
        breaks = counters["graph_break"]
        return CompileReport(
            backend=self.backend,
            graphs=len(self.dynamo),
            graph_breaks=sum(breaks.values()),
            break_reasons=tuple(str(reason) for reason in breaks),
            recompiles=0 if first_graphs is None else len(self.dynamo) - first_graphs,
            recompile_reasons=tuple(str(r) for reasons in guard_failures.values() for r in reasons),
            outputs=outputs,
            grads=grads,
            dynamo_graphs=self.dynamo,
            forward_graphs=self.forward,
            backward_graphs=self.backward,
        )


def _clear_counters() -> None:
    from torch._dynamo.utils import counters, guard_failures

    counters.clear()
    guard_failures.clear()


def _reset_dynamo() -> None:
    """Empty Dynamo's caches and counters."""
    torch._dynamo.reset()
    _clear_counters()


def compile_and_report(
    fn: Callable[..., Any],
    *args: Any,
    kwargs: Mapping[str, Any] | None = None,
    backend: str = "aot_eager",
    fullgraph: bool = True,
    dynamic: bool | None = None,
    backward: bool = False,
    calls: Iterable[Call] = (),
) -> CompileReport:
    """Compile ``fn`` (``fullgraph=True`` by default), call it, and report graphs, breaks and recompiles.

    Dynamo's caches and counters are reset before the first call and its counters again at the end, so the
    numbers are this call's alone. The first call gets ``args``/``kwargs``; each of ``calls`` (``(args,
    kwargs)`` pairs, for instance inputs of another sequence length) follows with the same compiled callable:
    every graph compiled by those is a recompilation.

    Args:
        fn: function or ``nn.Module``.
        backend: "eager", "aot_eager" (also keeps AOTAutograd's forward and backward graphs) or "inductor".
        fullgraph: passed to ``torch.compile`` (with True a graph break raises).
        dynamic: passed to ``torch.compile``.
        backward: after each call, differentiate ``sum_i <out_i, w_i>`` over the floating outputs that require
            grad (fixed random ``w_i``) with respect to the inputs that require grad and a module's
            parameters (this also compiles the backward graph).
        calls: further calls after the first.

    Raises:
        ValueError: an unknown backend, or ``backward`` with no output that requires grad.
        torch._dynamo.exc.Unsupported: a graph break under ``fullgraph=True``.
    """
    from mingru_compile._compile import BACKENDS, _grad_inputs, _weighted_loss

    if backend not in BACKENDS:
        raise ValueError(f"compile_and_report: backend must be one of {BACKENDS}; got {backend!r}")
    _reset_dynamo()
    recorder = _Recorder(backend)
    compiled = torch.compile(fn, fullgraph=fullgraph, backend=recorder, dynamic=dynamic)
    outputs: list[Any] = []
    grads: list[tuple[Tensor | None, ...]] = []
    first_graphs = 0
    try:
        for index, (call_args, call_kwargs) in enumerate([(args, kwargs or {}), *calls]):
            out = compiled(*call_args, **call_kwargs)
            outputs.append(out)
            if backward:
                grads.append(_gradients(out, _grad_inputs((call_args, call_kwargs), fn), _weighted_loss))
            if index == 0:
                first_graphs = sum(len(gm.graph.nodes) > 0 for gm in recorder.dynamo)
        return recorder.report(outputs, grads, first_graphs)
    finally:
        _clear_counters()


def _gradients(
    out: Any, wrt: list[tuple[str, Tensor]], weighted_loss: Callable[[Any], Tensor | None]
) -> tuple[Tensor | None, ...]:
    loss = weighted_loss(out)
    if loss is None:
        raise ValueError("compile_and_report: backward=True but no output requires grad")
    if not wrt:
        loss.backward()  # still compiles and runs the backward graph
        return ()
    return tuple(torch.autograd.grad(loss, [t for _, t in wrt], allow_unused=True))
