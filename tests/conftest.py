"""Makes the shared test helpers (kernel_cases.py) importable in any pytest import mode."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
