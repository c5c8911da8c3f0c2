"""TPU estimates, each in a process of its own: libtpu's static profile aborts the process
on some kernels that compile (on v5e, attention's backward kernels at a ragged S: a
`Check failed` in its LLO dumper, then SIGABRT). Apart, such an abort is one kernel's
error (`NoEstimate`), not the end of `pallasgen bench --chip` or `tune`.

A child costs about a second to start libtpu; XLA's cycles for a reference are computed
once and passed to later children of the same kernel and sizes.

    python -m pallasgen.devices.apart JOB RESULT   (a child: both are pickle files)
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from pallasgen.devices.compile_only import CompileError

MOST_SECONDS = 1800  # a child that runs longer is stopped, and its kernel has no estimate


class NoEstimate(CompileError):
    """The child process ended without an estimate: libtpu aborted it while it compiled the
    kernel with its static profile, or it ran past MOST_SECONDS."""

    def __init__(self, message: str, details: str = ""):
        super().__init__("libtpu", message, details)


class ApartEstimator:
    """`estimate.Estimator`'s `estimate`, each call in a child process."""

    def __init__(self, chip: str):
        self.chip = chip
        self._xla_cycles: dict[tuple, int] = {}  # as the children found them, by kernel, sizes and grad

    def estimate(self, module, checked, sizes: dict[str, int], options: dict, vmem_limit=None, grad=False):
        key = (checked.kernel.name, tuple(sizes.items()), grad)
        job = (self.chip, module.__pallasgen_source__, module.__file__, checked, sizes, options, vmem_limit, grad)
        with tempfile.TemporaryDirectory(prefix="pallasgen-estimate-") as folder:
            job_path, result_path = Path(folder, "job"), Path(folder, "result")
            job_path.write_bytes(pickle.dumps((*job, self._xla_cycles.get(key))))
            command = [sys.executable, "-m", "pallasgen.devices.apart", str(job_path), str(result_path)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=MOST_SECONDS)
            except subprocess.TimeoutExpired:
                raise NoEstimate(f"the compile ran past {MOST_SECONDS} s and was stopped") from None
            if not result_path.is_file():
                raise NoEstimate(_aborted(done.returncode, done.stderr), done.stderr)
            kind, value = pickle.loads(result_path.read_bytes())
        if kind == "compile":
            raise CompileError(*value)
        if kind == "error":
            raise RuntimeError(value)
        self._xla_cycles[key] = value.xla_cycles
        return value


def _aborted(returncode: int, stderr: str) -> str:
    """What ended a child that wrote no result, in a line: libtpu's failed check, if any."""
    checks = [line[line.index("Check failed") :] for line in stderr.splitlines() if "Check failed" in line]
    how = f"signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    said = f": {checks[0][:300]}" if checks else ""
    return f"the compile ended its process ({how}; libtpu's static profile aborts on some kernels that compile){said}"


def _work(job_path: str, result_path: str) -> None:
    """A child's job: one estimate, its result (or compile error) pickled to `result_path`."""
    from pallasgen.devices import runner
    from pallasgen.devices.estimate import Estimator

    chip, source, path, checked, sizes, options, vmem_limit, grad, xla = pickle.loads(Path(job_path).read_bytes())
    with tempfile.TemporaryDirectory(prefix="pallasgen-llo-") as profile_dir:
        estimator = Estimator(chip, Path(profile_dir))
        module = runner.load_module(source, Path(path))
        if xla is not None:
            estimator.remember_xla(module, checked, sizes, grad, xla)
        try:
            result = ("ok", estimator.estimate(module, checked, sizes, options, vmem_limit, grad))
        except CompileError as error:
            result = ("compile", (error.compiler, error.message, error.details))
        except Exception as error:  # as the estimator raises it in the parent's process
            result = ("error", f"{type(error).__name__}: {error}")
    Path(result_path).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    _work(*sys.argv[1:3])
