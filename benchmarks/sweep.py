"""Launch-configuration sweep of the k = 1 and log-space kernels: the tile, warps and strategy a shape wants.

For each shape and dtype, every configuration of the grid (channels per program, tile elements, warps, and
for few rows the chunked strategy with several chunk lengths; then the single-pass kernel's tiles, channels
x steps x warps, which for the log family force its single pass in both directions; then the pipelined
walk's tiles, channels x steps x warps x pipeline stages x channels per thread, for the k = 1 families)
replaces the kernel's own plan for one call: ``linear_recurrence_fwd`` (family "linear"),
``linear_scan_fwd`` (family "scan": the running product A is written too) or ``log_recurrence_fwd``
(family "log"); forward, forward + backward through autograd, or (k = 1 families) the adjoint op alone
("bwd", from stored forward outputs). Each result is checked against the call with the kernel's own plan,
then timed (median of ``triton.testing.do_bench``) and divided by the time of a device copy of the least
bytes the call must move. Prints the best configurations per (shape, dtype) next to the kernel's own plan;
``--csv`` keeps every row.

python benchmarks/sweep.py --family linear --csv out/sweep_linear.csv
python benchmarks/sweep.py --family log --dtypes float32 --modes fwd,fwdbwd
python benchmarks/sweep.py --family log --graph --compile-workers 8   # compile in 8 processes first
python benchmarks/sweep.py --family scan --modes fwd,bwd --tile= --lookback-t= --walk-stages 3,4,6,8
python benchmarks/sweep.py --smoke       # CPU, the Triton interpreter, two tiny configurations
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
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

from mingru_triton import _recipes, linear, log
from mingru_triton._launch import num_sms

SHAPES = "8x1024x1024,8x4096x1024,8x16384x1024,1x65536x256,1x8192x2048"
Shape = tuple[int, int, int]
FIELDS = ("family", "shape", "dtype", "mode", "config", "status", "ms", "x_floor", "max_err")
FAMILIES = ("linear", "scan", "log")
STREAMS = {
    ("linear", "fwd"): 3,  # read a, b; write h
    ("linear", "bwd"): 5,  # read a, h, dh; write da, db
    ("scan", "fwd"): 4,  # read a, b; write A, Bc
    ("scan", "bwd"): 7,  # read a, A, Bc, dA, dBc; write da, db
    ("log", "fwd"): 3,
    ("log", "bwd"): 5,
}
"""Tensors of (B, T, D) elements the call must read or write at the least, per (family, mode)."""


def streams(family: str, mode: str) -> int:
    """:data:`STREAMS` of (family, mode); forward + backward is the sum of the two."""
    if mode == "fwdbwd":
        return STREAMS[family, "fwd"] + STREAMS[family, "bwd"]
    return STREAMS[family, mode]


def _parse_ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item]


def _inputs(family: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    batch, _, width = shape
    if family in ("linear", "scan"):
        a = torch.rand(shape, device=device, generator=gen) * 0.5 + 0.5
        b = torch.randn(shape, device=device, generator=gen)
        h0 = torch.randn(batch, width, device=device, generator=gen)
    else:
        a = -F.softplus(torch.randn(shape, device=device, generator=gen))
        b = torch.randn(shape, device=device, generator=gen) - 1.0
        h0 = torch.rand(batch, width, device=device, generator=gen) + 0.1
    tensors = (a, b) if family == "scan" else (a, b, h0)
    return [x.to(dtype).requires_grad_() for x in tensors]


def _op(family: str) -> Callable[..., Any]:
    ops = {"linear": linear.linear_recurrence_fwd, "scan": linear.linear_scan_fwd}
    return ops.get(family, log.log_recurrence_fwd)


def _adjoint(family: str, inputs: list[Tensor], grad: Tensor) -> Callable[[], Any]:
    """The adjoint op of a k = 1 family alone, from its forward outputs (computed here once)."""
    x = [t.detach() for t in inputs]
    if family == "linear":
        a, _, h0 = x
        h = linear.linear_recurrence_fwd(*x)
        return lambda: linear.linear_recurrence_bwd(a, h0, h, grad)
    if family == "scan":
        A, Bc = linear.linear_scan_fwd(*x)
        return lambda: linear.linear_scan_bwd(x[0], A, Bc, grad, grad)
    raise ValueError(f"mode 'bwd' takes the families 'linear' and 'scan', got {family!r}")


def _configs(
    args: argparse.Namespace, family: str, shape: Shape, device: torch.device
) -> Iterator[tuple[str, Any]]:
    """(label, plan) for every configuration of the grid that fits ``shape``."""
    batch, steps, width = shape
    sms = num_sms(device)
    if family != "log":
        yield from _walk_configs(args, shape)
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
            if family != "log":
                plan: Any = linear.ScanPlan(strategy, block_t, block_d, 1, warps, chunk, n_chunks, d_blocks)
            else:
                plan = log._Plan(strategy, block_t, block_d, warps, chunk, n_chunks)
            yield label, plan
    if family == "scan":
        return  # the single pass writes no running product
    for block_d, block_t, warps in itertools.product(args.lookback_d, args.lookback_t, args.lookback_w):
        if block_d > triton.next_power_of_2(width) or block_d * block_t < 32 * warps:
            continue
        d_blocks, n_tiles = triton.cdiv(width, block_d), triton.cdiv(steps, block_t)
        yield (
            f"lookback d{block_d} t{block_t} w{warps}",
            linear.ScanPlan("lookback", block_t, block_d, 1, warps, block_t, n_tiles, d_blocks),
        )


def _walk_label(plan: linear.ScanPlan) -> str:
    columns = plan.columns or "-"
    return f"pipelined d{plan.block_j} t{plan.block_t} w{plan.num_warps} s{plan.num_stages} c{columns}"


def _walk_configs(args: argparse.Namespace, shape: Shape) -> Iterator[tuple[str, Any]]:
    """(label, plan) of the pipelined walk's tiles (k = 1 families); columns 0 is the compiler's choice,
    else a thread's contiguous channels (on one warp, BLOCK_J = 32 x columns puts a channel in one thread)."""
    _, steps, width = shape
    grid = itertools.product(args.walk_d, args.walk_t, args.walk_w, args.walk_stages, args.walk_columns)
    for block_d, block_t, warps, stages, columns in grid:
        if block_d > triton.next_power_of_2(width) or block_d * block_t < 32 * warps:
            continue
        if columns and block_d % columns:
            continue
        plan = linear.ScanPlan(
            "pipelined", block_t, block_d, 1, warps, steps, 1, triton.cdiv(width, block_d), stages, columns
        )
        yield _walk_label(plan), plan


@contextlib.contextmanager
def _plan(family: str, plan: Any) -> Iterator[None]:
    """Every launch of ``family`` inside the block uses ``plan`` (None: the kernel's own plan). The ops'
    launch recipes, which replay the plan they recorded, stay off within it; a block that never asks the
    patched planner for a plan raises, since its calls did not run ``plan``."""
    if plan is None:
        yield
        return
    with _recipes.overriding():
        if family == "log" and isinstance(plan, linear.ScanPlan):
            # The log recurrence's single pass: the k = 1 kernel's plan, forced both ways.
            with _plan("linear", plan), log.force_strategy("lookback"):
                yield
            return
        module: Any = log if family == "log" else linear
        name = "_device_plan" if family == "log" else "_plan_for"
        with patched(module, name, lambda *_, **__: plan):
            yield


@contextlib.contextmanager
def patched(module: Any, name: str, replacement: Callable[..., Any]) -> Iterator[None]:
    """``module.name`` is ``replacement`` within the block. A block that never calls it raises once the
    original is back, since its calls did not run the replacement's plan (a sweep would time the kernel's
    own plan under another label)."""
    saved = getattr(module, name)
    asked = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        asked[0] += 1
        return replacement(*args, **kwargs)

    setattr(module, name, counted)
    try:
        yield
    finally:
        setattr(module, name, saved)
    if not asked[0]:
        raise RuntimeError(f"plan not applied: nothing in the block called {module.__name__}.{name}")


def _linear_label(plan: linear.ScanPlan) -> str:
    """The label of a k = 1 plan, as the sweep's configurations are labelled."""
    if plan.strategy == "pipelined":
        return _walk_label(plan)
    chunk = f" c{plan.chunk}" if plan.strategy == "chunked" else ""
    return f"{plan.strategy} d{plan.block_j} t{plan.block_t} w{plan.num_warps}{chunk}"


def _own_plan(family: str, x: Tensor, mode: str = "fwd") -> str:
    if family in ("linear", "scan"):
        # The recurrence needs no running product (the single pass may take it); the scan does.
        single = family == "linear"
        fwd = linear._plan_for(x, 1, single_pass=single, pipelined=True)
        bwd = linear._plan_for(x, 1, single_pass=single, pipelined=True, backward=True)
        if mode == "bwd":
            return _linear_label(bwd)
        if mode == "fwdbwd" and bwd != fwd:
            return f"{_linear_label(fwd)} (adjoint: {_linear_label(bwd)})"
        return _linear_label(fwd)
    single = log._single_pass_plan(x, min_length=log.LOOKBACK_FORWARD_MIN_LENGTH)
    if single is not None:
        return f"{single.strategy} d{single.block_j} t{single.block_t} w{single.num_warps}"
    q = log._device_plan(x)
    chunk = f" c{q.chunk}" if q.n_chunks > 1 else ""
    label = f"{q.strategy} d{q.block_d} t{q.block_t} w{q.num_warps}{chunk}"
    return label + (" (adjoint: lookback)" if log._single_pass_plan(x) is not None else "")


def _rel_err(got: Tensor, want: Tensor) -> float:
    """max |got - want| over max |want|, in float64."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


_WARM_ELEMENTS = 1 << 27
"""Largest B x T x D a compile worker runs (longer T is halved): the workers share the GPU's memory."""
_workers: dict[str, Any] = {}
"""Per compile worker process: the sweep object of each sweep module, built once from its command line."""


def _warm_task(module: str, argv: list[str], task: tuple[str, Any, str, str, str]) -> tuple[str, float]:
    """In a compile worker: ``Sweep.warm`` of the sweep module ``module`` (this one or sweep_chunked) for
    one (family, shape, dtype, mode, label) task; returns (status, seconds)."""
    if module not in _workers:
        source = importlib.import_module(module)
        _workers[module] = source.Sweep(source.parse(argv))
    family, shape, dtype, mode, label = task
    start = time.perf_counter()
    status = _workers[module].warm(family, shape, getattr(torch, dtype), mode, label)
    return status, time.perf_counter() - start


def precompile(args: argparse.Namespace, argv: list[str]) -> int:
    """Compile every configuration of every case in ``args.compile_workers`` processes before the timing
    starts (Triton's on-disk cache then serves the timing process): compiling takes seconds per tile and
    configuration, one at a time in a process. Returns how many configurations failed to run ("absent": one
    the shorter input does not have, such as a chunk as long as its T, does not count)."""
    sweep = Sweep(args)
    tasks = [
        (args.family, shape, str(dtype)[6:], mode, label)
        for shape, dtype, mode in itertools.product(args.shapes, args.dtypes, args.modes)
        for label, _ in sweep.configs(args.family, shape)
    ]
    return compile_in_pool(args.compile_workers, "sweep", argv, tasks)


def compile_in_pool(workers: int, module: str, argv: list[str], tasks: list[Any]) -> int:
    """Warm every (family, shape, dtype, mode, label) task with the ``Sweep`` of sweep module ``module`` in
    ``workers`` spawned processes, print the time and every task whose status is not "ok"; returns how many
    failed ("absent" does not count)."""
    import multiprocessing

    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.starmap(_warm_task, [(module, argv, task) for task in tasks])
    failed = [(task, status) for task, (status, _) in zip(tasks, results, strict=True) if status != "ok"]
    busy = sum(seconds for _, seconds in results)
    print(
        f"compiled {len(tasks)} configurations in {time.perf_counter() - started:.1f} s with "
        f"{workers} workers ({busy:.1f} s of work)"
    )
    for (_, shape, dtype, mode, label), status in failed:
        print(f"  {'x'.join(map(str, shape))} {dtype} {mode} {label}: {status}")
    return sum(status != "absent" for _, status in failed)


class Timer:
    """Timing of a sweep's calls on its device (CPU under ``--smoke``): ``do_bench`` medians, or CUDA graph
    replays with ``--graph``, and the copy floor of a byte count, measured once per count."""

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

    def warm_call(self, forced: contextlib.AbstractContextManager[Any], fn: Callable[[], Any]) -> str:
        """Run ``fn`` once inside ``forced`` (compiling its kernels); "ok" or the error."""
        try:
            with forced:
                fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # reported here; the timing run meets it again and records it
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        return "ok"

    def timed_row(
        self,
        row: dict[str, Any],
        forced: contextlib.AbstractContextManager[Any],
        fn: Callable[[], Any],
        want: list[Tensor],
        floor: float,
    ) -> dict[str, Any]:
        """``row`` with the status of ``fn`` run inside ``forced``: "wrong" when its results are off ``want``
        (max relative error above 1e-4 in float32, 2e-2 otherwise), "failed" when it raises, else "ok" with
        its time and x floor."""
        try:
            with forced:
                got = fn()
                got = [got] if isinstance(got, Tensor) else list(got)
                err = max(_rel_err(g, w) for g, w in zip(got, want, strict=True))
                if not err <= (1e-4 if want[0].dtype == torch.float32 else 2e-2):
                    row.update(status=f"wrong (max rel. err {err:.1e})", max_err=err)
                else:
                    ms = self.time_ms(fn)
                    row.update(status="ok", ms=ms, x_floor=ms / floor, max_err=err)
        except Exception as exc:  # a configuration the compiler rejects (registers, shared memory)
            row.update(status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
        return row


class Sweep(Timer):
    def call(self, family: str, mode: str, inputs: list[Tensor], grad: Tensor) -> Callable[[], Any]:
        op = _op(family)
        if mode == "fwd":
            return lambda: op(*(x.detach() for x in inputs))
        if mode == "bwd":
            return _adjoint(family, inputs, grad)
        if family == "scan":
            return lambda: torch.autograd.grad(op(*inputs), inputs, (grad, grad))
        return lambda: torch.autograd.grad(op(*inputs), inputs, grad)

    def configs(self, family: str, shape: Shape) -> list[tuple[str, Any]]:
        """The (label, plan) configurations timed for ``shape``."""
        configs = list(_configs(self.args, family, shape, self.device))
        if self.args.smoke:
            configs = configs[:1] + configs[-1:]  # the first configuration (a walk) and the last
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
        return self.warm_call(_plan(family, plans[label]), fn)

    def run_one(self, family: str, shape: Shape, dtype: torch.dtype, mode: str) -> list[dict]:
        inputs = _inputs(family, shape, dtype, self.device)
        grad = torch.randn(shape, device=self.device).to(dtype)
        fn = self.call(family, mode, inputs, grad)
        want = fn()
        want = [want] if isinstance(want, Tensor) else list(want)
        nbytes = streams(family, mode) * inputs[0].numel() * inputs[0].element_size()
        floor = self.floor_ms(nbytes)
        rows = []
        base = {"family": family, "shape": "x".join(map(str, shape)), "dtype": str(dtype)[6:], "mode": mode}
        own_label = _own_plan(family, inputs[0], mode)
        own = {**base, "config": "own: " + own_label, "status": "ok", "max_err": 0.0}
        own_ms = self.time_ms(fn)
        rows.append({**own, "ms": own_ms, "x_floor": own_ms / floor})
        for label, plan in self.configs(family, shape):
            rows.append(self.timed_row({**base, "config": label}, _plan(family, plan), fn, want, floor))
        return rows


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, default="linear")
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated BxTxD")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--modes", default="fwd", help="fwd,fwdbwd,bwd (bwd: the adjoint op alone, k = 1)")
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
    walk = {
        "d": ("64", "channels per program"),
        "t": ("32", "steps per tile"),
        "w": ("1", "warps per program"),
        "stages": ("4", "pipeline stages (tl.range num_stages)"),
        "columns": ("2", "contiguous channels per thread (0: the compiler's choice)"),
    }
    for key, (default, what) in walk.items():
        parser.add_argument(
            f"--walk-{key}",
            type=_parse_ints,
            default=_parse_ints(default),
            help=f"{what} of the pipelined walk's configurations (k = 1 families; empty: none)",
        )
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes, args.dtypes, args.block_d, args.tile, args.warps = "2x20x12", "float32", [8], [64], [1]
        args.chunks, args.lookback_d, args.lookback_t = [8], [16], [4]
        args.walk_d, args.walk_t, args.walk_stages = [16], [4], [2]
    elif not torch.cuda.is_available():
        parser.error("the sweep times CUDA kernels: run it on a GPU, or pass --smoke")
    args.shapes = [run.parse_shape(s) for s in args.shapes.split(",")]
    args.dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    args.modes = args.modes.split(",")
    if "bwd" in args.modes and args.family == "log":
        parser.error("--modes bwd (the adjoint op alone) takes the families 'linear' and 'scan'")
    return args


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every sweep takes: timing, compile workers, output and the CPU smoke mode."""
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


def main(argv: Sequence[str] | None = None) -> int:
    return run_sweep(argv, parse, Sweep, precompile)


def run_sweep(
    argv: Sequence[str] | None,
    parse_fn: Callable[[list[str]], argparse.Namespace],
    sweep_type: Callable[[argparse.Namespace], Any],
    precompile_fn: Callable[[argparse.Namespace, list[str]], int],
    width: int = 40,
) -> int:
    """A sweep script's main: parse ``argv`` (default: the command line), check the kernels can run, compile
    in workers when asked, then :func:`sweep_cases` over ``sweep_type(args).run_one``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_fn(argv)
    if run.kernels_missing():
        return 2
    broken = precompile_fn(args, argv) if args.compile_workers > 0 else 0
    sweep = sweep_type(args)
    return sweep_cases(args, args.family, lambda *case: sweep.run_one(args.family, *case), broken, width)


def sweep_cases(
    args: argparse.Namespace,
    family: str,
    run_one: Callable[[Any, torch.dtype, str], list[dict]],
    broken: int = 0,
    width: int = 40,
) -> int:
    """``run_one(shape, dtype, mode)`` for every case of ``args`` until ``args.budget_min`` is spent: append
    its rows to ``args.csv``, print the kernel's own plan (the first row) and the ``args.top`` fastest
    configurations, then every one that did not run. Returns the exit status: 1 when a ``--smoke`` run had
    ``broken`` plus such configurations (on CPU every one must run), else 0."""
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
        rows = run_one(shape, dtype, mode)
        if writer is not None:
            writer.writerows(rows)
            handle.flush()
        own, rest = rows[0], rows[1:]
        timed = sorted((r for r in rest if r["status"] == "ok"), key=lambda r: r["ms"])
        print(f"\n{family} {own['shape']} {own['dtype']} {mode}: {len(rest)} configs, {len(timed)} timed")
        for r in [own, *timed[: args.top]]:
            print(f"  {r['config']:<{width}} {r['ms']:9.4f} ms  {r['x_floor']:6.2f}x floor")
        for r in rest:
            if r["status"] != "ok":
                print(f"  {r['config']:<{width}} {r['status']}")
                broken += 1
    if args.smoke and broken:
        print(f"{broken} configs failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
