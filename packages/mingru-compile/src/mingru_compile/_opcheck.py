"""``torch.library.opcheck`` over every ``torch.ops.mingru`` op, on the sample inputs the ops supply.

The samples come from :mod:`mingru_triton.samples`. opcheck runs the op for real (schema, autograd
registration, fake-tensor agreement with the real outputs, AOTAutograd), so it needs the kernels to run:
on a CUDA device. Where they cannot, each op is reported as skipped with the reason instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mingru.dispatch import interpret_requested

Outcome = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class OpcheckResult:
    """opcheck of one op on one sample (``sample`` is its index in the op's sample list; -1 when skipped
    before any sample was made). ``tests`` maps each opcheck test to "SUCCESS" or the error it raised."""

    op: str
    sample: int
    outcome: Outcome
    reason: str = ""
    tests: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        where = f"{self.op}[{self.sample}]" if self.sample >= 0 else self.op
        return f"{where}: {self.outcome}" + (f" ({self.reason})" if self.reason else "")


def opcheck_skip_reason(device: torch.device | str) -> str | None:
    """Why opcheck of the mingru ops cannot run on ``device`` here, or None when it can."""
    try:
        import mingru_triton
    except ImportError as exc:
        return f"mingru-triton is not importable: {exc}"
    if not getattr(mingru_triton, "SCAN_IMPLS", None):
        return f"the mingru kernels are not registered here: {mingru_triton.available()}"
    if interpret_requested():
        return (
            "torch.library.opcheck of a triton_op fails under the Triton interpreter (TRITON_INTERPRET=1): "
            "its fake-tensor and AOT tests cannot trace interpreted kernels"
        )
    kind = torch.device(device).type
    if kind != "cuda":
        return f"the kernels take CUDA tensors; device {kind!r} runs them only under the Triton interpreter"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


def opcheck_ops(
    ops: Iterable[str] | None = None,
    *,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.float32,
    test_utils: str | Sequence[str] | None = None,
) -> list[OpcheckResult]:
    """Run ``torch.library.opcheck`` on ``torch.ops.mingru.<op>`` for each sample of each op.

    Args:
        ops: op names (default: every op of :data:`mingru_triton.samples.OP_NAMES`).
        device: where the samples are placed.
        dtype: their floating dtype.
        test_utils: opcheck's tests (default: opcheck's own default set).

    Returns:
        One result per (op, sample): "passed", or "failed" with the failing tests; or one "skipped" result
        per op, with the reason, when the kernels cannot run on ``device`` here (see
        :func:`opcheck_skip_reason`). Nothing raises for a failing op: inspect the results.

    Raises:
        ValueError: an unknown op name.
    """
    from mingru_triton.samples import OP_NAMES, sample_inputs

    names = list(OP_NAMES if ops is None else ops)
    unknown = [name for name in names if name not in OP_NAMES]
    if unknown:
        raise ValueError(f"opcheck_ops: unknown mingru ops {unknown}; the ops are {', '.join(OP_NAMES)}")
    skip = opcheck_skip_reason(device)
    if skip is not None:
        return [OpcheckResult(name, -1, "skipped", skip) for name in names]
    options: dict[str, Any] = {} if test_utils is None else {"test_utils": test_utils}
    results: list[OpcheckResult] = []
    for name in names:
        op = getattr(torch.ops.mingru, name).default
        for index, (args, kwargs) in enumerate(sample_inputs(name, device, dtype)):
            tests = dict(torch.library.opcheck(op, args, kwargs, raise_exception=False, **options))
            failed = sorted(test for test, value in tests.items() if value != "SUCCESS")
            if failed:
                detail = "; ".join(f"{test}: {_short(tests[test])}" for test in failed)
                results.append(OpcheckResult(name, index, "failed", detail, tests))
            else:
                results.append(OpcheckResult(name, index, "passed", "", tests))
    return results


def _short(value: Any, limit: int = 300) -> str:
    text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
