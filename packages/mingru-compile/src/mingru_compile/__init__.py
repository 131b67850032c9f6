"""torch.compile and fake-tensor checks for the mingru scans and layers.

- :func:`compile_fullgraph`: ``torch.compile(fn, fullgraph=True, backend=...)``, so a graph break raises.
- :func:`assert_compiles_like_eager`: outputs and gradients of the compiled callable equal eager ones.
- :func:`fake_output_shapes`: output shapes, dtypes and devices from a run on fake tensors, on any device.
"""

from mingru_compile._compile import BACKENDS, Backend, assert_compiles_like_eager, compile_fullgraph
from mingru_compile._fake import TensorSpec, fake_output_shapes
from mingru_compile._version import __version__

__all__ = [
    "BACKENDS",
    "Backend",
    "TensorSpec",
    "__version__",
    "assert_compiles_like_eager",
    "compile_fullgraph",
    "fake_output_shapes",
]
