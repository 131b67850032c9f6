"""torch.compile and fake-tensor checks for the mingru scans and layers.

- :func:`compile_fullgraph`: ``torch.compile(fn, fullgraph=True, backend=...)``, so a graph break raises.
- :func:`assert_compiles_like_eager`: outputs and gradients of the compiled callable equal eager ones; returns
  a :class:`CompileReport`.
- :func:`compile_and_report`: compile with ``fullgraph=True``, run (several inputs, optionally a backward) and
  report graph count, graph breaks, recompiles and the captured graphs (:class:`CompileReport`).
- :func:`opcheck_ops`: ``torch.library.opcheck`` on every ``torch.ops.mingru`` op with the samples of
  :mod:`mingru_triton.samples`, skipped with the reason where the kernels cannot run.
- :func:`fake_output_shapes`: output shapes, dtypes and devices from a run on fake tensors, on any device.
"""

from mingru_compile._compile import BACKENDS, Backend, assert_compiles_like_eager, compile_fullgraph
from mingru_compile._fake import TensorSpec, fake_output_shapes
from mingru_compile._opcheck import OpcheckResult, opcheck_ops, opcheck_skip_reason
from mingru_compile._report import CompileReport, compile_and_report, target_name
from mingru_compile._version import __version__

__all__ = [
    "BACKENDS",
    "Backend",
    "CompileReport",
    "OpcheckResult",
    "TensorSpec",
    "__version__",
    "assert_compiles_like_eager",
    "compile_and_report",
    "compile_fullgraph",
    "fake_output_shapes",
    "opcheck_ops",
    "opcheck_skip_reason",
    "target_name",
]
