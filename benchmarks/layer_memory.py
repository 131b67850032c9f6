"""Time and peak memory of a layer's training step, with and without ``recompute``, over chunk lengths.

For each dtype and mode, on CUDA: a ``MinGRU(dim, mode=..., bias=False)`` forward+backward at (B, T, dim)
(``torch.autograd.grad`` of the output with a fixed output gradient, with respect to the input and the
weights), as the single pass and with ``recompute=True`` at each chunk length ("auto" is the layer's own
``recompute_chunk_len``). Columns: the median of ``triton.testing.do_bench`` (L2 flushed), the peak memory of
one step over the least (input, output, their gradients, the weights and their gradients: what
``bench.py`` calls "mem x least"), and, as a time reference, the step's matrix products alone (the input
projection and its two gradients; with recompute three of them plus the recomputed projection).
``--autograd-chunks`` adds, per chunk length, the same step with each chunk's backward run by autograd over
the layer's ``_forward`` (the path of layers with hooks or parametrized projections) instead of the layer's
own chunk adjoint: an A/B of the two in one process.

    python benchmarks/layer_memory.py                                     # 8 x 4096 x 1024, on CUDA
    python benchmarks/layer_memory.py --shape 1x65536x1024 --chunks auto,1024,4096 --dtypes bfloat16
    python benchmarks/layer_memory.py --smoke                             # CPU, tiny: that it runs
    python benchmarks/layer_memory.py --plot-from rows.csv --plot trade.png   # time against memory

The plot draws, per dtype and mode, each configuration's step time against its peak memory (x least).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import run
import torch
from torch import Tensor

import mingru
from mingru.layers._common import ScalarGatedLayer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _median_ms(fn: Any, args: argparse.Namespace) -> float:
    """``run.median_ms``: ``do_bench``'s median on CUDA; on the CPU (smoke) the median of three calls."""
    return run.median_ms(fn, cuda=args.device == "cuda", warmup=args.warmup, rep=args.rep)


@contextlib.contextmanager
def _autograd_chunks(on: bool) -> Iterator[None]:
    """Within the block (if ``on``) the scalar layers' recompute chunks run autograd over ``_forward``."""
    if not on:
        yield
        return
    kept = ScalarGatedLayer.__dict__["_chunk_adjoint_ok"]
    ScalarGatedLayer._chunk_adjoint_ok = _never  # type: ignore[method-assign]
    try:
        yield
    finally:
        ScalarGatedLayer._chunk_adjoint_ok = kept  # type: ignore[method-assign]


def _never(self: ScalarGatedLayer) -> bool:
    return False


def step_rows(
    shape: tuple[int, int, int], dtype: torch.dtype, mode: str, chunks: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One row per configuration: single pass, recompute at each chunk length, matrix products alone."""
    device = torch.device(args.device)
    batch, _, dim = shape
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, generator=gen).to(dtype).requires_grad_()
    grad_y = torch.randn(shape, device=device, generator=gen).to(dtype)
    torch.manual_seed(0)
    plain = mingru.MinGRU(dim, mode=mode, bias=False).to(device=device, dtype=dtype)
    weight = plain.proj_in.weight
    least = 4 * x.nbytes + 2 * weight.nbytes  # x, y, their gradients; the weight and its gradient
    base = 2 * x.nbytes + weight.nbytes  # allocated before the step: x, grad_y, the weight

    configs: list[tuple[str, torch.nn.Module, int | None, bool]] = [("single pass", plain, None, False)]
    for chunk in chunks:
        chunk_len = None if chunk == "auto" else int(chunk)
        lean = mingru.MinGRU(dim, mode=mode, bias=False, recompute=True, chunk_len=chunk_len)
        lean = lean.to(device=device, dtype=dtype)
        lean.load_state_dict(plain.state_dict())
        configs.append((f"recompute {chunk}", lean, lean.recompute_chunk_len(batch, dtype), False))
        if args.autograd_chunks:
            label = f"recompute {chunk} (autograd chunks)"
            configs.append((label, lean, lean.recompute_chunk_len(batch, dtype), True))

    rows = []
    reference: list[Tensor] | None = None
    for label, layer, chunk_len, generic in configs:
        params: list[Tensor] = list(layer.parameters())

        def step(
            layer: torch.nn.Module = layer, params: list[Tensor] = params, generic: bool = generic
        ) -> Any:
            with _autograd_chunks(generic):
                return torch.autograd.grad(layer(x)[0], [x, *params], grad_y)

        grads = step()
        if reference is None:
            reference = [g.float() for g in grads]
        error = max(
            ((g.float() - r).abs().max() / r.abs().max()).item()
            for g, r in zip(grads, reference, strict=True)
        )
        del grads
        ms = _median_ms(step, args)
        peak = run.peak_bytes(step, cuda=device.type == "cuda")
        rows.append(
            {
                "config": label,
                "chunk_len": chunk_len if chunk_len is not None else "",
                "ms": ms,
                "mem_x_least": "" if peak is None else (base + peak) / least,
                "peak_mb": "" if peak is None else (base + peak) / 2**20,
                "err_vs_single_pass": error,
            }
        )

    flat = x.detach().reshape(-1, dim)
    grad_pre = torch.randn(flat.shape[0], weight.shape[0], device=device, generator=gen).to(dtype)
    for label, forwards in (("matmuls of the single pass", 1), ("matmuls with recompute", 2)):

        def products(forwards: int = forwards) -> Any:
            for _ in range(forwards):
                flat @ weight.detach().t()
            return grad_pre @ weight.detach(), grad_pre.t() @ flat

        rows.append({"config": label, "ms": _median_ms(products, args)})
    for row in rows:
        row.update(shape="x".join(map(str, shape)), dtype=str(dtype).removeprefix("torch."), mode=mode)
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Step time (ms, log scale) against peak memory (x least), one marker per configuration, one line per
    dtype and mode through the recompute rows (chunk lengths labelled), the single pass as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("mem_x_least") not in (None, ""):
            series.setdefault((str(row["dtype"]), str(row["mode"])), []).append(row)
    for (dtype, mode), points in series.items():
        lean = sorted(
            (p for p in points if str(p["config"]).startswith("recompute")), key=lambda p: float(p["ms"])
        )
        (line,) = axes.plot(
            [float(p["mem_x_least"]) for p in lean],
            [float(p["ms"]) for p in lean],
            marker="o",
            label=f"{dtype} {mode}",
        )
        for p in lean:
            axes.annotate(
                str(p["chunk_len"]),
                (float(p["mem_x_least"]), float(p["ms"])),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        for p in points:
            if p["config"] == "single pass":
                axes.plot(
                    float(p["mem_x_least"]), float(p["ms"]), marker="*", markersize=12, color=line.get_color()
                )
    axes.axvline(1.2, color="grey", linestyle=":", linewidth=1)
    axes.set_yscale("log")
    axes.set_xlabel("peak memory, x the least (dotted: 1.2x)")
    axes.set_ylabel("training step, median ms")
    shape = rows[0]["shape"] if rows else ""
    axes.set_title(f"MinGRU {shape}: single pass (star) and recompute by chunk length", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="8x4096x1024", help="BxTxDIM")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--modes", default="log,linear")
    parser.add_argument("--chunks", default="auto,128,256,512,1024", help="chunk lengths; auto: the default")
    parser.add_argument("--rep", type=int, default=100, help="do_bench rep in ms")
    parser.add_argument("--warmup", type=int, default=25, help="do_bench warmup in ms")
    parser.add_argument(
        "--autograd-chunks",
        action="store_true",
        help="also time each chunk length with autograd over _forward in every chunk's backward",
    )
    parser.add_argument("--csv", type=Path, default=None, help="append the rows to this CSV")
    parser.add_argument("--smoke", action="store_true", help="CPU, 2x48x16, chunks auto,16: that it runs")
    parser.add_argument("--plot", type=Path, default=None, help="draw time against memory into this PNG")
    parser.add_argument("--plot-from", type=Path, default=None, help="only draw --plot from this CSV")
    args = parser.parse_args(argv)
    if args.plot_from is not None:
        if args.plot is None:
            parser.error("--plot-from needs --plot")
        with args.plot_from.open(newline="") as handle:
            plot(list(csv.DictReader(handle)), args.plot)
        return 0
    if args.smoke:
        args.shape, args.chunks, args.device = "2x48x16", "auto,16", "cpu"
    else:
        if not torch.cuda.is_available():
            parser.error("needs a CUDA device (or --smoke)")
        args.device = "cuda"
    try:
        shape = run.parse_shape(args.shape)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--shape: {exc}")
    unknown = set(args.dtypes.split(",")) - set(DTYPES)
    if unknown:
        parser.error(f"--dtypes must be among {sorted(DTYPES)}; got {sorted(unknown)}")
    rows = []
    for name in args.dtypes.split(","):
        for mode in args.modes.split(","):
            rows += step_rows(shape, DTYPES[name], mode, args.chunks.split(","), args)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{device}, torch {torch.__version__}, mingru {mingru.__version__}")
    print("| shape | dtype | mode | config | chunk_len | ms | mem x least | error vs single pass |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        mem = row.get("mem_x_least", "")
        err = row.get("err_vs_single_pass", "")
        mem = mem if mem == "" else f"{mem:.2f}"
        err = err if err == "" else f"{err:.1e}"
        print(
            f"| {row['shape']} | {row['dtype']} | {row['mode']} | {row['config']} | "
            f"{row.get('chunk_len', '')} | {row['ms']:.3f} | {mem} | {err} |"
        )
    if args.plot is not None:
        plot(rows, args.plot)
    if args.csv is not None:
        fields = [
            "device",
            "shape",
            "dtype",
            "mode",
            "config",
            "chunk_len",
            "ms",
            "mem_x_least",
            "peak_mb",
            "err_vs_single_pass",
        ]
        new = not args.csv.exists()
        with args.csv.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
            if new:
                writer.writeheader()
            for row in rows:
                writer.writerow({"device": device, **row})
    return 0


if __name__ == "__main__":
    sys.exit(main())
