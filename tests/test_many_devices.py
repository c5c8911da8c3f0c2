"""Generated kernels on 8 devices: inside `jax.shard_map`, and under plain `jax.jit`.

The scenarios live in tests/many_devices.py and run in one subprocess, because jax
must see `--xla_force_host_platform_device_count=8` before it starts; read each
scenario's docstring there for what it shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("many_devices.py")
SCENARIOS = [
    "rows_of_leaky_sharded",
    "rows_of_bias_gelu_sharded",
    "matmul_with_k_sharded_then_psum_and_epilogue",
    "check_vma_true_is_refused",
    "plain_jit_on_a_sharded_array",
]


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str | None]:
    """Each scenario's error (None when it passed), from one run of the script."""
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *SCENARIOS], capture_output=True, text=True, timeout=600, check=False
    )
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and lines, run.stderr[-5000:]
    return {line["scenario"]: line["error"] for line in lines}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_on_8_cpu_devices(outcomes, scenario):
    assert scenario in outcomes, f"{scenario} did not run"
    assert outcomes[scenario] is None, outcomes[scenario]
