"""Blocks tuned for a chip or a GPU (by `pallasgen tune`), and the fingerprint that says
which version of a kernel they were tuned for."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from pallasgen.frontend import ir

# Fields that do not change what a kernel computes or which blocks fit it: positions, the
# doc comment, the default block values (only which dimensions are blocked counts) and
# whether it is differentiated.
_IGNORED_FIELDS = {"doc", "gpu_blocks", "gpu_options", "grad_none"}


@dataclasses.dataclass(frozen=True)
class TunedBlocks:
    """The best TPU blocks found for one chip at one set of sizes, or the best GPU (Triton)
    blocks and launch options for one kind of GPU."""

    chip: str  # "v5e", or a GPU's device kind: "NVIDIA H100 80GB HBM3"
    sizes: tuple[tuple[str, int], ...]  # (dim, size) of every dimension it was tuned at
    blocks: tuple[tuple[str, int], ...]  # (dim, block) of every dimension with a block keyword
    options: tuple[tuple[str, int], ...] = ()  # a GPU's: ("warps", 4), ("stages", 3)


def kernel_fingerprint(kernel: ir.Kernel) -> str:
    """A short hash of what the kernel computes and which dimensions it blocks: a tuning
    file whose fingerprint differs was tuned for another kernel."""
    canonical = json.dumps(_canonical(kernel), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _canonical(node):
    if isinstance(node, ir.BlockSize):
        return node.dim
    if dataclasses.is_dataclass(node):
        return {
            "_": type(node).__name__,
            **{
                f.name: _canonical(getattr(node, f.name))
                for f in dataclasses.fields(node)
                if "position" not in f.name and f.name not in _IGNORED_FIELDS
            },
        }
    if isinstance(node, tuple):
        return [_canonical(item) for item in node]
    return node
