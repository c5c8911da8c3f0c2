"""Makes the shared test helpers (kernel_cases.py) importable in any pytest import mode,
and gives libtpu the environment it needs to start without a TPU (test_compiled.py)
before anything imports jax."""

import sys
from pathlib import Path

from pallasgen.devices.compile_only import set_libtpu_environment

set_libtpu_environment()

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
