"""Host overhead per call: where a scan op is bound by Python and launches rather than by the GPU.

For each shape, each call (the k = 1 and log recurrences of mingru, forward and forward+backward, on the
layers' path and, marked "op", through the ``torch.library`` ops; the angle scan with k = 8, R = 1 and D / 8
heads on the layers' path; MinGRU's fused gates (log kind, pre (B, T, 2 D)): forward, forward+backward and
the by-hand adjoint of the recomputed chunks; accelerated-scan when installed) is timed three ways on CUDA:

- ``wall``: a loop of calls, synchronised only at the ends, over the number of calls (host-bound when the
  host is slower than the GPU);
- ``cpu``: the process CPU time of that loop per call (all threads): the host's own work, equal to
  ``wall`` where the host is busy throughout and below it where a thread waits;
- ``do_bench``: the median of ``triton.testing.do_bench`` (what ``bench.py`` reports);
- ``graph``: the median of ``triton.testing.do_bench_cudagraph`` (replayed from a CUDA graph: GPU time only).

mingru's calls are timed with their launch recipes (``mingru_triton._recipes``: each op body's launches
replayed without its Python) and, marked "no recipes", without them (the bodies run at each call).

``wall`` well above ``graph`` at a small shape means the call is bound by host time. ``--profile NAME`` adds a
``cProfile`` table (the functions with the most own time) of the calls whose name contains NAME, to show
where that host time goes. ``--smoke`` runs on the CPU under the Triton interpreter with wall times only
(they mean nothing; CI checks that the script runs).

    python benchmarks/overhead.py                                   # on a CUDA machine
    python benchmarks/overhead.py --shapes 8x16x1024,8x1024x1024 --calls 500
    python benchmarks/overhead.py --shapes 8x1024x1024 --profile "k=1 fwd+bwd"
    python benchmarks/overhead.py --shapes 8x16x1024,8x1024x1024 --only angle
    python benchmarks/overhead.py --shapes 8x16x1024,8x320x1024 --only gated
    python benchmarks/overhead.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import peers
import run
import torch
import torch.nn.functional as F
from torch import Tensor

from mingru.scans.angle import default_angle_layout
from mingru_triton import _recipes, gated, linear, log
from mingru_triton.impls import angle_scan_impl

SHAPES = "8x16x1024,8x1024x1024,8x16384x1024"


def calls(shape: tuple[int, int, int], device: torch.device, with_peer: bool) -> dict[str, Callable[[], Any]]:
    """name -> a zero-argument call on inputs of ``shape`` (B, T, D)."""
    gen = torch.Generator(device=device).manual_seed(0)
    batch, _, width = shape
    a = torch.rand(shape, device=device, generator=gen) * 0.5 + 0.5
    b = torch.randn(shape, device=device, generator=gen)
    h0 = torch.randn(batch, width, device=device, generator=gen)
    lc = -F.softplus(torch.randn(shape, device=device, generator=gen))
    grad = torch.randn(shape, device=device, generator=gen)
    leaves = [x.clone().requires_grad_() for x in (a, b, h0)]
    log_leaves = [x.clone().requires_grad_() for x in (lc, b, h0)]

    def grads(op: Callable[..., Tensor], inputs: list[Tensor], out_grad: Tensor = grad) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(op(*inputs), inputs, out_grad)

    steps, heads = shape[1], max(1, width // 8)
    angle_inputs = [
        torch.randn(batch, steps, heads, 1, 4, device=device, generator=gen),
        *(torch.rand(batch, steps, heads, device=device, generator=gen) * 0.5 + 0.5 for _ in range(2)),
        torch.randn(batch, steps, heads, 8, device=device, generator=gen),
        torch.randn(batch, heads, 8, device=device, generator=gen),
    ]
    angle_leaves = [x.clone().requires_grad_() for x in angle_inputs]
    angle_grad = torch.randn(batch, steps, heads, 8, device=device, generator=gen)
    layout = [t.to(device) for t in default_angle_layout(8, 1)]

    def angle_scan(*x: Tensor) -> Tensor:
        return angle_scan_impl(*x, *layout, has_scale=1, has_decay=1)

    # MinGRU's fused gates (log kind) as the recomputed chunks call them: the forward without a graph, the
    # by-hand adjoint on a gradient in the projection's dtype plus d final
    pre = torch.randn(batch, steps, 2 * width, device=device, generator=gen)
    pre_leaves = [pre.clone().requires_grad_(), h0.clone().requires_grad_()]
    with torch.no_grad():
        h_gated = gated.recurrence(0, pre, h0)
    d_final = torch.randn(batch, width, device=device, generator=gen)

    found: dict[str, Callable[[], Any]] = {
        "mingru k=1 fwd": lambda: linear.recurrence(a, b, h0),
        "mingru k=1 fwd+bwd": grads(linear.recurrence, leaves),
        "mingru k=1 fwd+bwd, op": grads(linear.linear_recurrence_fwd, leaves),
        "mingru log fwd": lambda: log.recurrence(lc, b, h0),
        "mingru log fwd+bwd": grads(log.recurrence, log_leaves),
        "mingru log fwd+bwd, op": grads(log.log_recurrence_fwd, log_leaves),
        "mingru angle fwd": lambda: angle_scan(*angle_inputs),
        "mingru angle fwd+bwd": grads(angle_scan, angle_leaves, angle_grad),
        "mingru gated fwd": lambda: gated.recurrence(0, pre, h0),
        "mingru gated fwd+bwd": grads(lambda p, s: gated.recurrence(0, p, s), pre_leaves),
        "mingru gated adjoint": lambda: gated.adjoint(0, pre, h0, h_gated, grad, d_final),
    }
    if with_peer:
        a_t, b_t = (x.transpose(1, 2).contiguous() for x in (a, b))
        peer_leaves = [x.clone().requires_grad_() for x in (a_t, b_t)]
        grad_t = grad.transpose(1, 2).contiguous()
        found["accelerated-scan fwd"] = lambda: peers.accel_scan(a_t, b_t)
        found["accelerated-scan fwd+bwd"] = lambda: torch.autograd.grad(
            peers.accel_scan(*peer_leaves), peer_leaves, grad_t
        )
    return found


def _run_calls(
    fn: Callable[[], Any], n: int, cuda: bool, profiler: cProfile.Profile | None = None
) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``n`` back-to-back calls of ``fn`` after a few warm-up calls,
    synchronised only at the ends (under ``profiler`` when given)."""
    for _ in range(min(n, 10)):
        fn()
    if cuda:
        torch.cuda.synchronize()
    if profiler is not None:
        profiler.enable()
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    if cuda:
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if profiler is not None:
        profiler.disable()
    return seconds, cpu


def per_call_us(fn: Callable[[], Any], n: int, cuda: bool) -> tuple[float, float]:
    """(wall, CPU) microseconds per call over ``n`` back-to-back calls (after a few warm-up calls); CPU is
    the time all the process's threads ran."""
    seconds, cpu = _run_calls(fn, n, cuda)
    return seconds / n * 1e6, cpu / n * 1e6


def measure(name: str, fn: Callable[[], Any], args: argparse.Namespace, cuda: bool) -> str:
    wall, cpu = per_call_us(fn, args.calls, cuda)
    if not cuda:
        return f"{name:36} wall {wall:10.1f} us   cpu {cpu:10.1f} us"
    from triton.testing import do_bench, do_bench_cudagraph

    bench = do_bench(fn, warmup=10, rep=args.rep, return_mode="median") * 1e3
    try:
        graph = f"{do_bench_cudagraph(fn, rep=args.rep, return_mode='median') * 1e3:10.1f} us"
    except Exception as exc:  # a call that cannot be captured in a CUDA graph
        graph = f"not captured ({type(exc).__name__})"
    return f"{name:36} wall {wall:10.1f} us   cpu {cpu:10.1f} us   do_bench {bench:10.1f} us   graph {graph}"


def profile(fn: Callable[[], Any], n: int, cuda: bool, top: int = 22) -> str:
    """The ``top`` functions by own time over ``n`` calls of ``fn`` (after warm-up), as pstats prints them."""
    profiler = cProfile.Profile()
    _run_calls(fn, n, cuda, profiler)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated BxTxD")
    parser.add_argument("--calls", type=int, default=300, help="calls in the wall-clock loop")
    parser.add_argument("--rep", type=int, default=30, help="do_bench rep in ms")
    parser.add_argument("--profile", default=None, metavar="NAME", help="cProfile calls named like NAME")
    parser.add_argument("--only", default=None, metavar="NAME", help="time only the calls named like NAME")
    parser.add_argument(
        "--recipes",
        choices=("both", "on", "off"),
        default="both",
        help="time mingru's calls with their launch recipes (on), without (off: the op bodies), or both",
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, one tiny shape")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes, args.calls = "2x5x3", 2
    elif not torch.cuda.is_available():
        parser.error("the overhead probe times CUDA calls: run it on a GPU, or pass --smoke")
    args.shapes = [run.parse_shape(s) for s in args.shapes.split(",")]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if run.kernels_missing():
        return 2
    cuda = not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    with_peer = run.peer_wanted("accelerated-scan", cuda)
    for shape in args.shapes:
        print(f"\n{'x'.join(map(str, shape))}")
        for name, fn in calls(shape, device, with_peer).items():
            if args.only is not None and args.only not in name:
                continue
            ours = name.startswith("mingru")
            for recipes in ("on", "off") if ours and args.recipes == "both" else (args.recipes,):
                label = f"{name}, no recipes" if ours and recipes == "off" else name
                with _recipes.overriding() if ours and recipes == "off" else contextlib.nullcontext():
                    print("  " + measure(label, fn, args, cuda), flush=True)
                    if args.profile is not None and args.profile in label:
                        print(profile(fn, args.calls, cuda), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
