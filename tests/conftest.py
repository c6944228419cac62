"""Test-suite set-up: Triton kernels run on CPU tensors under the interpreter (fp32/int only).

``HYBRID_TEST_DEVICE`` (default ``cpu``) is the device of the Triton-vs-reference kernel tests (fixture
``kernel_device``). On ``cpu`` the kernels run under the Triton interpreter, so ``TRITON_INTERPRET`` defaults
to ``1``; on ``cuda`` (``scripts/gpu_check.sh``) they are compiled for the GPU and ``TRITON_INTERPRET`` is
left as the environment has it (the script sets ``0``).
"""

import os
import sys

_KERNEL_DEVICE = os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu"

# Must be set before triton is imported anywhere: CPU tensors only work under the interpreter.
if _KERNEL_DEVICE.split(":")[0] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def kernel_device() -> torch.device:
    """Device of the Triton-vs-reference kernel tests: ``$HYBRID_TEST_DEVICE`` (default ``cpu``)."""
    dev = torch.device(os.environ.get("HYBRID_TEST_DEVICE", "cpu") or "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"HYBRID_TEST_DEVICE={dev} but torch.cuda.is_available() is False")
    return dev
