"""GPU time of the kernels that take the FAST flag, with it and under ``plain_math()``, in one process.

The fused MinGRU/MinLSTM gates (``mingru::gated_recurrence_fwd``/``_bwd``) and the log recurrence on the k = 1
single pass (``log_recurrence_fwd`` and its adjoint) compute exponentials and reciprocals per element. FAST
gives them as single ``.ftz`` instructions (``mingru_triton._math``); ``plain_math()`` gives Triton's own
``tl.exp`` and division. For each shape, dtype and op this prints the median GPU time of both
(``triton.testing.do_bench_cudagraph``: replayed from a CUDA graph), their ratio, and whether the two gave the
same bits (the outputs of one call each).

    python benchmarks/fast_math.py                                   # on a CUDA machine
    python benchmarks/fast_math.py --shapes 8x16384x1024 --dtypes bfloat16 --rep 50
    python benchmarks/fast_math.py --smoke                           # CPU, interpreter: runs, times nothing
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import run
import torch
import torch.nn.functional as F
from torch import Tensor

from mingru_triton import gated, log
from mingru_triton._launch import plain_math

SHAPES = "8x4096x1024,8x16384x1024"


def calls(
    shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device
) -> dict[str, Callable[[], Any]]:
    """op name -> a zero-argument call on inputs of ``shape`` (B, T, H) in ``dtype``; each returns tensors."""
    gen = torch.Generator(device=device).manual_seed(0)
    batch, steps, hidden = shape

    def randn(*size: int) -> Tensor:
        return torch.randn(size, device=device, generator=gen)

    h0 = randn(batch, hidden)
    grad = randn(batch, steps, hidden)
    found: dict[str, Callable[[], Any]] = {}
    for kind in ("gru-log", "lstm-log"):
        code = list(gated.KINDS).index(kind)
        pre = randn(batch, steps, gated.branches(code) * hidden).mul_(2).to(dtype)
        h = gated.gated_recurrence_fwd(pre, h0, code)
        found[f"{kind} fwd"] = lambda pre=pre, code=code: gated.gated_recurrence_fwd(pre, h0, code)
        found[f"{kind} adjoint"] = lambda pre=pre, code=code, h=h: gated.gated_recurrence_bwd(
            pre, h0, h, grad, code
        )
    lc = (-F.softplus(randn(batch, steps, hidden))).to(dtype)
    lb = (randn(batch, steps, hidden) - 1).to(dtype)
    h0_log = h0.to(dtype)
    h_log = log.log_recurrence_fwd(lc, lb, h0_log)
    found["log fwd"] = lambda: log.log_recurrence_fwd(lc, lb, h0_log)
    found["log adjoint"] = lambda: log.log_recurrence_bwd(lc, lb, h0_log, h_log, grad.to(dtype))
    return found


def _flat(out: Any) -> list[Tensor]:
    return [out] if isinstance(out, Tensor) else [t for t in out if isinstance(t, Tensor)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="B x T x H, comma-separated")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rep", type=float, default=30.0, help="do_bench_cudagraph rep in ms")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, Triton interpreter")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    shapes = ["2x40x24"] if args.smoke else [s for s in args.shapes.split(",") if s]
    if cuda:
        from triton.testing import do_bench_cudagraph

        print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print("| shape | dtype | op | FAST ms | plain ms | plain / FAST | same bits |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for text in shapes:
        shape = run.parse_shape(text)
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            for op, fn in calls(shape, dtype, device).items():
                fast_out = _flat(fn())
                with plain_math():
                    plain_out = _flat(fn())
                    plain_ms = do_bench_cudagraph(fn, rep=args.rep, return_mode="median") if cuda else None
                fast_ms = do_bench_cudagraph(fn, rep=args.rep, return_mode="median") if cuda else None
                same = all(torch.equal(x, y) for x, y in zip(fast_out, plain_out, strict=True))
                times = (
                    f"{fast_ms:.4f} | {plain_ms:.4f} | {plain_ms / fast_ms:.3f}"
                    if fast_ms and plain_ms
                    else "- | - | -"
                )
                print(f"| {text} | {name} | {op} | {times} | {'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
