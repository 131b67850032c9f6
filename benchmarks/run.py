"""Benchmark runner: mingru's scans and layers side by side with the peers, against the bandwidth floor.

For every case (op or layer, shape, dtype, mode) and every implementation: a check against a float64
reference on a small case first (a wrong result is reported as ``wrong`` and not timed), then the median of
``triton.testing.do_bench`` (warm-up, L2 flushed between runs), the peak memory of one call, the effective
bandwidth and "x floor": the time over that of a device copy moving the least bytes the op must move,
measured in the same run. With ``--graph`` each call is also replayed from a CUDA graph (``gpu_ms``: GPU
time alone, without the host's launch path and without the L2 flush, so inputs that fit in L2 gain from
it): where ``ms`` is well above ``gpu_ms`` the call is bound by host time. Every timed row also has
``host_ms``, the host's time per call (back-to-back calls without waiting for the device): where ``ms`` is
close to it, the host binds the row. Rows append to a CSV (GPU name and
versions on every row); a summary table per case gives ours, the best peer, the ratio, x floor and the speed
targets. Peers missing here are reported as ``not installed``.

    python benchmarks/bench.py --csv out/bench.csv --summary out/summary.md --plots out/plots
    python benchmarks/bench.py --quick                 # a subset of shapes, shorter reps
    python benchmarks/bench.py --groups k1,log --dtypes float32 --no-slow-peers
    python benchmarks/bench.py --list                  # the cases and impls that would run
    python benchmarks/bench.py --warm 8 --cpu 5        # compile everything in 8 processes, then time pinned
    python benchmarks/bench.py --smoke                 # CPU, tiny shapes, Triton interpreter
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import cases as registry
import peers
import targets
import torch
from torch import Tensor

import mingru

FIELDS = (
    "run", "gpu", "torch", "triton", "mingru", "peers", "group", "op", "shape", "dtype", "mode", "impl",
    "ours", "status", "ms", "gbps", "x_floor", "floor_ms", "peak_mb", "least_mb", "mem_x_least", "check_err",
    "error", "error_x_rounding", "first_call_s", "note", "gpu_ms", "gpu_x_floor", "row_s", "host_ms",
)  # fmt: skip

CHECK_LIMIT = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float64: 1e-9}
LAYER_LIMIT = {torch.float32: 5e-3, torch.bfloat16: 6e-2, torch.float16: 1e-2, torch.float64: 1e-9}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(tensors: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, Tensor))


def _double(x: Any) -> Any:
    return x.double() if isinstance(x, Tensor) and x.is_floating_point() else x


def _rel(got: Tensor, expected: Tensor) -> float:
    scale = expected.abs().max().clamp_min(1e-30)
    return float(((got.double() - expected).abs().max() / scale).item())


def median_ms(fn: Callable[[], Any], *, cuda: bool, warmup: int, rep: int, tries: int = 3) -> float:
    """Median time of ``fn`` in ms: ``triton.testing.do_bench`` on CUDA (warm-up, L2 flushed between runs),
    else the median of ``tries`` wall-clock runs."""
    if cuda:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _storages(out: Any, existing: Sequence[Any] = ()) -> int:
    """Bytes of the distinct storages of the tensors in ``out`` (a tensor, or a tuple or list of them), less
    those shared with a tensor of ``existing`` (a gradient returned as the output gradient itself, say)."""
    items = out if isinstance(out, (tuple, list)) else (out,)
    old = {t.untyped_storage().data_ptr() for t in existing if isinstance(t, Tensor)}
    storages = [t.untyped_storage() for t in items if isinstance(t, Tensor)]
    return sum(n for ptr, n in {s.data_ptr(): s.nbytes() for s in storages}.items() if ptr not in old)


def call_memory(fn: Callable[[], Any], *, cuda: bool, existing: Sequence[Any] = ()) -> tuple[int, int] | None:
    """(peak, released) of one call of ``fn`` (None off CUDA): ``peak`` the most bytes allocated during it
    beyond what was allocated before it; ``released`` how many bytes of what ``fn`` returns (less what it
    shares with the tensors of ``existing``, allocated before the call) are missing from what is allocated
    after it: memory allocated before the call and freed during it, which ``peak`` does not see (0 for a
    sound reading). Automatic garbage collection is off during the call."""
    if not cuda:
        return None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    enabled = gc.isenabled()
    gc.disable()
    try:
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        held = torch.cuda.memory_allocated() - before
        returned = _storages(out, existing)
    finally:
        if enabled:
            gc.enable()
    del out
    return peak, max(0, returned - held)


def peak_bytes(fn: Callable[[], Any], *, cuda: bool) -> int | None:
    """Bytes allocated during one call of ``fn`` beyond what was allocated before it (None off CUDA, or
    when memory allocated before the call was freed during it: see :func:`call_memory`)."""
    taken = call_memory(fn, cuda=cuda)
    if taken is None or taken[1] > 0:
        return None
    return taken[0]


def parse_shape(text: str) -> tuple[int, int, int]:
    """A "BxTxD" command-line shape."""
    parts = tuple(int(item) for item in text.lower().split("x"))
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a shape is BxTxD, got {text!r}")
    return parts  # type: ignore[return-value]


def kernels_missing() -> bool:
    """True (after printing why to stderr) when the Triton kernels cannot run in this process."""
    status = mingru.triton_scans.available()
    if status is not True:
        print(f"mingru_triton is not available: {status}", file=sys.stderr)
    return status is not True


def peer_wanted(name: str, cuda: bool) -> bool:
    """Whether to time peer ``name`` (installed, on CUDA); prints why not when not."""
    reason = peers.status(name) if cuda else "not timed off CUDA"
    if reason is not None:
        print(f"{name} rows left out: {reason}")
    return reason is None


def cuda_graph_ms(fn: Callable[[], Any], rep: int) -> tuple[float | None, str]:
    """Median GPU time of ``fn`` replayed from a CUDA graph (``do_bench_cudagraph``, ``rep`` ms), or (None,
    why not) for a call that cannot be captured (host syncs, CPU work, ...)."""
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=rep, return_mode="median")), ""
    except Exception as exc:
        torch.cuda.synchronize()
        return None, f"no CUDA graph ({type(exc).__name__})"


def copy_ms(nbytes: int, device: torch.device, timer: Callable[[Callable[[], Any]], float]) -> float:
    """The bandwidth floor: ``timer`` of a device copy that reads nbytes/2 and writes nbytes/2."""
    src = torch.empty(max(nbytes // 8, 1), dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return timer(lambda: dst.copy_(src))


class Runner:
    def __init__(self, args: argparse.Namespace, started: float | None = None) -> None:
        """``started``: the ``time.perf_counter()`` that ``--budget-min`` counts from (default: now)."""
        self.args = args
        self.device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
        self.cuda = self.device.type == "cuda"
        self.started = time.perf_counter() if started is None else started
        self.compile_spent = 0.0
        self.floors: dict[int, float] = {}
        self.stress_done: set[tuple[str, str, str]] = set()
        self.slow: dict[tuple[str, str, str, str], tuple[float, int]] = {}
        self.rows: list[dict[str, Any]] = []
        self.wall: dict[str, float] = {}  # seconds per group, checks and compiles included
        self.run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        if args.cpu is not None:
            self.run_id += f" cpu {args.cpu}"
        if args.run_id is not None:  # a continuation (:func:`continue_elsewhere`) keeps its parent's id
            self.run_id = args.run_id
        self.env = self._environment()
        self.writer: Any = None
        if args.csv is not None:
            args.csv.parent.mkdir(parents=True, exist_ok=True)
            new = not args.csv.exists() or args.csv.stat().st_size == 0
            if not new:
                with args.csv.open(newline="") as handle:
                    header = next(csv.reader(handle), [])
                if tuple(header) != FIELDS:
                    raise SystemExit(
                        f"--csv: {args.csv} has other columns than this runner writes (expected "
                        f"{len(FIELDS)} columns ending in {FIELDS[-1]!r}, got {len(header)} ending in "
                        f"{header[-1] if header else None!r}); append to a new file"
                    )
            self.handle = args.csv.open("a", newline="")
            self.writer = csv.DictWriter(self.handle, FIELDS)
            if new:
                self.writer.writeheader()

    # ------------------------------------------------------------------------------------- environment

    def _environment(self) -> dict[str, str]:
        try:
            import triton

            triton_version = triton.__version__
        except Exception:
            triton_version = "-"
        gpu = torch.cuda.get_device_name() if self.cuda else f"cpu ({platform.machine()})"
        peer_versions = ", ".join(f"{k} {v}" for k, v in peers.versions().items())
        return {
            "gpu": gpu,
            "torch": torch.__version__,
            "triton": triton_version,
            "mingru": mingru.__version__,
            "peers": peer_versions,
        }

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    # ------------------------------------------------------------------------------------- measuring

    def time_ms(self, fn: Callable[[], Any]) -> float:
        args = self.args
        return median_ms(fn, cuda=self.cuda, warmup=args.warmup, rep=args.rep, tries=1 if args.smoke else 3)

    def graph_ms(self, fn: Callable[[], Any]) -> tuple[float | None, str]:
        """Median GPU time of ``fn`` replayed from a CUDA graph, or (None, why not)."""
        if not self.cuda or not self.args.graph:
            return None, ""
        return cuda_graph_ms(fn, self.args.rep)

    def host_ms(self, fn: Callable[[], Any], calls: int = 5, rounds: int = 3) -> float:
        """Host time of one call of ``fn``: the least over ``rounds`` of ``calls`` back-to-back calls, timed
        from an idle device to the return of the last call, without waiting for the device to finish. A call
        whose ``ms`` is close to this is bound by the host (launches, Python, autograd); one well above it
        by the GPU. On the CPU (smoke runs) every call is synchronous and this is its whole time."""
        best = math.inf
        for _ in range(rounds):
            self.sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls)
        self.sync()
        return best * 1e3

    def floor_ms(self, nbytes: int) -> float:
        """Median time of a device copy reading nbytes/2 and writing nbytes/2 (cached per size)."""
        if nbytes not in self.floors:
            self.floors[nbytes] = copy_ms(nbytes, self.device, self.time_ms)
        return self.floors[nbytes]

    def one_call(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - start

    def call_memory(self, fn: Callable[[], Any], existing: Sequence[Any] = ()) -> tuple[int, int] | None:
        return call_memory(fn, cuda=self.cuda, existing=existing)

    # ------------------------------------------------------------------------------------- callables

    def module_for(
        self, impl: registry.Impl, shape: registry.Shape, dtype: torch.dtype
    ) -> torch.nn.Module | None:
        if impl.layer is None:
            return None
        torch.manual_seed(1)
        return impl.layer(shape[-1]).to(device=self.device, dtype=dtype)

    @staticmethod
    def call(impl: registry.Impl, module: torch.nn.Module | None) -> Callable[..., Any]:
        if module is None:
            return impl.fn
        return lambda *x: impl.fn(module, *x)

    @staticmethod
    def native_grad(case: registry.Case, impl: registry.Impl) -> tuple[int, ...]:
        if impl.grad is not None:
            return impl.grad
        return tuple(i for i in case.grad if i not in impl.no_grad and i != impl.zero_state)

    def canonical(self, case: registry.Case, impl: registry.Impl, shape: registry.Shape, dtype: torch.dtype,
                  maker: Callable[..., registry.Inputs] | None = None) -> list[Any]:  # fmt: skip
        torch.manual_seed(0)
        inputs = list((maker or case.make)(shape, dtype, self.device))
        if impl.zero_state is not None:
            inputs[impl.zero_state] = torch.zeros_like(inputs[impl.zero_state])
        return inputs

    # ------------------------------------------------------------------------------------- checks

    def check(self, case: registry.Case, impl: registry.Impl, dtype: torch.dtype, backward: bool,
              shape: registry.Shape) -> tuple[float, str | None]:  # fmt: skip
        """Largest error (relative to the largest magnitude) of outputs and, with backward, input grads,
        against float64; and a message when above the limit."""
        module = self.module_for(impl, shape, dtype)
        inputs = self.canonical(case, impl, shape, dtype)
        wanted = [i for i in case.grad if i not in impl.no_grad and i != impl.zero_state] if backward else []
        leaves = [x.detach().requires_grad_() if i in wanted else x for i, x in enumerate(inputs)]
        ref_leaves = [
            _double(x).detach().requires_grad_() if i in wanted else _double(x) for i, x in enumerate(inputs)
        ]
        got = impl.restore(self.call(impl, module)(*impl.prepare(*leaves)))
        if module is not None:
            import copy

            twin = copy.deepcopy(module).double()
            expected = registry._tuple(impl.fn(twin, *ref_leaves))
            limit = LAYER_LIMIT[dtype]
        else:
            assert case.reference is not None
            expected = registry._tuple(case.reference(*ref_leaves))
            limit = CHECK_LIMIT[dtype]
        errors = {f"output {i}": _rel(g, e) for i, (g, e) in enumerate(zip(got, expected, strict=True))}
        if wanted:
            torch.manual_seed(2)
            gouts = [torch.randn_like(e) for e in expected]
            grads = torch.autograd.grad(
                got, [leaves[i] for i in wanted], [g.to(o.dtype) for g, o in zip(gouts, got, strict=True)]
            )
            ref_grads = torch.autograd.grad(expected, [ref_leaves[i] for i in wanted], gouts)
            for i, g, e in zip(wanted, grads, ref_grads, strict=True):
                errors[f"grad of input {i}"] = _rel(g, e)
        worst_name = max(errors, key=lambda k: errors[k] if math.isfinite(errors[k]) else math.inf)
        worst = errors[worst_name]
        if not math.isfinite(worst) or worst > limit:
            return worst, f"{worst_name}: error {worst:.2e} of the largest magnitude (limit {limit:.0e})"
        return worst, None

    def stress(self, case: registry.Case, impl: registry.Impl, dtype: torch.dtype) -> str:
        """Forward with gates near 1, twice: the error and whether identical calls agree (a note only)."""
        key = (case.op, impl.name, _dtype_name(dtype))
        if case.stress is None or key in self.stress_done:
            return ""
        self.stress_done.add(key)
        shape = case.stress_shape if (self.cuda and case.stress_shape) else case.tiny
        try:
            inputs = self.canonical(case, impl, shape, dtype, case.stress)
            assert case.reference is not None
            expected = registry._tuple(case.reference(*(_double(x) for x in inputs)))
            with torch.no_grad():
                first = impl.restore(impl.fn(*impl.prepare(*inputs)))
                second = impl.restore(impl.fn(*impl.prepare(*inputs)))
            err = max(_rel(g, e) for g, e in zip(first, expected, strict=True))
            spread = max(_rel(a, b.double()) for a, b in zip(first, second, strict=True))
        except Exception as exc:
            return f"gates near 1: {type(exc).__name__}"
        note = f"gates near 1 {'x'.join(map(str, shape))}: error {err:.1e}"
        if spread > 0:
            note += f", identical calls differ by {spread:.1e}"
        return note

    # ------------------------------------------------------------------------------------- one measurement

    def unavailable(self, case: registry.Case, impl: registry.Impl, shape: registry.Shape, dtype: torch.dtype,
                    mode: str) -> str | None:  # fmt: skip
        args = self.args
        if impl.package is not None and peers.status(impl.package) is not None:
            return peers.status(impl.package)
        if impl.ours and case.group != "layer":
            reason = mingru.triton_scans.available()
            if reason is not True:
                return f"skipped: {reason}"
        if impl.gpu_only and not self.cuda:
            return "skipped: GPU only"
        if impl.slow and args.no_slow_peers:
            return "skipped: --no-slow-peers"
        if impl.dtypes is not None and dtype not in impl.dtypes and not args.full:
            return "skipped: dtype not run for this impl (--full)"
        if mode != "acc" and mode not in impl.modes and not args.full:
            return "skipped: mode not run for this impl (--full)"
        if impl.skip is not None and (why := impl.skip(shape)) and not (args.full and impl.full_lifts_skip):
            return f"{'skipped' if impl.full_lifts_skip else 'n/a'}: {why}"
        if impl.compiled and self.compile_spent > args.compile_budget:
            return f"skipped: compile budget ({args.compile_budget:.0f} s) spent"
        key = (case.op, impl.name, _dtype_name(dtype), mode)
        if key in self.slow:
            ms, numel = self.slow[key]
            projected = ms * math.prod(shape) / numel
            if projected > args.slow_ms * 10:
                return f"skipped: projected {projected / 1e3:.1f} s per call from a smaller shape"
        return None

    def measure(self, case: registry.Case, impl: registry.Impl, shape: registry.Shape, dtype: torch.dtype,
                mode: str) -> dict[str, Any]:  # fmt: skip
        row: dict[str, Any] = {"status": "ok", "note": impl.note}
        notes = [impl.note] if impl.note else []
        backward = mode in ("bwd", "fwdbwd")
        check_shape = case.tiny if self.args.smoke else case.small
        start = time.perf_counter()
        try:
            err, wrong = self.check(case, impl, dtype, backward, check_shape)
        except Exception as exc:
            return {"status": f"error in check: {type(exc).__name__}: {str(exc)[:200]}", "note": impl.note}
        finally:
            if impl.compiled:
                self.compile_spent += time.perf_counter() - start
        row["check_err"] = err
        if (stress := self.stress(case, impl, dtype)) != "":
            notes.append(stress)
        row["note"] = "; ".join(notes)
        if mode == "acc":  # the accuracy is the measurement: taken even when the small check fails
            if wrong is not None:
                row["note"] = "; ".join([*notes, f"small check: {wrong}"])
            return {**row, **self.accuracy(case, impl, shape, dtype)}
        if wrong is not None:
            row["status"] = f"wrong: {wrong}"
            return row
        module = self.module_for(impl, shape, dtype)
        inputs = self.canonical(case, impl, shape, dtype)
        with torch.no_grad():
            native = list(impl.prepare(*inputs))
        del inputs
        params = list(module.parameters()) if module is not None else []
        call = self.call(impl, module)
        gidx = self.native_grad(case, impl)
        if mode == "fwd":

            def fn() -> Any:
                with torch.no_grad():
                    return call(*native)

            base = _nbytes(native) + _nbytes(params)
            existing = [*native, *params]
        else:
            native = [x.detach().requires_grad_() if i in gidx else x for i, x in enumerate(native)]
            wrt = [native[i] for i in gidx] + params
            outs = registry._tuple(call(*native))
            gouts = [torch.randn_like(o) for o in outs]
            if mode == "fwdbwd":
                del outs

                def fn() -> Any:
                    return torch.autograd.grad(registry._tuple(call(*native)), wrt, gouts)

            else:

                def fn() -> Any:
                    return torch.autograd.grad(outs, wrt, gouts, retain_graph=True)

            base = _nbytes(native) + _nbytes(params) + _nbytes(gouts)
            existing = [*native, *params, *gouts]
        start = time.perf_counter()
        first, first_s = self.one_call(fn)
        if impl.compiled:
            self.compile_spent += time.perf_counter() - start
        row["first_call_s"] = first_s
        # the least: inputs and parameters, outputs; with backward also output grads and input grads
        least = _nbytes(native) + _nbytes(params) + _nbytes(registry._tuple(first))
        if mode != "fwd":
            least += 2 * _nbytes(gouts)
        del first
        second, second_s = self.one_call(fn)
        del second
        if second_s * 1e3 > self.args.slow_ms:
            ms = second_s * 1e3
            row["note"] = "; ".join([*notes, "one timed call (slow)"])
            self.slow[(case.op, impl.name, _dtype_name(dtype), mode)] = (ms, math.prod(shape))
        else:
            ms = self.time_ms(fn)
            row["host_ms"] = self.host_ms(fn)
            gpu_ms, why = self.graph_ms(fn)
            if gpu_ms is not None:
                row["gpu_ms"] = gpu_ms
            elif why:
                row["note"] = "; ".join([*notes, why])
        memory = self.call_memory(fn, existing)
        row["ms"] = ms
        if memory is not None and memory[1] > 0:
            # the peak would miss what was freed: no figure, and the reason
            freed = f"{memory[1] / 2**20:.0f} MB"
            why = f"peak memory not taken: {freed} allocated before the call were freed during it"
            row["note"] = "; ".join(x for x in (row.get("note"), why) if x)
        elif memory is not None:
            row["peak_mb"] = (base + memory[0]) / 2**20
            row["least_mb"] = least / 2**20
            row["mem_x_least"] = (base + memory[0]) / least
        if case.bytes_fwd is not None and case.bytes_bwd is not None:
            itemsize = torch.empty((), dtype=dtype).element_size()
            nbytes = {
                "fwd": case.bytes_fwd(shape, itemsize),
                "bwd": case.bytes_bwd(shape, itemsize),
                "fwdbwd": case.bytes_fwd(shape, itemsize) + case.bytes_bwd(shape, itemsize),
            }[mode]
            floor = self.floor_ms(nbytes)
            row.update(gbps=nbytes / ms / 1e6, x_floor=ms / floor, floor_ms=floor)
            if row.get("gpu_ms") is not None:
                row["gpu_x_floor"] = row["gpu_ms"] / floor
        return row

    def accuracy(self, case: registry.Case, impl: registry.Impl, shape: registry.Shape,
                 dtype: torch.dtype) -> dict[str, Any]:  # fmt: skip
        """Error at the full shape against float64: element-wise relative for positive outputs; for half types
        also over the error of rounding the exact answer to that type."""
        inputs = self.canonical(case, impl, shape, dtype)
        with torch.no_grad():
            got = impl.restore(impl.fn(*impl.prepare(*inputs)))[0].double()
            assert case.reference is not None
            exact = registry._tuple(case.reference(*(_double(x) for x in inputs)))[0]

        def err(x: Tensor) -> float:
            if case.positive:
                return float(((x - exact).abs() / exact.abs().clamp_min(1e-300)).max().item())
            return _rel(x, exact)

        out: dict[str, Any] = {"error": err(got)}
        if dtype != torch.float32 and dtype != torch.float64:
            rounding = err(exact.to(dtype).double())
            out["error_x_rounding"] = out["error"] / max(rounding, 1e-300)
        return out

    # ------------------------------------------------------------------------------------- the loop

    def emit(self, case: registry.Case, shape: registry.Shape, dtype: torch.dtype, mode: str,
             impl: registry.Impl, row: dict[str, Any]) -> None:  # fmt: skip
        full = {
            "run": self.run_id,
            **self.env,
            "group": case.group,
            "op": case.op,
            "shape": "x".join(map(str, shape)),
            "dtype": _dtype_name(dtype),
            "mode": mode,
            "impl": impl.name,
            "ours": int(impl.ours),
            **row,
        }
        self.rows.append(full)
        if self.writer is not None:
            self.writer.writerow({k: _fmt(full.get(k)) for k in FIELDS})
            self.handle.flush()
        cells = [full["group"], f"{case.op} {full['shape']}", full["dtype"], mode, impl.name, full["status"]]
        for key, spec in (("ms", ".4f"), ("x_floor", ".2f"), ("gbps", ".0f"), ("mem_x_least", ".2f"),
                          ("error", ".1e"), ("error_x_rounding", ".2f"), ("row_s", ".1f")):  # fmt: skip
            if full.get(key) is not None:
                cells.append(f"{key}={format(full[key], spec)}")
        if full.get("note"):
            cells.append(full["note"])
        print(" | ".join(cells), flush=True)

    def run(self, selected: list[registry.Case]) -> None:
        """Measure every (case, dtype, mode, impl) of ``selected`` in order, one row each, skipping the first
        ``--after`` (done by an earlier process of the run). Raises :class:`ContextLost` after the row whose
        error left the device unusable."""
        try:
            self._run(selected)
        finally:
            gc.unfreeze()  # so that what the run leaves is collected at exit as usual

    def _run(self, selected: list[registry.Case]) -> None:
        args = self.args
        place = 0
        for case in selected:
            shape = case.tiny if args.smoke else case.shape
            for dtype in case.dtypes:
                if _dtype_name(dtype) not in args.dtypes:
                    continue
                for mode in case.modes:
                    if mode not in args.modes:
                        continue
                    for impl in case.impls:
                        if not _impl_selected(impl, args):
                            continue
                        place += 1
                        if place <= args.after:
                            continue
                        started = time.perf_counter()
                        lost: BaseException | None = None
                        if self.elapsed() > args.budget_min * 60:
                            row = {"status": f"skipped: time budget ({args.budget_min:g} min) spent"}
                        elif (why := self.unavailable(case, impl, shape, dtype, mode)) is not None:
                            row = {"status": why, "note": impl.note}
                        else:
                            try:
                                if place == args.simulate_lost_context:
                                    raise RuntimeError(f"CUDA error: {LOST_CONTEXT[0]} (simulated)")
                                row = self.measure(case, impl, shape, dtype, mode)
                            except Exception as exc:
                                row = {"status": f"error: {type(exc).__name__}: {str(exc)[:200]}"}
                                lost = exc if context_lost(exc) else None
                        try:
                            self.release()
                        except Exception as exc:  # the device's error surfaced after the row
                            if not context_lost(exc):
                                raise
                            lost = lost or exc
                            row = {"status": f"error: {type(exc).__name__}: {str(exc)[:200]}"}
                        if lost is not None:
                            row["status"] += "; the device context is lost: the run goes on in a new process"
                        row["row_s"] = time.perf_counter() - started
                        self.wall[case.group] = self.wall.get(case.group, 0.0) + row["row_s"]
                        self.emit(case, shape, dtype, mode, impl, row)
                        if lost is not None:
                            raise ContextLost(place)

    def release(self) -> None:
        """Free what the last row left in reference cycles, then freeze the survivors: a full collection
        over torch's, Triton's and Inductor's objects took 0.15-0.2 s, and the runner collects twice per
        row (here and before the peak-memory call), so later collections scan only the objects made
        since. What is alive here stays alive (caches, compiled kernels, the rows)."""
        gc.collect()
        gc.freeze()
        if self.cuda:
            torch.cuda.empty_cache()


def _fmt(value: Any) -> Any:
    if isinstance(value, bool):  # "ours" of a continuation's typed rows: written as the runner writes it
        return int(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def _impl_selected(impl: registry.Impl, args: argparse.Namespace) -> bool:
    if args.impls and not any(s in impl.name for s in args.impls):
        return False
    return not (args.skip_impls and any(s in impl.name for s in args.skip_impls))


def select(args: argparse.Namespace) -> list[registry.Case]:
    chosen = []
    seen: set[tuple[str, str]] = set()
    for case in registry.build(eager=args.eager, full=args.full):
        if args.groups and case.group not in args.groups:
            continue
        if args.ops and not any(s in case.label for s in args.ops):
            continue
        if args.quick and not case.quick:
            continue
        if args.smoke:  # one shape per op
            key = (case.group, case.op.split()[0])
            if key in seen:
                continue
            seen.add(key)
        chosen.append(case)
    if args.shard is not None:
        index, count = args.shard
        chosen = chosen[index::count]
    return chosen


# ----------------------------------------------------------------------------------------- summary


def summarize(rows: list[dict[str, Any]], with_targets: bool = True) -> list[dict[str, Any]]:
    """One line per (case, dtype, mode, one of ours): ours, the best peer, the ratio, x floor, targets."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["group"], row["op"], row["shape"], row["dtype"], row["mode"])
        groups.setdefault(key, []).append(row)
    lines = []
    for (group, op, shape, dtype, mode), members in groups.items():
        timed = {r["impl"]: _metrics(r) for r in members if not r["ours"]}
        peer_ok = {n: m for n, m in timed.items() if m.get("ms") is not None or m.get("error") is not None}
        if mode == "acc":
            best_name = min(peer_ok, key=lambda n: peer_ok[n]["error"], default=None)
        else:
            best_name = min(
                (n for n in peer_ok if peer_ok[n].get("ms") is not None),
                key=lambda n: peer_ok[n]["ms"],
                default=None,
            )
        best = timed.get(best_name) if best_name else None
        for ours_row in (r for r in members if r["ours"]):
            ours = _metrics(ours_row)
            shape_t = tuple(int(s) for s in shape.split("x"))
            verdict = (
                targets.evaluate(group, op, shape_t, dtype, mode, ours, timed)
                if with_targets and ours_row["status"] == "ok"
                else []
            )
            ratio = None
            if best is not None and best.get("ms") and ours.get("ms"):
                ratio = best["ms"] / ours["ms"]
            lines.append({
                "case": f"{op} {shape}", "dtype": dtype, "mode": mode, "ours": ours_row["impl"],
                "status": ours_row["status"], "ms": ours.get("ms"), "host_ms": ours.get("host_ms"),
                "x_floor": ours.get("x_floor"),
                "gpu_ms": ours.get("gpu_ms"), "gpu_x_floor": ours.get("gpu_x_floor"),
                "mem_x_least": ours.get("mem_x_least"), "error": ours.get("error"),
                "best_peer": best_name or "-", "peer_ms": best.get("ms") if best else None,
                "peer_x_floor": best.get("x_floor") if best else None,
                "peer_error": best.get("error") if best else None, "speedup": ratio,
                "targets": targets.text(verdict), "passed": all(ok is not False for _, ok in verdict),
                "peers": {n: _peer_cell(r) for n, r in ((r["impl"], r) for r in members if not r["ours"])},
            })  # fmt: skip
    return lines


def _metrics(row: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "ms", "host_ms", "x_floor", "gpu_ms", "gpu_x_floor", "peak_mb", "mem_x_least", "error",
        "error_x_rounding",
    )  # fmt: skip
    return {k: row.get(k) for k in keys}


def _peer_cell(row: dict[str, Any]) -> str:
    if row.get("ms") is not None:
        return f"{row['ms']:.3f} ms"
    if row.get("error") is not None:
        return f"err {row['error']:.1e}"
    return str(row.get("status", ""))[:60]


def _num(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(
    lines: list[dict[str, Any]], env: dict[str, str], run_id: str, rows: Sequence[dict[str, Any]] = ()
) -> str:
    out = [
        f"Run {run_id} on {env['gpu']}; torch {env['torch']}, triton {env['triton']}, "
        f"mingru {env['mingru']}; peers: {env['peers']}",
        "",
        "| case | dtype | mode | ours | ours ms | host ms | x floor | GPU ms | GPU x floor | best peer | "
        "peer ms | peer x floor | peer/ours | mem x least | targets |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: "
        "| --- |",
    ]
    for ln in lines:
        if ln["mode"] == "acc":
            ours_ms = f"err {_num(ln['error'], '.1e')}"
            peer_ms = f"err {_num(ln['peer_error'], '.1e')}"
        else:
            ours_ms = _num(ln["ms"], ".4f") if ln["status"] == "ok" else ln["status"][:40]
            peer_ms = _num(ln["peer_ms"], ".4f")
        out.append(
            f"| {ln['case']} | {ln['dtype']} | {ln['mode']} | {ln['ours']} | {ours_ms} | "
            f"{_num(ln['host_ms'] if ln['mode'] != 'acc' else None, '.4f')} | "
            f"{_num(ln['x_floor'], '.2f')} | {_num(ln['gpu_ms'], '.4f')} | "
            f"{_num(ln['gpu_x_floor'], '.2f')} | {ln['best_peer']} | {peer_ms} | "
            f"{_num(ln['peer_x_floor'], '.2f')} | {_num(ln['speedup'], '.2f')} | "
            f"{_num(ln['mem_x_least'], '.2f')} | {ln['targets']} |"
        )
    passed = sum(1 for ln in lines if ln["passed"] and ln["targets"])
    missed = sum(1 for ln in lines if not ln["passed"])
    out += ["", f"targets: {passed} lines pass, {missed} lines miss"]
    peers_seen = sorted({p for ln in lines for p in ln["peers"]})
    if peers_seen:
        out += ["", "Peers per case (median ms, or status):", ""]
        out.append("| case | dtype | mode | " + " | ".join(peers_seen) + " |")
        out.append("| --- | --- | --- | " + " | ".join("---" for _ in peers_seen) + " |")
        done = set()
        for ln in lines:
            key = (ln["case"], ln["dtype"], ln["mode"])
            if key in done or not ln["peers"]:
                continue
            done.add(key)
            cells = [ln["peers"].get(p, "") for p in peers_seen]
            out.append(f"| {ln['case']} | {ln['dtype']} | {ln['mode']} | " + " | ".join(cells) + " |")
    stress = {}
    for row in rows:
        for part in str(row.get("note") or "").split("; "):
            if part.startswith("gates near 1"):
                stress[(row["op"], row["impl"], row["dtype"])] = part
    if stress:
        out += ["", "Forward with gates in [0.999, 1), two identical calls (a note, not a gate):", ""]
        out += [f"- {op}, {impl}, {dtype}: {note}" for (op, impl, dtype), note in stress.items()]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------- CLI


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    def listed(text: str) -> list[str]:
        return [s.strip() for s in text.split(",") if s.strip()]

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--groups", type=listed, default=[], help="k1,log,gated,accuracy,affine,angle,layer,seed,diag"
    )
    parser.add_argument("--ops", type=listed, default=[], help="substrings of case labels (op and shape)")
    parser.add_argument("--dtypes", type=listed, default=["float32", "bfloat16"])
    parser.add_argument("--modes", type=listed, default=["fwd", "fwdbwd", "acc"], help="fwd,bwd,fwdbwd,acc")
    parser.add_argument(
        "--impls", type=listed, default=[], help="substrings of impl names to run (default all)"
    )
    parser.add_argument("--skip-impls", type=listed, default=[], help="substrings of impl names to skip")
    parser.add_argument(
        "--no-slow-peers", action="store_true", help="skip torch.compile'd and eager baselines"
    )
    parser.add_argument("--eager", action="store_true", help="add mingru's eager references as baselines")
    parser.add_argument(
        "--full",
        action="store_true",
        help="every peer at every shape, dtype and mode (slow: compile, autotune)",
    )
    parser.add_argument("--quick", action="store_true", help="a subset of shapes, rep 30 ms")
    parser.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (default 60; quick 30)")
    parser.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (default 20)")
    parser.add_argument(
        "--slow-ms", type=float, default=300.0, help="one call slower than this is timed once"
    )
    parser.add_argument(
        "--compile-budget", type=float, default=150.0, help="seconds of torch.compile in total"
    )
    parser.add_argument(
        "--budget-min", type=float, default=8.5, help="skip what is left after this many minutes"
    )
    parser.add_argument(
        "--graph",
        action="store_true",
        help="also replay each call from a CUDA graph (the GPU ms column); its first H200 run stopped with a "
        "CUDA illegal memory access at accelerated-scan's row, which that peer also raised twice without "
        "--graph (docs/benchmarks.md, rounds 4 and 5)",
    )
    parser.add_argument(
        "--cpu",
        type=int,
        default=None,
        metavar="N",
        help="run on host CPU core N alone (Linux), autograd's device thread included: host-bound rows "
        "change with it (docs/benchmarks.md, round 5), so the run id names the core",
    )
    parser.add_argument("--csv", type=Path, default=None, help="append the rows to this CSV")
    parser.add_argument("--summary", type=Path, default=None, help="write the summary table (markdown) here")
    parser.add_argument(
        "--plots", type=Path, default=None, help="draw the figures of this run into this folder"
    )
    parser.add_argument(
        "--summary-from",
        type=Path,
        default=None,
        help="run nothing: rebuild the summary of the latest run in this CSV (e.g. one cut short)",
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        metavar="N",
        help="first run the same selection in N processes at once, one shard each, with the shortest timing "
        "(--rep 1 --warmup 1, output discarded), so that Triton's and Inductor's caches hold every kernel "
        "before the timed run; their time counts against --budget-min",
    )
    parser.add_argument(
        "--shard",
        type=_shard,
        default=None,
        metavar="I/N",
        help="run only the cases whose place in the selection is I modulo N (what --warm gives each process)",
    )
    parser.add_argument(
        "--run-id", default=None, help="the run id of the rows (default: the start time and --cpu core)"
    )
    parser.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="N",
        help="skip the first N measurements of the selection (a run that goes on in a new process after a "
        "CUDA error left the device unusable starts it with the rows written so far)",
    )
    parser.add_argument(
        "--simulate-lost-context",
        type=int,
        default=0,
        metavar="N",
        help="the N-th measurement fails as if the device were lost (tests the continuation; 0: never)",
    )
    parser.add_argument("--list", action="store_true", help="list the cases and impls, run nothing")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU, tiny shapes, kernels under TRITON_INTERPRET"
    )
    args = parser.parse_args(argv)
    if args.cpu is not None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if args.cpu not in allowed:
            parser.error(f"--cpu must be one of the cores this process may run on {allowed}, got {args.cpu}")
    if args.warm < 0:
        parser.error(f"--warm must be a count of processes >= 0, got {args.warm}")
    if args.after < 0 or args.simulate_lost_context < 0:
        got = f"{args.after} and {args.simulate_lost_context}"
        parser.error(f"--after and --simulate-lost-context must be >= 0, got {got}")
    if args.rep is None:
        args.rep = 30.0 if args.quick else 60.0
    if args.warmup is None:
        args.warmup = 10.0 if args.quick else 20.0
    return args


def _shard(text: str) -> tuple[int, int]:
    """``I/N`` -> (I, N) with 0 <= I < N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (two integers, e.g. 0/4), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"expected I/N with N >= 1 and 0 <= I < N, got {text!r}")
    return index, count


LOST_CONTEXT = (
    "an illegal memory access was encountered",
    "an illegal instruction was encountered",
    "misaligned address",
    "unspecified launch failure",
    "device-side assert triggered",
)
"""CUDA errors after which the process's device context is unusable: every later call fails with them."""
EXIT_LOST = 75
"""Exit code of a continuation process that lost its device context in turn."""


def context_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the sticky CUDA errors of :data:`LOST_CONTEXT`."""
    text = str(exc)
    return any(what in text for what in LOST_CONTEXT)


class ContextLost(Exception):
    """A row's error left the device unusable in this process; ``done`` measurements of the selection are
    behind it (its own included)."""

    def __init__(self, done: int) -> None:
        super().__init__(f"device context lost after {done} measurements")
        self.done = done


# options a continuation does not take from its parent: it is told where to start, for how long and where
# to write; the parent draws the summary and plots
_NOT_CONTINUED = {
    "--warm": 1, "--budget-min": 1, "--csv": 1, "--summary": 1, "--plots": 1, "--run-id": 1, "--after": 1,
    "--simulate-lost-context": 1,
}  # fmt: skip


def continue_elsewhere(argv: Sequence[str], runner: Runner, done: int) -> list[dict[str, Any]]:
    """The rest of the run after a lost device context, in new processes (each starts after the rows
    written so far, with what is left of ``--budget-min``), until one ends without losing it or no
    measurement is left. Returns their rows, typed as :func:`rows_from_csv` gives them."""
    folder = Path(tempfile.mkdtemp(prefix="bench-continued-"))
    table = folder / "rows.csv"
    script = Path(__file__).with_name("bench.py")
    while True:
        left = (runner.args.budget_min * 60 - runner.elapsed()) / 60
        cmd = [sys.executable, str(script), *_without(argv, _NOT_CONTINUED), "--csv", str(table)]
        cmd += ["--run-id", runner.run_id, "--after", str(done), "--budget-min", f"{max(left, 0.0):.4f}"]
        print(f"# continuing in a new process after {done} measurements, {left:.1f} min left", flush=True)
        code = subprocess.run(cmd, check=False).returncode
        rows = rows_of_run(table, runner.run_id) if table.exists() else []
        if code != EXIT_LOST:
            if code != 0:
                print(f"# the continuation exited {code}", flush=True)
            return rows
        now = runner.args.after + len(runner.rows) + len(rows)
        if now <= done:
            print("# the continuation lost the device before its first row; stopping", flush=True)
            return rows
        done = now


# options a warm-up process does not take from its parent: timing, outputs, pinning, sharding, warming
_NOT_INHERITED = {
    "--warm": 1, "--shard": 1, "--rep": 1, "--warmup": 1, "--budget-min": 1, "--cpu": 1, "--csv": 1,
    "--summary": 1, "--plots": 1, "--graph": 0,
}  # fmt: skip


def _inherited(argv: Sequence[str]) -> list[str]:
    """``argv`` without the options in ``_NOT_INHERITED`` (``--opt value`` and ``--opt=value`` forms)."""
    return _without(argv, _NOT_INHERITED)


def _without(argv: Sequence[str], options: dict[str, int]) -> list[str]:
    """``argv`` without ``options`` (name -> how many values follow it; ``--opt=value`` forms too)."""
    out: list[str] = []
    skip = 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in options:
            skip = 0 if "=" in arg else options[name]
            continue
        out.append(arg)
    return out


def warm_caches(argv: Sequence[str], count: int, minutes: float) -> int:
    """Run the selection of ``argv`` in ``count`` processes at once (shard i of ``count`` each, do_bench at
    its shortest, output to files), so that the timed run finds every kernel compiled and every compiled
    peer's graph in the caches. Stops them after ``minutes``; a process that fails costs the timed run only
    compile time, so failures are reported, not raised. Returns how many did not exit 0."""
    script = Path(__file__).with_name("bench.py")
    base = [sys.executable, str(script), *_inherited(argv), "--rep", "1", "--warmup", "1"]
    base += ["--budget-min", f"{minutes:g}"]
    folder = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    started = time.perf_counter()
    procs = []
    failed = 0
    for index in range(count):
        log = (folder / f"shard{index}.log").open("w")
        cmd = [*base, "--shard", f"{index}/{count}"]
        procs.append((index, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    for index, proc, log in procs:
        left = max(1.0, minutes * 60 + 30 - (time.perf_counter() - started))
        try:
            code: int | str = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = "stopped"
        log.close()
        failed += code != 0
        print(f"# warm-up shard {index}/{count}: exit {code} at {time.perf_counter() - started:.0f} s "
              f"(log {folder / f'shard{index}.log'})", flush=True)  # fmt: skip
    return failed


def list_cases(selected: list[registry.Case], args: argparse.Namespace) -> None:
    count = 0
    for case in selected:
        dtypes = [d for d in case.dtypes if _dtype_name(d) in args.dtypes]
        modes = [m for m in case.modes if m in args.modes]
        impls = [i for i in case.impls if _impl_selected(i, args)]
        n = len(dtypes) * len(modes) * len(impls)
        count += n
        print(f"{case.group:8} {case.label:42} {','.join(map(_dtype_name, dtypes)):17} {','.join(modes):12} "
              f"{len(impls)} impls: {', '.join(i.name for i in impls)}")  # fmt: skip
    print(f"{len(selected)} cases, {count} (impl, dtype, mode) measurements at most")


def rows_from_csv(path: Path) -> tuple[str, dict[str, str], list[dict[str, Any]]]:
    """(run id, environment, rows) of the latest run in a CSV written by ``--csv``, typed as in a run."""
    with path.open(newline="") as handle:
        found = list(csv.DictReader(handle))
    if not found:
        raise SystemExit(f"--summary-from: {path} has no rows")
    run_id = max(r["run"] for r in found)
    env = {key: found[-1][key] for key in ("gpu", "torch", "triton", "mingru", "peers")}
    return run_id, env, _typed(r for r in found if r["run"] == run_id)


def rows_of_run(path: Path, run_id: str) -> list[dict[str, Any]]:
    """The rows of run ``run_id`` in a CSV written by ``--csv``, typed as in a run."""
    with path.open(newline="") as handle:
        return _typed(r for r in csv.DictReader(handle) if r["run"] == run_id)


def _typed(found: Iterable[dict[str, str]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for raw in found:
        row: dict[str, Any] = dict(raw)
        for key, value in raw.items():
            if key in _TEXT_FIELDS or key == "ours":
                continue
            row[key] = None if value == "" else float(value)
        # "1"/"0"; "True"/"False" in CSVs whose continued rows were written before _fmt took bools
        row["ours"] = raw["ours"] in ("1", "True")
        rows.append(row)
    return rows


_TEXT_FIELDS = frozenset(
    ("run", "gpu", "torch", "triton", "mingru", "peers", "group", "op", "shape", "dtype", "mode", "impl",
     "status", "note")
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.summary_from is not None:
        run_id, env, rows = rows_from_csv(args.summary_from)
        on_cpu = env["gpu"].startswith("cpu")  # a smoke run: tiny shapes, no targets
        table = render(summarize(rows, with_targets=not on_cpu), env, run_id, rows)
        print(table)
        if args.summary is not None:
            args.summary.write_text(table + "\n")
        return 0
    if args.smoke:
        peers.COMPILE["enabled"] = False
    started = time.perf_counter()
    warm_failed = 0
    if args.warm and not args.list:  # before pinning: the processes would inherit the one core
        warm_failed = warm_caches(sys.argv[1:] if argv is None else argv, args.warm, args.budget_min / 2)
    if args.cpu is not None:  # before the first backward starts autograd's device threads, which inherit it
        os.sched_setaffinity(0, {args.cpu})
    selected = select(args)
    if args.list:
        list_cases(selected, args)
        return 0
    runner = Runner(args, started)  # the warm-up counts against --budget-min
    env = runner.env
    print(
        f"# {runner.run_id}; {env['gpu']}; torch {env['torch']}, triton {env['triton']}, "
        f"mingru {env['mingru']}; peers: {env['peers']}; python {platform.python_version()}",
        flush=True,
    )
    if runner.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        runner.run(selected)
    except ContextLost as lost:
        if args.after > 0:  # a continuation: its parent starts the next one
            return EXIT_LOST
        more = continue_elsewhere(sys.argv[1:] if argv is None else argv, runner, lost.done)
        if runner.writer is not None:
            for row in more:
                runner.writer.writerow({k: _fmt(row.get(k)) for k in FIELDS})
            runner.handle.flush()
        runner.rows.extend(more)
    if args.after > 0:  # a continuation: the rows are in its CSV, its parent draws the summary
        return 0
    lines = summarize(runner.rows, with_targets=not args.smoke)
    table = render(lines, env, runner.run_id, runner.rows)
    print("\n## Summary\n")
    print(table)
    print(
        f"\n# wall {runner.elapsed():.0f} s, torch.compile and first calls of compiled peers "
        f"{runner.compile_spent:.0f} s; by group: "
        + ", ".join(f"{group} {seconds:.0f} s" for group, seconds in runner.wall.items())
    )
    if args.summary is not None:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(table + "\n")
    if args.plots is not None:
        try:
            import plot

            plot.draw(runner.rows, args.plots)
        except Exception as exc:
            print(f"# plots failed: {type(exc).__name__}: {exc}")
    bad = [r for r in runner.rows if r["ours"] and r["status"].startswith(("wrong", "error"))]
    if args.smoke and bad:
        print(f"# smoke: {len(bad)} of ours wrong or failing", file=sys.stderr)
        return 1
    if args.smoke and warm_failed:
        print(f"# smoke: {warm_failed} warm-up processes failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if "--smoke" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
