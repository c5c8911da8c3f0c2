"""Build and check speed over a folder of 100 generated spec files.

Run by hand: `python benchmarks/build_speed.py [--files 100]`. Times the `pallasgen`
command itself (process start included) for:
  - a cold build: empty output folder and empty cache;
  - a no-op build: nothing changed since the last build;
  - `pallasgen check` on the clean tree, with the cache warm and cold.
Record results in benchmarks/RESULTS.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC_KINDS = [
    """# Scaled leaky ReLU {i}.
kernel leaky_{i} {{
    in  x: f32[M, N]
    in  bias: f32[N]
    out y: f32[M, N]
    out mask: i32[M, N]
    param slope: f32 = 0.0{i}
    let h = x + bias
    y = where(h > 0, h, h * slope)
    mask = i32(h > 0)
    block M = 256, N = 512
}}
""",
    """# Fused matmul {i}.
kernel matmul_{i} {{
    in  x: bf16[M, K]
    in  y: bf16[K, N]
    in  bias: f32[N]
    out z: bf16[M, N]
    z = gelu(x @ y + bias) * {i}.5
    block M = 256, N = 512, K = 512
}}
""",
    """# Box areas {i}.
kernel area_{i} {{
    in  x1, y1, x2, y2: f32[B, N]
    out area: f32[B, N]
    area = maximum(x2 - x1, 0.0) * maximum(y2 - y1, 0.0) + {i}
    block B = 128, N = 128
}}
""",
]


def write_project(root: Path, files: int) -> None:
    (root / "specs").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[tool.pallasgen]\nspecs = "specs"\nout = "generated"\n')
    for i in range(files):
        (root / "specs" / f"spec_{i:03d}.pallas").write_text(SPEC_KINDS[i % len(SPEC_KINDS)].format(i=i))


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100)
    args = parser.parse_args()
    pallasgen = shutil.which("pallasgen") or str(Path(sys.executable).with_name("pallasgen"))
    with tempfile.TemporaryDirectory() as scratch:
        root, cache = Path(scratch) / "project", Path(scratch) / "cache"
        write_project(root, args.files)
        env = {**os.environ, "PALLASGEN_CACHE_DIR": str(cache)}
        cold = timed([pallasgen, "build"], root, env)
        noop = timed([pallasgen, "build"], root, env)
        check_warm = timed([pallasgen, "check"], root, env)
        shutil.rmtree(cache)
        check_cold = timed([pallasgen, "check"], root, env)
    print(f"spec files (one kernel each): {args.files}, cores: {os.cpu_count()}")
    print(f"cold build:               {cold:6.2f} s  ({args.files / cold:5.1f} kernels/s)")
    print(f"no-op build:              {noop:6.2f} s")
    print(f"check, cache warm:        {check_warm:6.2f} s")
    print(f"check, cache cold:        {check_cold:6.2f} s  ({args.files / check_cold:5.1f} kernels/s)")


if __name__ == "__main__":
    main()
