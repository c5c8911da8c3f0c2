"""index() after a matrix product, and in the last step of any accumulating kernel
(issue 19), run in Pallas interpret mode on CPU on both code paths.

A product's epilogue may read positions: `where(index(M) >= index(N), x @ y, 0)` keeps
the lower triangle of each product. Such a kernel must build, import and match NumPy:

- with K blocked (an accumulator over steps) and whole, operands read transposed or
  not, sizes ragged against every block (M=200, N=300, K=260 with blocks of 128);
- batched, with a batch dimension of block 1: it is no axis of the kernel's blocks, so
  positions along M and N have the blocks' rank (2), and index(B) is the batch
  element's position, one per step;
- where the positions are read in code that runs only at the last step of an
  accumulation (under the TPU kernel's `pl.when`) or inside the GPU kernel's loop over
  a reduced dimension: Pallas's interpreter cannot read `pl.program_id` there.

The references are NumPy in float64: the product, then np.where over np.arange grids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from kernel_cases import load_module, take_gpu_branch
from pallasgen.workspace.pipeline import generate

M, N, K, B = 200, 300, 260, 3


LOWER = "where(index(M) >= index(N), {product}, 0)"
SHIFTED_BY_BATCH = "where(index(M) + 100 * index(B) >= index(N), {product}, 0)"
BLOCKED_K = "M = 128, N = 128, K = 128"
WHOLE_K = "M = 128, N = 128"


@dataclass(frozen=True)
class Case:
    lhs: tuple[str, ...]  # x's dimensions
    rhs: tuple[str, ...]  # y's
    product: str  # as the spec writes it
    blocks: str
    einsum: str  # the product in NumPy
    value: str = LOWER  # z, around the product
    shift: int = 0  # position (m, n) of batch element b is kept where m + shift * b >= n

    def spec(self, name: str) -> str:
        out = ("B", "M", "N") if "B" in self.lhs else ("M", "N")
        return f"""
kernel {name} {{
    in  x: f32[{", ".join(self.lhs)}]
    in  y: f32[{", ".join(self.rhs)}]
    out z: f32[{", ".join(out)}]
    z = {self.value.format(product=self.product)}
    block {self.blocks}
}}
"""


CASES = {
    "lower_blocked_k": Case(("M", "K"), ("K", "N"), "x @ y", BLOCKED_K, "mk,kn->mn"),
    "lower_whole_k": Case(("M", "K"), ("K", "N"), "x @ y", WHOLE_K, "mk,kn->mn"),
    "lower_lhs_transposed": Case(("K", "M"), ("K", "N"), "x.T @ y", BLOCKED_K, "km,kn->mn"),
    "lower_rhs_transposed": Case(("M", "K"), ("N", "K"), "x @ y.T", BLOCKED_K, "mk,nk->mn"),
    "batched_lower_blocked_k": Case(("B", "M", "K"), ("B", "K", "N"), "x @ y", f"B = 1, {BLOCKED_K}", "bmk,bkn->bmn"),
    "batched_lower_whole_k_transposed": Case(
        ("B", "M", "K"), ("B", "N", "K"), "x @ y.T", f"B = 1, {WHOLE_K}", "bmk,bnk->bmn"
    ),
    "batched_shifted_by_batch": Case(
        ("B", "M", "K"), ("B", "K", "N"), "x @ y", f"B = 1, {BLOCKED_K}", "bmk,bkn->bmn", SHIFTED_BY_BATCH, shift=100
    ),
}
SIZES = {"M": M, "N": N, "K": K, "B": B}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("product_positions")

    def build(name: str):
        path = root / f"{name}.py"
        path.write_text(generate(CASES[name].spec(name), f"{name}.pallas", f"specs/{name}.pallas"))
        return load_module(path, f"_product_positions_{name}")

    return build


def operands(case: Case) -> list[np.ndarray]:
    rng = np.random.default_rng(19)
    return [rng.standard_normal([SIZES[d] for d in dims]).astype(np.float32) for dims in (case.lhs, case.rhs)]


def lower_numpy(case: Case, x, y) -> np.ndarray:
    """The product in float64, kept where row + shift * batch >= column, else 0."""
    product = np.einsum(case.einsum, x.astype(np.float64), y.astype(np.float64))
    rows, columns = np.arange(M)[:, None], np.arange(N)[None, :]
    if product.ndim == 3:
        rows = rows + case.shift * np.arange(B)[:, None, None]
    return np.where(rows >= columns, product, 0.0)


@pytest.mark.parametrize("path", ["tpu", "gpu"])
@pytest.mark.parametrize("name", list(CASES))
def test_positions_after_a_product_match_numpy(built, name, path, monkeypatch):
    module = built(name)
    if path == "gpu":
        take_gpu_branch(monkeypatch, module)
    x, y = operands(CASES[name])
    got = getattr(module, name)(x, y, interpret=True if path == "gpu" else None)
    np.testing.assert_allclose(np.asarray(got, np.float64), lower_numpy(CASES[name], x, y), rtol=1e-5, atol=1e-4)


SUM_OF_WEIGHTED_ROWS = """
kernel weighted_sums {
    in  x: f32[M, V]
    out s: f32[M]
    s = sum(x * f32(index(M)), V) + f32(index(M))
    block M = 8, V = 128
}
"""


@pytest.mark.parametrize("path", ["tpu", "gpu"])
def test_positions_read_at_the_last_step_of_a_blocked_reduction(tmp_path, path, monkeypatch):
    """The TPU kernel adds index(M) under its last step's pl.when, the GPU kernel
    multiplies by it inside its loop over the blocks of V: both read this step's first
    row before entering that code."""
    file = tmp_path / "weighted_sums.py"
    file.write_text(generate(SUM_OF_WEIGHTED_ROWS, "weighted_sums.pallas", "specs/weighted_sums.pallas"))
    module = load_module(file, "_product_positions_weighted_sums")
    if path == "gpu":
        take_gpu_branch(monkeypatch, module)
    x = np.random.default_rng(5).standard_normal((20, 300)).astype(np.float32)
    got = module.weighted_sums(x, interpret=True if path == "gpu" else None)
    rows = np.arange(20, dtype=np.float64)
    want = x.astype(np.float64).sum(axis=1) * rows + rows
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-4)
