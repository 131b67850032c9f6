"""The speed targets, evaluated on one summary row: a list of (text, passed) with passed None for
figures that are only stated."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]
Verdict = list[tuple[str, bool | None]]


def _floor(ours: Row, limit: float) -> tuple[str, bool | None]:
    x = ours.get("x_floor")
    return (f"<= {limit:g}x floor", None if x is None else x <= limit)


def _vs(ours: Row, peer: Row | None, factor: float, what: str) -> tuple[str, bool | None]:
    if peer is None or peer.get("ms") is None or ours.get("ms") is None:
        return (f">= {factor:g}x faster than {what} (no peer time)", None)
    return (f">= {factor:g}x faster than {what}", peer["ms"] / ours["ms"] >= factor)


def evaluate(
    group: str, op: str, shape: tuple[int, ...], dtype: str, mode: str, ours: Row, peers: dict[str, Row]
) -> Verdict:
    """The speed targets for ours (a row with ms, x_floor, peak/least memory) against the timed peers."""
    timed = {name: row for name, row in peers.items() if row.get("ms") is not None}
    best = min(timed.values(), key=lambda r: r["ms"]) if timed else None
    out: Verdict = []
    if group == "k1" and mode in ("fwd", "fwdbwd"):
        long = shape[1] >= 4096
        limit = {"fwd": 1.05 if long else 1.2, "fwdbwd": 1.15 if long else 1.5}[mode]
        out.append(_floor(ours, limit))
        if best is not None and ours.get("ms") is not None:
            out.append(("never slower than the best peer", ours["ms"] <= best["ms"]))
            if best.get("x_floor") is not None and best["x_floor"] > 1.3:
                out.append(_vs(ours, best, 1.3, "the best peer (above 1.3x floor)"))
    elif group == "seed" and op == "linear_scan_fwd" and mode in ("fwd", "fwdbwd"):
        out.append(_floor(ours, 1.1))
    elif group in ("log", "seed") and mode in ("fwd", "fwdbwd"):
        out.append(_floor(ours, 1.15 if mode == "fwd" else 1.3))
    elif group == "accuracy":
        err = ours.get("error")
        if dtype == "float32":
            out.append(("rel. error <= 1e-6", None if err is None else err <= 1e-6))
        else:
            ratio = ours.get("error_x_rounding")
            out.append(("<= 2x the error of rounding to bf16", None if ratio is None else ratio <= 2))
    elif group == "affine" and mode in ("fwd", "fwdbwd"):
        k = shape[3]
        if k <= 16:
            out.append(_floor(ours, 2.0 if mode == "fwd" else 3.0))
            if "torch associative_scan" in timed and mode == "fwd":
                out.append(_vs(ours, timed["torch associative_scan"], 8, "compiled associative_scan"))
        else:
            out.append(("k=32: figures stated", None))
    elif group == "angle" and mode in ("fwd", "fwdbwd"):
        out.append(_floor(ours, 1.5))
        matrix = peers.get("matrices + affine kernel")
        if matrix is not None and matrix.get("ms") is not None:
            out.append(_vs(ours, matrix, 4, "matrices + affine kernel"))
            if ours.get("peak_mb") and matrix.get("peak_mb"):
                out.append((">= 4x less peak memory", matrix["peak_mb"] / ours["peak_mb"] >= 4))
    elif group == "layer" and mode == "fwdbwd":
        out.append(_vs(ours, timed.get("minGRU-pytorch minGRU"), 5, "minGRU-pytorch"))
        out.append(_vs(ours, timed.get("nn.GRU (cuDNN)"), 20, "nn.GRU"))
        if ours.get("mem_x_least") is not None:
            out.append(("peak memory <= 1.2x least", ours["mem_x_least"] <= 1.2))
    return out


def text(verdict: Verdict) -> str:
    """One cell: each target with pass / MISS / '-' (stated only)."""
    marks = {True: "pass", False: "MISS", None: "-"}
    return "; ".join(f"{what}: {marks[ok]}" for what, ok in verdict)
