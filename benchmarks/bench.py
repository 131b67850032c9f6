"""Entry point of the benchmark runner (``benchmarks/run.py``); kept so ``python benchmarks/bench.py`` works.

python benchmarks/bench.py --smoke     # CPU, tiny shapes: what CI runs
python benchmarks/bench.py --help
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:
    # the Triton interpreter runs the kernels on CPU tensors; it must be set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run

if __name__ == "__main__":
    sys.exit(run.main())
