"""Launch-configuration sweep of the matrix affine and angle kernels: chunk length, pipelining and tiles.

Both families walk their steps one after another inside a program, so their speed depends mostly on how T is
cut into chunks (how many programs per SM) and on how each program's step loop is compiled. For each shape
and dtype, every configuration of the grid replaces the kernel's own plan for one call of the layers' path
(``affine.recurrence`` / ``affine_scan_fwd`` with ``--op scan``, or ``angle.scan`` with scale and decay),
forward or forward + backward:

- affine: the chunked strategy with each ``--chunks`` length x ``--stages`` (``tl.range`` pipelining
  depth), and the sequential strategy;
- angle: chunked with each ``--chunks`` x ``--stages`` x ``--unroll`` x ``--tile`` (state entries per
  vector-path program) x ``--summary-tiles`` (heads x columns x warps of a chunk-summary program, or "own":
  the kernel's own) x ``--pair-tiles`` (R = 1: heads x warps of a pair-summary program, "off" for the
  dense k x k summaries, or "own") x ``--pair-rows`` (R = 1: steps per iteration of the pair summaries,
  carries and forward replays), and the sequential strategy; with ``--lookback-tiles`` (R = 1), the
  single pass (forward and adjoint) with each tile (steps x heads x warps).

Each result is checked against the call with the kernel's own plan (same inputs, same output gradient),
then timed (``triton.testing.do_bench`` median, or CUDA graph replay with ``--graph``) and divided by the
time of a device copy of the least bytes the call must move (benchmarks/cases.py's byte counts).

python benchmarks/sweep_chunked.py --family angle --graph --shapes 8x4096x16x16x2 --modes fwd,fwdbwd
python benchmarks/sweep_chunked.py --family angle --graph --shapes 8x4096x16x16x1 --chunks 64 --stages 3 \
    --unroll 2 --tile 32 --lookback-tiles 16x4x2,32x4x4
python benchmarks/sweep_chunked.py --family affine --graph --shapes 4x4096x16x8 --compile-workers 8
python benchmarks/sweep_chunked.py --smoke     # CPU, the Triton interpreter, tiny shapes, two configurations
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import cases
import torch
from sweep import Timer, _parse_ints, add_common_arguments, compile_in_pool, patched, run_sweep
from torch import Tensor

from mingru.scans.angle import default_angle_layout
from mingru_triton import _recipes, affine, angle
from mingru_triton._launch import next_pow2, num_sms

SHAPES = {
    "affine": "4x4096x16x2,4x4096x16x8,4x4096x16x16",
    "angle": "8x4096x16x8x1,8x4096x16x16x2,8x4096x16x32x4",
}
Shape = tuple[int, ...]


def _shape(family: str, text: str) -> Shape:
    parts = tuple(int(item) for item in text.lower().split("x"))
    want = 4 if family == "affine" else 5
    if len(parts) != want:
        layout = "BxTxnxk (k = v)" if family == "affine" else "BxTxnxkxR"
        raise argparse.ArgumentTypeError(f"an {family} shape is {layout}, got {text!r}")
    return parts


def _inputs(family: str, shape: Shape, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
    """The benchmark runner's inputs (benchmarks/cases.py) for the layers' path, as leaves needing grads."""
    if family == "affine":
        batch, steps, heads, k = shape
        inputs = cases.make_affine_state((batch, steps, heads, k, k), dtype, device)
    else:
        inputs = cases.make_angle(shape, dtype, device)[:5]
    return [x.detach().requires_grad_() for x in inputs]


def _floor_bytes(family: str, shape: Shape, mode: str, itemsize: int) -> int:
    if family == "affine":
        full = (*shape, shape[-1])
        fwd, bwd = cases.affine_rec_fwd(full, itemsize), cases.affine_rec_bwd(full, itemsize)
    else:
        fwd, bwd = cases.angle_fwd(shape, itemsize), cases.angle_bwd(shape, itemsize)
    return fwd if mode == "fwd" else fwd + bwd


def _tile(item: str, size: int, what: str) -> tuple[int, ...]:
    """``item`` as ``size`` positive numbers joined by "x", else an ArgumentTypeError saying ``what`` a tile
    is."""
    parts = tuple(int(x) for x in item.lower().split("x")) if item.replace("x", "").isdigit() else ()
    if len(parts) != size or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"a {what}, got {item!r}")
    return parts


def _summary_tiles(text: str) -> list[tuple[int, ...] | None]:
    what = 'summary tile is HxCxW (positive) or "own"'
    return [None if item == "own" else _tile(item, 3, what) for item in text.split(",")]


def _pair_tiles(text: str) -> list[tuple[int, ...] | str]:
    what = 'pair tile is HxW (positive), "own" or "off"'
    return [item if item in ("own", "off") else _tile(item, 2, what) for item in text.split(",")]


def _configs(args: argparse.Namespace, family: str) -> list[tuple[str, dict[str, Any] | None]]:
    """(label, settings) of every configuration; settings None is the sequential strategy."""
    grid: list[tuple[str, dict[str, Any] | None]] = [("sequential", None)]
    if family == "affine":
        for chunk, stages in itertools.product(args.chunks, args.stages):
            grid.append((f"chunked c{chunk} s{stages}", {"chunk": chunk, "stages": stages}))
    else:
        axes = (args.chunks, args.stages, args.unroll, args.tile, args.summary_tiles, args.pair_tiles)
        for chunk, stages, unroll, tile, summary, pairs, rows in itertools.product(*axes, args.pair_rows):
            label = f"chunked c{chunk} s{stages} u{unroll} tile{tile}"
            label += " sum" + "x".join(map(str, summary)) if summary else ""
            label += "" if pairs == "own" else f" pairs {pairs if isinstance(pairs, str) else _dims(pairs)}"
            label += "" if rows is None else f" rows{rows}"
            settings = {"chunk": chunk, "stages": stages, "unroll": unroll, "tile": tile, "rows": rows}
            grid.append((label, {**settings, "summary": summary, "pairs": pairs}))
        grid += [(f"lookback {_dims(tile)}", {"lookback": tile}) for tile in args.lookback_tiles]
    return grid[:1] + grid[-1:] if args.smoke else grid


@contextlib.contextmanager
def _forced(family: str, settings: dict[str, Any] | None) -> Iterator[None]:
    """Every launch of ``family`` inside the block uses ``settings`` (None: the sequential strategy)."""
    if family == "affine":
        if settings is None:
            with affine.force_strategy("sequential"):
                yield
            return
        own_config = affine._config
        stages = settings["stages"]
        with (
            patched(affine, "_config", lambda *a: {**own_config(*a), "STAGES": stages}),
            affine.force_strategy("chunked", settings["chunk"]),
        ):
            yield
        return
    if settings is None:
        with angle.force_strategy("sequential"):
            yield
        return
    own_plan = angle._plan

    def plan(
        batch: int, steps: int, heads: int, k: int, layers: int, device: torch.device, itemsize: int = 4
    ) -> Any:
        """The settings' plan, forward and adjoint alike; the pair kernels load ahead where the op's own
        plan has them do so."""
        if "lookback" in settings:
            if layers != 1:
                raise ValueError(f"the single pass takes R = 1, got R={layers}")
            block_t, pair_h, warps = settings["lookback"]
            return angle._Plan("lookback", block_t, pair_h, 1, 1, pairs=(pair_h, warps))
        block_h = min(next_pow2(heads), max(1, settings["tile"] // next_pow2(k)))
        chunk = min(settings["chunk"], max(1, steps))
        summary = settings["summary"] or angle._summary_tile(heads, k, layers)
        own = own_plan(batch, steps, heads, k, layers, device, itemsize)
        pairs = settings["pairs"]
        if pairs == "own":
            pairs = own.pairs
        elif pairs == "off" or layers != 1:
            pairs = None
        rows = 1 if pairs is None else settings["rows"] or max(own.rows, 1)
        prefetch = own.prefetch if pairs is not None and own.pairs is not None else 0
        return angle._Plan(
            "chunked", chunk, block_h, settings["stages"], settings["unroll"], summary, pairs, rows, prefetch
        )

    # The ops' launch recipes hold the plans they recorded, so they stay off.
    with patched(angle, "_plan", plan), _recipes.overriding():
        yield


def _own_plan(family: str, shape: Shape, device: torch.device) -> str:
    if family == "affine":
        batch, steps, heads, k = shape
        config = affine._config(k, k, torch.float32)
        name, chunk = affine._strategy(batch * heads, steps, num_sms(device), config["KP"])
        return f"{name} c{chunk} s{config['STAGES']}" if name == "chunked" else name
    batch, steps, heads, k, layers = shape
    p = angle._plan(batch, steps, heads, k, layers, device)
    if p.strategy == "sequential":
        return f"sequential heads{p.block_h}"
    tile = p.block_h * next_pow2(k)
    label = f"chunked c{p.chunk} s{p.stages} u{p.unroll} tile{tile} sum{_dims(p.summary)}"
    return label + (f" pairs {_dims(p.pairs)} rows{p.rows}" if p.pairs else "")


def _lookback_tiles(text: str) -> list[tuple[int, ...]]:
    what = "single-pass tile is TxHxW (positive; T and H powers of 2)"
    tiles = [_tile(item, 3, what) for item in text.split(",")]
    for tile in tiles:
        if any(size & (size - 1) for size in tile[:2]):
            raise argparse.ArgumentTypeError(f"a {what}, got {_dims(tile)}")
    return tiles


def _dims(tile: tuple[int, ...]) -> str:
    return "x".join(map(str, tile))


class Sweep(Timer):
    def call(self, family: str, mode: str, inputs: list[Tensor]) -> Callable[[], Any]:
        """The timed call; forward+backward takes the gradient of a fixed, seeded output gradient."""
        if family == "affine":
            op: Callable[..., Any] = affine.affine_scan_fwd if self.args.op == "scan" else affine.recurrence
            args = inputs[:2] if self.args.op == "scan" else inputs
        else:
            layout = default_angle_layout(inputs[3].shape[-1], inputs[0].shape[-2])
            perm, sgn, p2p = (t.to(self.device) for t in layout)
            sgn = sgn.to(inputs[0].dtype)
            op, args = (lambda *x: angle.scan(*x, perm, sgn, p2p, 1, 1)), inputs
        outs = op(*(x.detach() for x in args))
        outs = [outs] if isinstance(outs, Tensor) else list(outs)
        gen = torch.Generator(device=self.device).manual_seed(1)
        grads = [torch.randn(o.shape, device=self.device, generator=gen).to(o.dtype) for o in outs]
        if mode == "fwd":
            return lambda: op(*(x.detach() for x in args))

        def forward_backward() -> tuple[Tensor, ...]:
            out = op(*args)
            return torch.autograd.grad(out if isinstance(out, tuple) else (out,), args, grads)

        return forward_backward

    def warm(self, family: str, shape: Shape, dtype: torch.dtype, mode: str, label: str) -> str:
        """Run configuration ``label`` once, so its kernels are compiled into Triton's cache; "ok" or the
        error."""
        settings = dict(_configs(self.args, family))[label]
        fn = self.call(family, mode, _inputs(family, shape, dtype, self.device))
        return self.warm_call(_forced(family, settings), fn)

    def run_one(self, family: str, shape: Shape, dtype: torch.dtype, mode: str) -> list[dict]:
        inputs = _inputs(family, shape, dtype, self.device)
        fn = self.call(family, mode, inputs)
        want = fn()
        want = [want] if isinstance(want, Tensor) else list(want)
        floor = self.floor_ms(_floor_bytes(family, shape, mode, inputs[0].element_size()))
        base = {"family": family, "shape": "x".join(map(str, shape)), "dtype": str(dtype)[6:], "mode": mode}
        own_ms = self.time_ms(fn)
        own = {**base, "config": "own: " + _own_plan(family, shape, self.device), "status": "ok"}
        rows = [{**own, "ms": own_ms, "x_floor": own_ms / floor, "max_err": 0.0}]
        for label, settings in _configs(self.args, family):
            rows.append(self.timed_row({**base, "config": label}, _forced(family, settings), fn, want, floor))
        return rows


def precompile(args: argparse.Namespace, argv: list[str]) -> int:
    """Run every configuration once in ``args.compile_workers`` spawned processes (Triton's on-disk cache
    then serves the timing process); returns how many failed."""
    tasks = [
        (args.family, shape, str(dtype)[6:], mode, label)
        for shape, dtype, mode in itertools.product(args.shapes, args.dtypes, args.modes)
        for label, _ in _configs(args, args.family)
    ]
    return compile_in_pool(args.compile_workers, "sweep_chunked", argv, tasks)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--family", choices=("affine", "angle"), default="angle")
    parser.add_argument("--op", choices=("recurrence", "scan"), default="recurrence", help="affine only")
    parser.add_argument(
        "--shapes", default=None, help="comma-separated BxTxnxk (affine) or BxTxnxkxR (angle)"
    )
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--modes", default="fwd,fwdbwd", help="fwd,fwdbwd")
    parser.add_argument("--chunks", type=_parse_ints, default=_parse_ints("32,64,128"))
    parser.add_argument("--stages", type=_parse_ints, default=_parse_ints("1,3"))
    parser.add_argument("--unroll", type=_parse_ints, default=_parse_ints("1,4"), help="angle only")
    parser.add_argument("--tile", type=_parse_ints, default=_parse_ints("1,32,64"), help="angle only")
    parser.add_argument(
        "--summary-tiles",
        type=_summary_tiles,
        default=[None],
        help='angle only: comma-separated HxCxW (heads x columns x warps) or "own"',
    )
    parser.add_argument(
        "--pair-tiles",
        type=_pair_tiles,
        default=["own"],
        help='angle only, R = 1: comma-separated HxW (heads x warps of a pair-summary program), "own" or '
        '"off" (dense k x k summaries)',
    )
    parser.add_argument(
        "--pair-rows",
        type=_parse_ints,
        default=[None],
        help="angle only, R = 1: comma-separated steps per iteration of the pair summaries, carries and "
        "forward replays (default: the kernel's own)",
    )
    parser.add_argument(
        "--lookback-tiles",
        type=_lookback_tiles,
        default=[],
        help="angle only, R = 1: comma-separated TxHxW (steps x heads (a power of 2) x warps) of the "
        "single pass",
    )
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes = args.shapes or ("1x40x2x4" if args.family == "affine" else "1x40x2x4x2")
        args.dtypes, args.chunks, args.stages, args.unroll, args.tile = "float32", [8], [1], [1], [8]
    elif not torch.cuda.is_available():
        parser.error("the sweep times CUDA kernels: run it on a GPU, or pass --smoke")
    try:
        args.shapes = [_shape(args.family, s) for s in (args.shapes or SHAPES[args.family]).split(",")]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--shapes: {exc}")
    args.dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    args.modes = args.modes.split(",")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_sweep(argv, parse, Sweep, precompile, width=44)


if __name__ == "__main__":
    sys.exit(main())
