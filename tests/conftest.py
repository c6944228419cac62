"""Test-suite set-up: Triton kernels run on CPU tensors under the interpreter (fp32/int only)."""

import os
import sys

# Must be set before triton is imported anywhere: CPU tensors only work under the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
