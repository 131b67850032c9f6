"""Benchmark runner for the mingru scans: median times, effective bandwidth and the measured floor.

For every case (op, shape, dtype, mode) each implementation is first checked against a float64 reference on a
small version of the case (a wrong result is reported as ``wrong`` and not timed), then timed with
``triton.testing.do_bench`` (warm-up, L2 flushed between runs, median). The floor is the time a plain device
copy takes to move the bytes the scan must move at the least (read its inputs, write its outputs; for the
backward: read the output grads and what the backward needs, write the input grads), measured in the same
run. Results are printed as a table and appended to a CSV with the GPU name and versions.

    python benchmarks/bench.py                        # every case, CUDA
    python benchmarks/bench.py --ops linear,log --csv results.csv
    python benchmarks/bench.py --smoke                # tiny shapes on CPU: the eager references only
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import mingru
from mingru.min_gru import _compose_linear, _compose_log
from mingru.scans import (
    affine_scan_ref,
    angle_scan_ref,
    default_angle_layout,
    diag_scan_ref,
    linear_scan_ref,
    parallel_scan_log_ref,
)

Inputs = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark case: ``make(shape, dtype, device)`` builds the inputs, ``impls`` maps a name to a
    function of them, ``reference`` is the exact eager scan; ``bytes_fwd(shape, itemsize)`` and
    ``bytes_bwd`` are the least bytes forward and backward must move."""

    op: str
    shape: tuple[int, ...]
    make: Callable[[tuple[int, ...], torch.dtype, torch.device], Inputs]
    impls: dict[str, Callable[..., Any]]
    reference: Callable[..., Any]
    bytes_fwd: Callable[[tuple[int, ...], int], int]
    bytes_bwd: Callable[[tuple[int, ...], int], int]
    small: tuple[int, ...]
    grad_inputs: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.op} {'x'.join(map(str, self.shape))}"


def _triton_ops() -> Any:
    return mingru.triton_scans


def _gates(shape: Sequence[int], dtype: torch.dtype, device: torch.device, low: float = 0.5) -> Tensor:
    return (torch.rand(shape, device=device) * (1 - low) + low).to(dtype)


def _make_k1(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    return _gates(shape, dtype, device), torch.randn(shape, device=device, dtype=dtype)


def _make_k1_state(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    a, b = _make_k1(shape, dtype, device)
    return a, b, torch.randn(shape[0], shape[2], device=device, dtype=dtype)


def _make_log(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, length, width = shape
    log_coeffs = -torch.nn.functional.softplus(torch.randn(shape, device=device)).to(dtype)
    log_values = torch.randn(batch, length + 1, width, device=device).to(dtype)
    return log_coeffs, log_values


def _make_log_state(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    log_coeffs, log_values = _make_log(shape, dtype, device)
    return (
        log_coeffs,
        log_values[:, 1:].contiguous(),
        torch.randn(shape[0], shape[2], device=device, dtype=dtype),
    )


def _make_affine(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, length, heads, k, v = shape
    A = torch.randn(batch, length, heads, k, k, device=device) / math.sqrt(k) * 0.9
    return A.to(dtype), torch.randn(batch, length, heads, k, v, device=device, dtype=dtype)


def _make_diag(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    return _gates(shape[:4], dtype, device), torch.randn(shape, device=device, dtype=dtype)


def _make_angle(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Inputs:
    batch, length, heads, k, rotations = shape
    perm, sgn, p2p = (t.to(device) for t in default_angle_layout(k, rotations))
    theta = torch.randn(batch, length, heads, rotations, k // 2, device=device, dtype=dtype)
    scale = _gates((batch, length, heads), dtype, device)
    gamma = _gates((batch, length, heads), dtype, device)
    b = torch.randn(batch, length, heads, k, device=device, dtype=dtype)
    h0 = torch.randn(batch, heads, k, device=device, dtype=dtype)
    return theta, scale, gamma, b, h0, perm, sgn.to(dtype), p2p


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _linear_recurrence_ref(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    return _compose_linear(linear_scan_ref, a, b, h0)


def _log_recurrence_ref(log_coeffs: Tensor, log_b: Tensor, h0: Tensor) -> Tensor:
    return _compose_log(parallel_scan_log_ref, log_coeffs, log_b, h0)


def _angle_ref(*args: Any) -> Tensor:
    return angle_scan_ref(*args, has_scale=True, has_decay=True)


def _cases() -> list[Case]:
    ops = _triton_ops
    k1 = (8, 16384, 1024)
    mat = (4, 4096, 16, 16, 16)
    return [
        Case(
            "linear_scan_fwd (A, Bc)",
            k1,
            _make_k1,
            {"mingru": lambda a, b: ops().linear_scan_fwd(a, b), "eager": linear_scan_ref},
            linear_scan_ref,
            lambda s, i: 4 * _numel(s) * i,
            lambda s, i: 7 * _numel(s) * i,
            (2, 300, 33),
            (0, 1),
        ),
        Case(
            "linear recurrence (h0 fused)",
            k1,
            _make_k1_state,
            {
                "mingru": lambda a, b, h0: ops().linear_recurrence_fwd(a, b, h0),
                "eager": _linear_recurrence_ref,
            },
            _linear_recurrence_ref,
            lambda s, i: 3 * _numel(s) * i,
            lambda s, i: 5 * _numel(s) * i,
            (2, 300, 33),
            (0, 1, 2),
        ),
        Case(
            "log recurrence (h0 fused)",
            k1,
            _make_log_state,
            {"mingru": lambda lc, lb, h0: ops().log_recurrence_fwd(lc, lb, h0), "eager": _log_recurrence_ref},
            _log_recurrence_ref,
            lambda s, i: 3 * _numel(s) * i,
            lambda s, i: 5 * _numel(s) * i,
            (2, 300, 33),
            (0, 1, 2),
        ),
        Case(
            "parallel_scan_log_fwd",
            k1,
            _make_log,
            {"mingru": lambda lc, lv: ops().parallel_scan_log_fwd(lc, lv), "eager": parallel_scan_log_ref},
            parallel_scan_log_ref,
            lambda s, i: 3 * _numel(s) * i,
            lambda s, i: 6 * _numel(s) * i,
            (2, 300, 33),
            (0, 1),
        ),
        Case(
            "affine_scan_fwd (Abar, Bbar)",
            mat,
            _make_affine,
            {"mingru": lambda A, Bm: ops().affine_scan_fwd(A, Bm), "eager": affine_scan_ref},
            affine_scan_ref,
            lambda s, i: 2 * _numel(s[:4]) * (s[3] + s[4]) * i,
            lambda s, i: 5 * _numel(s[:4]) * (s[3] + s[4]) * i,
            (2, 37, 2, 16, 16),
            (0, 1),
        ),
        Case(
            "diag_scan_fwd (abar, Bbar)",
            mat,
            _make_diag,
            {"mingru": lambda a, Bm: ops().diag_scan_fwd(a, Bm), "eager": diag_scan_ref},
            diag_scan_ref,
            lambda s, i: 2 * _numel(s[:4]) * (1 + s[4]) * i,
            lambda s, i: 5 * _numel(s[:4]) * (1 + s[4]) * i,
            (2, 37, 2, 16, 16),
            (0, 1),
        ),
        Case(
            "angle_scan_fwd (k=16, R=2)",
            (8, 4096, 16, 16, 2),
            _make_angle,
            {
                "mingru": lambda *x: ops().angle_scan_fwd(*x, 1, 1),
                "eager": _angle_ref,
            },
            _angle_ref,
            lambda s, i: _numel(s[:3]) * (s[4] * s[3] // 2 + 2 * s[3] + 2) * i,
            lambda s, i: _numel(s[:3]) * (2 * (s[4] * s[3] // 2 + 2 * s[3] + 2) + s[3]) * i,
            (2, 37, 2, 16, 2),
            (0, 1, 2, 3, 4),
        ),
    ]


def _outputs(result: Any) -> tuple[Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def _check(case: Case, impl: Callable[..., Any], dtype: torch.dtype, device: torch.device) -> str | None:
    """None when ``impl`` matches the float64 reference on the small case, else a description of the error."""
    torch.manual_seed(0)
    inputs = case.make(case.small, dtype, device)
    expected = _outputs(case.reference(*(_double(x) for x in inputs)))
    got = _outputs(impl(*inputs))
    limit = 1e-4 if dtype in (torch.float32, torch.float64) else 2 * torch.finfo(dtype).eps
    for index, (g, e) in enumerate(zip(got, expected, strict=True)):
        error = ((g.double() - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()
        if not math.isfinite(error) or error > limit:
            return f"output {index}: max error {error:.2e} of the largest magnitude (limit {limit:.0e})"
    return None


def _double(x: Any) -> Any:
    return x.double() if isinstance(x, Tensor) and x.is_floating_point() else x


def _time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _floor_ms(nbytes: int, device: torch.device) -> float:
    """The median time of a device copy that reads nbytes/2 and writes nbytes/2."""
    half = max(nbytes // 2 // 4, 1)
    src = torch.empty(half, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return _time_ms(lambda: dst.copy_(src), device)


def _workload(case: Case, impl: Callable[..., Any], inputs: Inputs, mode: str) -> Callable[[], Any]:
    if mode == "fwd":
        return lambda: impl(*inputs)
    leaves = [x.detach().requires_grad_() if i in case.grad_inputs else x for i, x in enumerate(inputs)]
    wrt = [leaves[i] for i in case.grad_inputs]
    grads = [torch.randn_like(t) for t in _outputs(impl(*leaves))]

    def run() -> Any:
        outs = _outputs(impl(*leaves))
        return torch.autograd.grad(outs, wrt, grads)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated substrings of case names (default: all)")
    parser.add_argument("--dtypes", default="float32", help="comma-separated dtypes (float32,bfloat16)")
    parser.add_argument("--modes", default="fwd,fwdbwd", help="fwd and/or fwdbwd")
    parser.add_argument("--impls", default="mingru,eager", help="implementations to run")
    parser.add_argument("--csv", type=Path, default=None, help="append the rows to this CSV")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, eager only")
    args = parser.parse_args(argv)

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    wanted = [s for s in args.ops.split(",") if s]
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    impl_names = ["eager"] if args.smoke else args.impls.split(",")
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    versions = f"torch {torch.__version__}, mingru {mingru.__version__}"
    if device.type == "cuda":
        import triton

        versions += f", triton {triton.__version__}"
    print(f"# {gpu}; {versions}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    header = ("case", "dtype", "mode", "impl", "median_ms", "GB/s", "x_floor", "floor_ms", "note")
    print(" | ".join(header))
    rows = []
    for case in _cases():
        if wanted and not any(w in case.label for w in wanted):
            continue
        if args.smoke:
            case = dataclasses.replace(case, shape=case.small)
        for dtype in dtypes:
            itemsize = torch.empty((), dtype=dtype).element_size()
            torch.manual_seed(0)
            inputs = case.make(case.shape, dtype, device)
            for mode in args.modes.split(","):
                nbytes = case.bytes_fwd(case.shape, itemsize)
                if mode == "fwdbwd":
                    nbytes += case.bytes_bwd(case.shape, itemsize)
                floor = _floor_ms(nbytes, device)
                for name in impl_names:
                    impl = case.impls[name]
                    error = _check(case, impl, dtype, device)
                    if error is not None:
                        row = (
                            case.label,
                            str(dtype)[6:],
                            mode,
                            name,
                            "",
                            "",
                            "",
                            f"{floor:.4f}",
                            f"wrong: {error}",
                        )
                    else:
                        ms = _time_ms(_workload(case, impl, inputs, mode), device)
                        row = (
                            case.label,
                            str(dtype)[6:],
                            mode,
                            name,
                            f"{ms:.4f}",
                            f"{nbytes / ms / 1e6:.0f}",
                            f"{ms / floor:.2f}",
                            f"{floor:.4f}",
                            "",
                        )
                    rows.append(row)
                    print(" | ".join(row), flush=True)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    if args.csv is not None:
        new = not args.csv.exists()
        with args.csv.open("a", newline="") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(("gpu", "versions", *header))
            writer.writerows((gpu, versions, *row) for row in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
