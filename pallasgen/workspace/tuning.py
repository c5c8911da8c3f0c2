"""Tuning files: the blocks `pallasgen tune` found for a spec's kernels, committed beside
the spec as `NAME.tuning.json` and rendered into its generated module by `build`.

One entry per kernel, chip and size bucket (each size rounded to a power of two), with
the kernel's fingerprint (so that `check` can say when the kernel changed since), the
estimate or time that chose it and the versions it was tuned with, in a list per
backend (`TABLES`): "tuned" the TPU's (by chip); GPU entries (`pallasgen tune --gpu`,
chosen by time on the device) one per device kind and size bucket, "tuned_gpu" (Triton's
blocks, warps and stages) and "tuned_mosaic_gpu" (Mosaic GPU's blocks and pipeline
stages). In memory, a kernel's entries are one table keyed by backend name.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from pallasgen.analysis.checks import CheckedKernel
from pallasgen.gradients.derive import every_kernel
from pallasgen.analysis.tuning import TunedBlocks, kernel_fingerprint
from pallasgen.backends import BACKENDS, backend_named
from pallasgen.frontend.errors import Diagnostic, Position, SpecError

SUFFIX = ".tuning.json"
# Each backend's list of entries in a kernel's object in the file, by backend name: the
# TPU's "tuned" (entries by "chip"), any other's "tuned_<name>" (by "device", with "options").
TABLES = {b.name: "tuned" if b.name == "tpu" else f"tuned_{b.name}" for b in BACKENDS}
ABOUT = "TPU blocks found by `pallasgen tune`; `pallasgen build` renders them into the generated module."


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tuned result, as the file keeps it."""

    blocks: TunedBlocks
    measure: dict  # how it was chosen: {"estimate": "libtpu cost model", "kernel_cycles": ..., ...}
    versions: dict  # of jax, libtpu and pallasgen


@dataclasses.dataclass(frozen=True)
class KernelTuning:
    fingerprint: str
    tables: dict[str, tuple[Entry, ...]]  # each backend's entries, by backend name (those of TABLES)

    def entries(self, backend: str) -> tuple[Entry, ...]:
        return self.tables.get(backend, ())


def tuning_path(spec: Path) -> Path:
    return spec.with_name(spec.name.removesuffix(".pallas") + SUFFIX)


def read_tuning(text: str, path: str) -> dict[str, KernelTuning]:
    """A tuning file's kernels; raises `SpecError` (at the file's line) if it is malformed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecError(path, text, [Diagnostic(Position.point(error.lineno, error.colno), error.msg)]) from None
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, dict):
        raise SpecError(path, text, [Diagnostic(Position.point(1, 1), 'expected an object with "kernels"')])
    return {name: _kernel_tuning(name, value, text, path) for name, value in kernels.items()}


def _kernel_tuning(name: str, value, text: str, path: str) -> KernelTuning:
    def fail(message: str):
        raise SpecError(path, text, [Diagnostic(_position_of(text, name), f"kernel {name!r}: {message}")])

    if not isinstance(value, dict) or not isinstance(value.get("fingerprint"), str):
        fail('expected an object with "fingerprint" and "tuned"')
    gpu_tables = [table for backend, table in TABLES.items() if backend != "tpu"]
    if not isinstance(value.get("tuned"), list) or any(not isinstance(value.get(t, []), list) for t in gpu_tables):
        fail(f'"tuned" (and {", ".join(map(json.dumps, gpu_tables))}) is not a list')
    tables = {}
    for backend, table in TABLES.items():
        entries = []
        for item in value.get(table, []):
            try:
                if backend == "tpu":
                    entries.append(_entry(item, item["chip"], ()))
                else:
                    entries.append(_entry(item, item["device"], _pairs(item["options"])))
            except (KeyError, TypeError, AttributeError, ValueError):
                if backend == "tpu":
                    fail('each entry has "chip", "sizes" and "blocks" (dimension: positive integer)')
                fail('each GPU entry has "device", "sizes", "blocks" and "options" (name: positive integer)')
        if entries:
            tables[backend] = tuple(entries)
    return KernelTuning(value["fingerprint"], tables)


def _entry(item: dict, chip, options: tuple[tuple[str, int], ...]) -> Entry:
    if not isinstance(chip, str):
        raise TypeError(chip)
    blocks = TunedBlocks(chip, _pairs(item["sizes"]), _pairs(item["blocks"]), options)
    return Entry(blocks, dict(item.get("measure", {})), dict(item.get("versions", {})))


def _pairs(mapping: dict) -> tuple[tuple[str, int], ...]:
    return tuple((str(d), _positive(n)) for d, n in mapping.items())


def _positive(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(value)
    return value


def _position_of(text: str, name: str) -> Position:
    """Where the kernel's key is in the file (its first line when not found)."""
    found = re.search(re.escape(json.dumps(name)) + r"\s*:", text)
    if not found:
        return Position.point(1, 1)
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    return Position(line, column, line, column + len(json.dumps(name)) - 1)


def apply_tuning(
    kernels: tuple[CheckedKernel, ...], tuning: dict[str, KernelTuning], text: str, path: str
) -> tuple[tuple[CheckedKernel, ...], list[str]]:
    """The kernels, and those derived from them for jax.grad, with their tuned blocks,
    and why any tuning is stale (tuned for a kernel that has changed or is gone since).
    Stale entries are left out; entries that do not fit a current kernel raise `SpecError`."""
    by_name = {k.kernel.name for k in every_kernel(kernels)}
    stale = [f"{name!r} was tuned, but the spec has no such kernel" for name in tuning if name not in by_name]

    def tuned(checked: CheckedKernel, named: str) -> CheckedKernel:
        """The kernel with its tuned blocks; `named`: the spec's kernel it is or is derived from."""
        found = tuning.get(checked.kernel.name)
        if found is None:
            return checked
        if found.fingerprint != kernel_fingerprint(checked.kernel):
            stale.append(f"{checked.kernel.name!r} changed since it was tuned")
            return checked
        # Entries for a backend the project does not target (no settings) are left out.
        tables = {backend: entries for backend, entries in found.tables.items() if backend in checked.settings}
        for backend, entries in tables.items():
            for entry in entries:
                problem = backend_named(backend).tuned_blocks_problem(checked, entry.blocks)
                if problem:
                    position = _position_of(text, named)
                    raise SpecError(path, text, [Diagnostic(position, f"kernel {checked.kernel.name!r}: {problem}")])
        tuned = {backend: tuple(e.blocks for e in entries) for backend, entries in tables.items()}
        return dataclasses.replace(checked, tuned=tuned)

    tuned_kernels = []
    for checked in kernels:
        name = checked.kernel.name
        gradient = checked.gradient
        if gradient is not None and (gradient.kernels or gradient.saving):
            gradient = dataclasses.replace(
                gradient,
                saving=gradient.saving and tuned(gradient.saving, name),
                kernels=tuple(dataclasses.replace(k, checked=tuned(k.checked, name)) for k in gradient.kernels),
            )
        tuned_kernels.append(dataclasses.replace(tuned(checked, name), gradient=gradient))
    return tuple(tuned_kernels), stale


def size_bucket(sizes: dict[str, int]) -> dict[str, int]:
    """Each size rounded to the nearest power of two: one tuned entry per chip and bucket."""
    return {dim: _nearest_power_of_two(size) for dim, size in sizes.items()}


def _nearest_power_of_two(size: int) -> int:
    below = 1 << (size.bit_length() - 1)
    return 2 * below if size - below > 2 * below - size else below


def entry_for(
    tuning: dict[str, KernelTuning], checked: CheckedKernel, chip: str, sizes: dict[str, int], backend: str = "tpu"
) -> Entry | None:
    """The kernel's entry for `chip` (a GPU's device kind, for a GPU `backend`) in the size
    bucket of `sizes`, if it was tuned as it is now."""
    entries = _current_entries(tuning, checked).get(backend, ())
    return next((e for e in entries if _slot(e) == (chip, size_bucket(sizes))), None)


def with_entry(
    tuning: dict[str, KernelTuning], checked: CheckedKernel, entry: Entry, backend: str = "tpu"
) -> dict[str, KernelTuning]:
    """`tuning` with `entry` in place of the kernel's entry for the same chip (or GPU, for a
    GPU `backend`) and size bucket; a kernel tuned for an older version of itself starts afresh."""
    tables = dict(_current_entries(tuning, checked))
    kept = tuple(e for e in tables.get(backend, ()) if _slot(e) != _slot(entry))
    tables[backend] = tuple(sorted((*kept, entry), key=lambda e: (e.blocks.chip, e.blocks.sizes)))
    return {**tuning, checked.kernel.name: KernelTuning(kernel_fingerprint(checked.kernel), tables)}


def _current_entries(tuning: dict[str, KernelTuning], checked: CheckedKernel) -> dict[str, tuple[Entry, ...]]:
    """The kernel's entries, by backend, if it was tuned as it is now (its fingerprint unchanged)."""
    kernel = tuning.get(checked.kernel.name)
    current = kernel and kernel.fingerprint == kernel_fingerprint(checked.kernel)
    return kernel.tables if current else {}


def _slot(entry: Entry) -> tuple[str, dict[str, int]]:
    """What an entry is kept once per: its chip and size bucket."""
    return entry.blocks.chip, size_bucket(dict(entry.blocks.sizes))


def format_tuning(tuning: dict[str, KernelTuning]) -> str:
    """The file's text: sorted, two-space indented, each innermost object on one line."""
    data = {
        "about": ABOUT,
        "kernels": {
            name: {
                "fingerprint": kernel.fingerprint,
                "tuned": [
                    {
                        "chip": e.blocks.chip,
                        "sizes": dict(e.blocks.sizes),
                        "blocks": dict(e.blocks.blocks),
                        "measure": e.measure,
                        "versions": e.versions,
                    }
                    for e in kernel.entries("tpu")
                ],
                **{
                    table: [_gpu_item(e) for e in kernel.entries(backend)]
                    for backend, table in TABLES.items()
                    if backend != "tpu" and kernel.entries(backend)
                },
            }
            for name, kernel in sorted(tuning.items())
        },
    }
    text = json.dumps(data, indent=2)
    flat = re.sub(r"\{[^{}\[\]]*\}", lambda m: json.dumps(json.loads(m.group())), text)
    return flat + "\n"


def _gpu_item(entry: Entry) -> dict:
    return {
        "device": entry.blocks.chip,
        "sizes": dict(entry.blocks.sizes),
        "blocks": dict(entry.blocks.blocks),
        "options": dict(entry.blocks.options),
        "measure": entry.measure,
        "versions": entry.versions,
    }
