"""Kernel time of each k = 1 strategy, the ops called directly (no autograd).

Two ops (``--ops``): "recurrence", the layers' ``linear_recurrence_fwd`` / ``_bwd``, and "scan", the seed
contract's ``linear_scan_fwd`` / ``_bwd`` (which also write and read the running product A). For each op,
shape and dtype, forward and backward are timed with every strategy that serves the op forced (``pipelined``,
``lookback`` and ``segment`` (the recurrence only), ``sequential``, ``chunked``) and with the heuristic's own
choice ("plan"): the median of ``triton.testing.do_bench``, and "x floor", that time over the time a device
copy of the bytes the op must move takes (recurrence forward: read a, b, write h; backward: read a, h, dh,
write da, db; scan forward: read a, b, write A, Bc; backward: read a, A, Bc, dA, dBc, write da, db), measured
in the same run. accelerated-scan, when installed, is timed beside the recurrence on its (B, D, T) layout,
forward and forward+backward through autograd (it computes no A). Before timing, the single-pass kernel, the
segment kernel and the pipelined walk are checked against the sequential one (relative difference) and against
themselves over repeated calls (bitwise).

``--graph`` times CUDA graph replays (``triton.testing.do_bench_cudagraph``: GPU time only, the floor too)
instead of eager calls, whose host time bounds the small and few-chain shapes; a call that cannot be
captured shows nan. ``--smoke`` runs a tiny shape on the CPU under the Triton interpreter: the checks run,
the times mean nothing.

    python benchmarks/strategies.py                                 # on a CUDA machine
    python benchmarks/strategies.py --shapes 8x16384x1024 --dtypes float32 --ops scan
    python benchmarks/strategies.py --shapes 1x8192x2048,1x65536x256 --ops recurrence --graph
    python benchmarks/strategies.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import peers
import run
import torch

from mingru_triton import linear

SHAPES = "8x1024x1024,8x2048x1024,8x4096x1024,8x16384x1024,8x65536x1024,1x65536x256,1x8192x2048,2x65536x1024"


def timer(cuda: bool, rep: int, graph: bool = False) -> Callable[[Callable[[], Any]], float]:
    """Milliseconds per call: do_bench's median on CUDA (of CUDA graph replays where ``graph``), one
    wall-clock call otherwise."""
    if cuda and graph:

        def replayed(fn: Callable[[], Any]) -> float:
            ms, why = run.cuda_graph_ms(fn, rep)
            if ms is None:  # its row shows nan
                print(f"  {why}", flush=True)
            return math.nan if ms is None else ms

        return replayed
    if cuda:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=rep, return_mode="median")

    def wall(fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return wall


OPS = ("recurrence", "scan")
Tensors = tuple[torch.Tensor, ...]


def forward(op: str, a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> Tensors:
    """(h,) of the recurrence from h0, or (A, Bc) of the scan."""
    if op == "recurrence":
        return (linear.linear_recurrence_fwd(a, b, h0),)
    return tuple(linear.linear_scan_fwd(a, b))


def backward(op: str, a: torch.Tensor, h0: torch.Tensor, outs: Tensors, grad: torch.Tensor) -> Tensors:
    """The op's adjoint from its stored outputs ``outs``, with ``grad`` as every output's gradient."""
    if op == "recurrence":
        return tuple(linear.linear_recurrence_bwd(a, h0, outs[0], grad))
    return tuple(linear.linear_scan_bwd(a, *outs, grad, grad))


def served(op: str) -> tuple[str, ...]:
    """The strategies that run ``op`` (the single pass and the segment kernel take no running product)."""
    if op == "recurrence":
        return linear.STRATEGIES
    return tuple(s for s in linear.STRATEGIES if s not in ("lookback", "segment"))


def check(op: str, a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, grad: torch.Tensor) -> str:
    """The single-pass kernel, the segment kernel and the pipelined walk (those of them that serve ``op``)
    against the sequential one, and each against itself over three calls."""
    with linear.force_strategy("sequential"):
        outs = forward(op, a, b, h0)
        want = (*outs, *backward(op, a, h0, outs, grad))
    notes = []
    for name in (s for s in ("lookback", "segment", "pipelined") if s in served(op)):
        runs = []
        with linear.force_strategy(name):
            for _ in range(3):
                got = forward(op, a, b, h0)
                runs.append((*got, *backward(op, a, h0, outs, grad)))
        diff = max(
            ((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-30)).item()
            for x, y in zip(runs[0], want, strict=True)
        )
        same = all(torch.equal(x, y) for other in runs[1:] for x, y in zip(runs[0], other, strict=True))
        notes.append(
            f"{name} vs sequential: max relative difference {diff:.1e}; repeated calls bitwise equal: {same}"
        )
    return "; ".join(notes)


def rows(
    op: str, shape: tuple[int, int, int], dtype: torch.dtype, args: argparse.Namespace, cuda: bool
) -> list[str]:
    device = torch.device("cuda" if cuda else "cpu")
    gen = torch.Generator(device=device).manual_seed(0)
    batch, _, width = shape
    a = (torch.rand(shape, device=device, generator=gen) * 0.5 + 0.5).to(dtype)
    b = torch.randn(shape, device=device, generator=gen).to(dtype)
    h0 = torch.randn(batch, width, device=device, generator=gen).to(dtype)
    grad = torch.randn(shape, device=device, generator=gen).to(dtype)
    ms = timer(cuda, args.rep, args.graph)
    # streams read and written: (forward, backward); see the module docstring
    streams = (3, 5) if op == "recurrence" else (4, 7)
    floors = [run.copy_ms(n * a.numel() * a.element_size(), device, ms) for n in streams]
    plan = linear._plan_for(a, 1, single_pass=op == "recurrence", pipelined=True).strategy
    label = f"{op} {'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')}"
    out = [f"{label}: plan {plan}; {check(op, a, b, h0, grad)}"]
    outs = forward(op, a, b, h0)
    for name in ("plan", *served(op)):
        with linear.force_strategy(name) if name != "plan" else contextlib.nullcontext():
            fwd = ms(lambda: forward(op, a, b, h0))
            bwd = ms(lambda: backward(op, a, h0, outs, grad))
        out.append(_row(f"mingru {name}", fwd, bwd, floors))
    if args.peer and op == "recurrence":
        a_t, b_t = (x.transpose(1, 2).contiguous() for x in (a, b))
        leaves = [x.clone().requires_grad_() for x in (a_t, b_t)]
        grad_t = grad.transpose(1, 2).contiguous()
        fwd = ms(lambda: peers.accel_scan(a_t, b_t))
        both = ms(lambda: torch.autograd.grad(peers.accel_scan(*leaves), leaves, grad_t))
        out.append(_row("accelerated-scan", fwd, both - fwd, floors))
    return out


def _row(name: str, fwd: float, bwd: float, floors: list[float]) -> str:
    both = fwd + bwd
    return (
        f"  {name:26} fwd {fwd:9.4f} ms {fwd / floors[0]:6.2f}x   bwd {bwd:9.4f} ms {bwd / floors[1]:6.2f}x"
        f"   fwd+bwd {both:9.4f} ms {both / sum(floors):6.2f}x"
    )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated BxTxD")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--rep", type=int, default=40, help="do_bench rep in ms")
    parser.add_argument("--graph", action="store_true", help="time CUDA graph replays (GPU time only)")
    parser.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, one tiny shape")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes, args.dtypes = "2x40x3", "float32"
    elif not torch.cuda.is_available():
        parser.error("the strategy benchmark times CUDA kernels: run it on a GPU, or pass --smoke")
    args.shapes = [run.parse_shape(s) for s in args.shapes.split(",")]
    args.dtypes = [getattr(torch, name.strip()) for name in args.dtypes.split(",")]
    args.ops = [name.strip() for name in args.ops.split(",")]
    unknown = [name for name in args.ops if name not in OPS]
    if unknown:
        parser.error(f"--ops takes {', '.join(OPS)}; got {', '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if run.kernels_missing():
        return 2
    cuda = not args.smoke
    args.peer = run.peer_wanted("accelerated-scan", cuda)
    for op in args.ops:
        for shape in args.shapes:
            for dtype in args.dtypes:
                print("\n".join(rows(op, shape, dtype, args, cuda)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
