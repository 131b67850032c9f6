"""Launch-configuration sweep of the k = 1 and log-space kernels: the tile, warps and strategy a shape wants.

For each shape and dtype, every configuration of the grid (channels per program, tile elements, warps, and
for few rows the chunked strategy with several chunk lengths; then the single-pass kernel's tiles, channels
x steps x warps, which for the log family force its single pass in both directions) replaces the kernel's
own plan for one ``linear_recurrence_fwd`` / ``log_recurrence_fwd`` call (forward, or forward + backward).
Each result is checked against the call with the kernel's own plan, then timed (median of
``triton.testing.do_bench``) and divided by the time of a device copy of the least bytes the call must move.
Prints the best configurations per (shape, dtype) next to the kernel's own plan; ``--csv`` keeps every row.

python benchmarks/sweep.py --family linear --csv out/sweep_linear.csv
python benchmarks/sweep.py --family log --dtypes float32 --modes fwd,fwdbwd
python benchmarks/sweep.py --family log --graph --compile-workers 8   # compile in 8 processes first
python benchmarks/sweep.py --smoke       # CPU, the Triton interpreter, two tiny configurations
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import run
import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from mingru_triton import linear, log
from mingru_triton._launch import num_sms

SHAPES = "8x1024x1024,8x4096x1024,8x16384x1024,1x65536x256,1x8192x2048"
Shape = tuple[int, int, int]
FIELDS = ("family", "shape", "dtype", "mode", "config", "status", "ms", "x_floor", "max_err")


def _parse_ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item]


def _inputs(family: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    batch, _, width = shape
    if family == "linear":
        a = torch.rand(shape, device=device, generator=gen) * 0.5 + 0.5
        b = torch.randn(shape, device=device, generator=gen)
        h0 = torch.randn(batch, width, device=device, generator=gen)
    else:
        a = -F.softplus(torch.randn(shape, device=device, generator=gen))
        b = torch.randn(shape, device=device, generator=gen) - 1.0
        h0 = torch.rand(batch, width, device=device, generator=gen) + 0.1
    return [x.to(dtype).requires_grad_() for x in (a, b, h0)]


def _op(family: str) -> Callable[..., Tensor]:
    return linear.linear_recurrence_fwd if family == "linear" else log.log_recurrence_fwd


def _configs(
    args: argparse.Namespace, family: str, shape: Shape, device: torch.device
) -> Iterator[tuple[str, Any]]:
    """(label, plan) for every configuration of the grid that fits ``shape``."""
    batch, steps, width = shape
    sms = num_sms(device)
    for block_d, elems, warps in itertools.product(args.block_d, args.tile, args.warps):
        block_t = elems // block_d
        if block_t < 1 or elems // (32 * warps) < 1 or block_d > triton.next_power_of_2(width):
            continue
        d_blocks = triton.cdiv(width, block_d)
        strategies: list[tuple[str, int]] = [("sequential", steps)]
        if batch * d_blocks < 2 * sms:
            strategies += [("chunked", c) for c in args.chunks if block_t <= c < steps]
        for strategy, chunk in strategies:
            n_chunks = triton.cdiv(steps, chunk)
            label = f"{strategy} d{block_d} t{block_t} w{warps}" + (f" c{chunk}" if n_chunks > 1 else "")
            if family == "linear":
                plan: Any = linear.ScanPlan(strategy, block_t, block_d, 1, warps, chunk, n_chunks, d_blocks)
            else:
                plan = log._Plan(strategy, block_t, block_d, warps, chunk, n_chunks)
            yield label, plan
    for block_d, block_t, warps in itertools.product(args.lookback_d, args.lookback_t, args.lookback_w):
        if block_d > triton.next_power_of_2(width) or block_d * block_t < 32 * warps:
            continue
        d_blocks, n_tiles = triton.cdiv(width, block_d), triton.cdiv(steps, block_t)
        yield (
            f"lookback d{block_d} t{block_t} w{warps}",
            linear.ScanPlan("lookback", block_t, block_d, 1, warps, block_t, n_tiles, d_blocks),
        )


@contextlib.contextmanager
def _plan(family: str, plan: Any) -> Iterator[None]:
    """Every launch of ``family`` inside the block uses ``plan`` (None: the kernel's own plan)."""
    if plan is None:
        yield
        return
    if family == "log" and isinstance(plan, linear.ScanPlan):
        # The log recurrence's single pass: the k = 1 kernel's plan, forced for the forward and the adjoint.
        with _plan("linear", plan), log.force_strategy("lookback"):
            yield
        return
    module: Any = linear if family == "linear" else log
    name = "_plan_for" if family == "linear" else "_device_plan"
    saved = getattr(module, name)
    setattr(module, name, lambda *_, **__: plan)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _own_plan(family: str, x: Tensor) -> str:
    if family == "linear":
        p = linear._plan_for(x, 1, single_pass=True)  # the recurrence timed here needs no running product
        strategy, block_d, block_t, warps, chunk, n_chunks = (
            p.strategy,
            p.block_j,
            p.block_t,
            p.num_warps,
            p.chunk,
            p.num_chunks,
        )
    else:
        single = log._single_pass_plan(x, min_length=log.LOOKBACK_FORWARD_MIN_LENGTH)
        if single is not None:
            return f"lookback d{single.block_j} t{single.block_t} w{single.num_warps}"
        q = log._device_plan(x)
        strategy, block_d, block_t, warps, chunk, n_chunks = (
            q.strategy,
            q.block_d,
            q.block_t,
            q.num_warps,
            q.chunk,
            q.n_chunks,
        )
        if log._single_pass_plan(x) is not None:
            chunk_label = f" c{chunk}" if n_chunks > 1 else ""
            return f"{strategy} d{block_d} t{block_t} w{warps}{chunk_label} (adjoint: lookback)"
    return f"{strategy} d{block_d} t{block_t} w{warps}" + (f" c{chunk}" if n_chunks > 1 else "")


def _rel_err(got: Tensor, want: Tensor) -> float:
    """max |got - want| over max |want|, in float64."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


_WARM_ELEMENTS = 1 << 27
"""Largest B x T x D a compile worker runs (longer T is halved): the workers share the GPU's memory."""
_worker: Sweep | None = None


def _warm_task(argv: list[str], task: tuple[str, Shape, str, str, str]) -> tuple[str, float]:
    """In a compile worker: :meth:`Sweep.warm` of one (family, shape, dtype, mode, label) task; returns
    (status, seconds)."""
    global _worker
    if _worker is None:
        _worker = Sweep(parse(argv))
    family, shape, dtype, mode, label = task
    start = time.perf_counter()
    status = _worker.warm(family, shape, getattr(torch, dtype), mode, label)
    return status, time.perf_counter() - start


def precompile(args: argparse.Namespace, argv: list[str]) -> int:
    """Compile every configuration of every case in ``args.compile_workers`` processes before the timing
    starts (Triton's on-disk cache then serves the timing process): compiling takes seconds per tile and
    configuration, one at a time in a process. Returns how many configurations failed to run ("absent": one
    the shorter input does not have, such as a chunk as long as its T, does not count)."""
    import multiprocessing

    sweep = Sweep(args)
    tasks = [
        (args.family, shape, str(dtype)[6:], mode, label)
        for shape, dtype, mode in itertools.product(args.shapes, args.dtypes, args.modes)
        for label, _ in sweep.configs(args.family, shape)
    ]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.compile_workers) as pool:
        results = pool.starmap(_warm_task, [(argv, task) for task in tasks])
    failed = [(task, status) for task, (status, _) in zip(tasks, results, strict=True) if status != "ok"]
    busy = sum(seconds for _, seconds in results)
    print(
        f"compiled {len(tasks)} configurations in {time.perf_counter() - started:.1f} s with "
        f"{args.compile_workers} workers ({busy:.1f} s of work)"
    )
    for (_, shape, dtype, mode, label), status in failed:
        print(f"  {'x'.join(map(str, shape))} {dtype} {mode} {label}: {status}")
    return sum(status != "absent" for _, status in failed)


class Sweep:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.floors: dict[int, float] = {}

    def time_ms(self, fn: Callable[[], Any]) -> float:
        cuda = self.device.type == "cuda"
        if cuda and self.args.graph:
            from triton.testing import do_bench_cudagraph

            return float(do_bench_cudagraph(fn, rep=self.args.rep, return_mode="median"))
        return run.median_ms(fn, cuda=cuda, warmup=self.args.warmup, rep=self.args.rep, tries=2)

    def floor_ms(self, nbytes: int) -> float:
        if nbytes not in self.floors:
            self.floors[nbytes] = run.copy_ms(nbytes, self.device, self.time_ms)
        return self.floors[nbytes]

    def call(self, family: str, mode: str, inputs: list[Tensor], grad: Tensor) -> Callable[[], Any]:
        op = _op(family)
        if mode == "fwd":
            return lambda: op(*(x.detach() for x in inputs))
        return lambda: torch.autograd.grad(op(*inputs), inputs, grad)

    def configs(self, family: str, shape: Shape) -> list[tuple[str, Any]]:
        """The (label, plan) configurations timed for ``shape``."""
        configs = list(_configs(self.args, family, shape, self.device))
        if self.args.smoke:
            configs = configs[:1] + configs[-1:]  # the first grid configuration and the last (lookback)
        return configs

    def warm(self, family: str, shape: Shape, dtype: torch.dtype, mode: str, label: str) -> str:
        """Run configuration ``label`` once on a shorter input of ``shape`` (same B and D), so its kernels
        are compiled into Triton's cache; "ok", "absent" (no such configuration there) or the error."""
        batch, steps, width = shape
        while batch * steps * width > _WARM_ELEMENTS and steps % 2 == 0 and steps > 4096:
            steps //= 2  # keeps T's divisibility by 16, which Triton specializes on
        short = (batch, steps, width)
        plans = dict(self.configs(family, short))
        if label not in plans:
            return "absent"
        inputs = _inputs(family, short, dtype, self.device)
        fn = self.call(family, mode, inputs, torch.ones(short, device=self.device, dtype=dtype))
        try:
            with _plan(family, plans[label]):
                fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # reported here; the timing run meets it again and records it
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        return "ok"

    def run_one(self, family: str, shape: Shape, dtype: torch.dtype, mode: str) -> list[dict]:
        inputs = _inputs(family, shape, dtype, self.device)
        grad = torch.randn(shape, device=self.device).to(dtype)
        fn = self.call(family, mode, inputs, grad)
        want = fn()
        want = [want] if isinstance(want, Tensor) else list(want)
        nbytes = (3 if mode == "fwd" else 8) * inputs[0].numel() * inputs[0].element_size()
        floor = self.floor_ms(nbytes)
        rows = []
        base = {"family": family, "shape": "x".join(map(str, shape)), "dtype": str(dtype)[6:], "mode": mode}
        own = {**base, "config": "own: " + _own_plan(family, inputs[0]), "status": "ok", "max_err": 0.0}
        own_ms = self.time_ms(fn)
        rows.append({**own, "ms": own_ms, "x_floor": own_ms / floor})
        for label, plan in self.configs(family, shape):
            row = {**base, "config": label}
            try:
                with _plan(family, plan):
                    got = fn()
                    got = [got] if isinstance(got, Tensor) else list(got)
                    err = max(_rel_err(g, w) for g, w in zip(got, want, strict=True))
                    limit = 1e-4 if dtype == torch.float32 else 2e-2
                    if not err <= limit:
                        row.update(status=f"wrong (max rel. err {err:.1e})", max_err=err)
                    else:
                        ms = self.time_ms(fn)
                        row.update(status="ok", ms=ms, x_floor=ms / floor, max_err=err)
            except Exception as exc:  # a configuration the compiler rejects (registers, shared memory)
                row.update(status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            rows.append(row)
        return rows


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("linear", "log"), default="linear")
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated BxTxD")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--modes", default="fwd", help="fwd,fwdbwd")
    parser.add_argument("--block-d", type=_parse_ints, default=_parse_ints("8,16,32,64"))
    parser.add_argument("--tile", type=_parse_ints, default=_parse_ints("1024,2048,4096,8192"))
    parser.add_argument("--warps", type=_parse_ints, default=_parse_ints("1,2,4,8"))
    parser.add_argument("--chunks", type=_parse_ints, default=_parse_ints("1024,4096"))
    parser.add_argument(
        "--lookback-d",
        type=_parse_ints,
        default=_parse_ints("32,64,128"),
        help="channels per tile of the single-pass (lookback) configurations",
    )
    parser.add_argument(
        "--lookback-t",
        type=_parse_ints,
        default=_parse_ints("16,32,64,128"),
        help="steps per tile of the single-pass configurations (empty: none)",
    )
    parser.add_argument(
        "--lookback-w",
        type=_parse_ints,
        default=_parse_ints("1,2,4"),
        help="warps per tile of the single-pass configurations (more than one: the warps split the steps)",
    )
    parser.add_argument(
        "--graph",
        action="store_true",
        help="time each call (and the copy floor) replayed from a CUDA graph: GPU time without the host's "
        "launch time, L2 not flushed",
    )
    parser.add_argument(
        "--compile-workers",
        type=int,
        default=0,
        metavar="N",
        help="first compile every configuration in N processes (each runs it once on a shorter input)",
    )
    parser.add_argument("--rep", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--top", type=int, default=5, help="best configurations printed per case")
    parser.add_argument("--budget-min", type=float, default=8.0, help="stop starting cases after this")
    parser.add_argument("--csv", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, two configs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes, args.dtypes, args.block_d, args.tile, args.warps = "2x20x12", "float32", [8], [64], [1]
        args.chunks, args.lookback_d, args.lookback_t = [8], [16], [4]
    elif not torch.cuda.is_available():
        parser.error("the sweep times CUDA kernels: run it on a GPU, or pass --smoke")
    args.shapes = [run.parse_shape(s) for s in args.shapes.split(",")]
    args.dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    args.modes = args.modes.split(",")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if run.kernels_missing():
        return 2
    broken = precompile(args, argv) if args.compile_workers > 0 else 0
    sweep = Sweep(args)
    started = time.perf_counter()
    writer = None
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        handle = args.csv.open("a", newline="")
        writer = csv.DictWriter(handle, FIELDS, extrasaction="ignore")
        if args.csv.stat().st_size == 0:
            writer.writeheader()
    for shape, dtype, mode in itertools.product(args.shapes, args.dtypes, args.modes):
        if time.perf_counter() - started > args.budget_min * 60:
            print(f"budget of {args.budget_min:g} min spent: {shape} {dtype} {mode} and later cases skipped")
            break
        rows = sweep.run_one(args.family, shape, dtype, mode)
        if writer is not None:
            writer.writerows(rows)
            handle.flush()
        own, rest = rows[0], rows[1:]
        timed = sorted((r for r in rest if r["status"] == "ok"), key=lambda r: r["ms"])
        case = f"{args.family} {own['shape']} {own['dtype']} {mode}"
        print(f"\n{case}: {len(rest)} configs, {len(timed)} timed")
        for r in [own, *timed[: args.top]]:
            print(f"  {r['config']:<40} {r['ms']:9.4f} ms  {r['x_floor']:6.2f}x floor")
        for r in rest:
            if r["status"] != "ok":
                print(f"  {r['config']:<40} {r['status']}")
                broken += r["status"].startswith("failed")
    if args.smoke and broken:  # on CPU every config must run: a failure there is a bug of the sweep or kernel
        print(f"{broken} configs failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
