"""Figures from the benchmark CSV: one PNG per (group, op, dtype, mode), grouped bars per shape.

The y axis is "x floor" (time over the bandwidth floor, log scale) where the case has a floor, else the median
in ms (layers); wrong, failed or skipped implementations get no bar. Accuracy rows are drawn as error bars of
their own figure.

    python benchmarks/plot.py results.csv out/plots            # the latest run in the CSV
    python benchmarks/plot.py results.csv out/plots --run 2026-11-30T10:00:00Z
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _value(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if value in (None, ""):
        return None
    return float(value)


def draw(rows: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """Draw the figures of these rows (one run) into folder; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figures: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        figures.setdefault((row["group"], row["op"], row["dtype"], row["mode"]), []).append(row)
    written = []
    for (group, op, dtype, mode), members in figures.items():
        metric = "error" if mode == "acc" else "x_floor"
        if all(_value(r, metric) is None for r in members):
            metric = "ms"
        shapes = list(dict.fromkeys(r["shape"] for r in members))
        impls = list(dict.fromkeys(r["impl"] for r in members))
        values = {(r["shape"], r["impl"]): _value(r, metric) for r in members}
        if all(v is None for v in values.values()):
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(shapes) * max(1, len(impls)) / 2), 4.0))
        width = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            xs, ys = [], []
            for i, shape in enumerate(shapes):
                v = values.get((shape, impl))
                if v is not None and v > 0:
                    xs.append(i + (j - (len(impls) - 1) / 2) * width)
                    ys.append(v)
            if xs:
                ax.bar(xs, ys, width, label=impl)
        ax.set_xticks(range(len(shapes)), shapes, rotation=20, fontsize=8)
        ax.set_yscale("log")
        label = {"x_floor": "time / bandwidth floor", "ms": "median ms", "error": "error vs float64"}[metric]
        ax.set_ylabel(label)
        if metric == "x_floor":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_title(f"{op}: {dtype}, {mode} ({members[0].get('gpu', '')})", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = re.sub(r"[^A-Za-z0-9]+", "_", f"{group}_{op}_{dtype}_{mode}").strip("_") + ".png"
        path = folder / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--run", default=None, help="run id (default: the latest in the CSV)")
    args = parser.parse_args(argv)
    with args.csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        print("no rows", file=sys.stderr)
        return 1
    run_id = args.run or max(r["run"] for r in rows)
    chosen = [r for r in rows if r["run"] == run_id]
    for row in chosen:
        row["ours"] = int(row["ours"])
    for path in draw(chosen, args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
