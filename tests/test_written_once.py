"""Generated code says a thing once: a kernel's loads read together, every input's
BlockSpec written once where they are all the same, a ragged block's fill one call, a
loop's results unpacked into their own names, scratch refs gathered where naming each
would take a line apiece."""

from __future__ import annotations

import pytest

from pallasgen.lowering.parts import assigned_together, kernel_signature, unpacked_results, written_specs
from pallasgen.workspace.pipeline import generate

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

SPEC = """kernel fma {
    in  a: f32[M, N]
    in  b: f32[M, N]
    in  c: f32[M, N]
    out y: f32[M, N]
    y = a * b + c
}
"""


def test_loads_are_one_assignment_while_the_line_fits():
    loads = [(name, f"rt.load({name}_ref, inside)") for name in ("ax1", "ay1", "ax2", "ay2", "bx1")]
    assert assigned_together(loads[:2]) == ["ax1, ay1 = rt.load(ax1_ref, inside), rt.load(ay1_ref, inside)"]
    lines = assigned_together(loads, width=80)
    assert lines == [
        "ax1, ay1 = rt.load(ax1_ref, inside), rt.load(ay1_ref, inside)",
        "ax2, ay2 = rt.load(ax2_ref, inside), rt.load(ay2_ref, inside)",
        "bx1 = rt.load(bx1_ref, inside)",
    ]
    assert assigned_together([]) == []


def test_the_same_blockspec_of_every_input_is_written_once_naming_them_all():
    spec = "pl.BlockSpec((block_n,), lambda i: (i,))"
    assert written_specs((("x: f32[N]", spec), ("y: f32[N]", spec))) == ((("x, y: f32[N]", spec),), 2)
    mixed = (("x: f32[N]", spec), ("w: bf16[N]", spec))
    assert written_specs(mixed) == ((("x: f32[N]; w: bf16[N]", spec),), 2)
    other = (("x: f32[N]", spec), ("y: f32[N]", "pl.BlockSpec((1,), lambda i: (0,))"))
    assert written_specs(other) == (other, 1)


def test_a_generated_kernel_reads_its_blocks_together_and_writes_their_spec_once():
    source = generate(SPEC, "fma.pallas", "fma.pallas")
    assert "a, b, c = a_ref[...], b_ref[...], c_ref[...]" in source  # TPU
    assert "a, b, c = rt.load(a_ref, inside), rt.load(b_ref, inside), rt.load(c_ref, inside)" in source  # Triton
    assert source.count("] * 3,  # a, b, c: f32[M, N]") == 2  # the TPU's and Triton's in_specs


def test_a_ragged_blocks_fill_is_one_call_that_says_when_it_applies():
    spec = "kernel rows {\n    in  x: f32[M, N]\n    out s: f32[M]\n    s = sum(x, N)\n    block M = 8, N = 128\n}\n"
    source = generate(spec, "rows.pallas", "rows.pallas")
    assert "ragged=n % block_n)" in source and "if n % block_n:" not in source


def test_a_loops_running_values_unpack_into_the_results_they_are():
    assert unpacked_results(["sum_n_running"], [("sum_n", "sum_n_running")]) == ("sum_n,", [])
    running = ["max_running", "argmax_index", "top", "total"]
    finishes = [("argmax_n", "argmax_index"), ("lse", "rt.logsumexp_finish(top, total)")]
    assert unpacked_results(running, finishes) == ("_, argmax_n, top, total", ["lse = rt.logsumexp_finish(top, total)"])
    # two results of one running value (two max(p, N) written apart): the second is the first
    assert unpacked_results(["top"], [("m", "top"), ("m_2", "top")]) == ("m,", ["m_2 = m"])


def test_scratch_refs_are_gathered_where_naming_each_would_take_a_line_apiece():
    refs = ["q_ref", "k_ref", "v_ref", "o_ref", "do_ref", "lse_ref", "dq_ref", "delta_ref"]
    scratch = ["q_smem", "o_smem", "do_smem", "lse_smem", "dq_smem", "delta_smem", "operand_smem", "barrier"]
    keywords = ["h", "size_s", "d", "t", "block_t", "scale"]
    parameters, unpacked = kernel_signature(refs, scratch, keywords)
    assert parameters == ", ".join([*refs, "*scratch", *keywords])
    assert unpacked == ("q_smem, o_smem, do_smem, lse_smem, dq_smem, delta_smem, operand_smem, barrier = scratch",)
    assert kernel_signature(refs, scratch, [*keywords, "scratch"])[1] == ()  # a param named so keeps them named
    short = kernel_signature(["x_ref", "y_ref", "z_ref"], ["acc_ref", "out_smem"], ["k"])
    assert short == ("x_ref, y_ref, z_ref, acc_ref, out_smem, *, k", ())
    one = kernel_signature(refs * 3, ["acc_ref"], keywords)  # long, but one scratch ref stays named
    assert one[1] == () and one[0].endswith("acc_ref, *, h, size_s, d, t, block_t, scale")


def test_a_generated_kernel_with_many_scratch_refs_unpacks_them_first():
    source = generate(
        "kernel attention {\n    in  q: bf16[B, H, S, D]\n    in  k: bf16[B, H, T, D]\n    in  v: bf16[B, H, T, D]\n"
        "    out o: bf16[B, H, S, D]\n    o = softmax(q @ k.T, T) @ v\n    block B = 1, H = 1, S = 128, T = 128\n}\n",
        "attention.pallas",
        "attention.pallas",
    )
    assert "*scratch" in source
    # Mosaic GPU: each computing warpgroup's own tiles (o's the tile of q, which the pass alone reads)
    assert "\n    q_smem, lse_smem, operand_smem, operand_smem_2, barrier = (ref.at[wg] for ref in scratch)\n" in source


CHAIN = """kernel chain {
    in  x: f32[M, N]
    in  y: f32[M, N]
    out z: f32[M, N]
    let a = x * y
    let b = a + x
    z = b * b
}
"""


def test_a_kernel_whose_body_is_its_references_code_calls_the_reference_on_its_blocks():
    source = generate(CHAIN, "chain.pallas", "chain.pallas")
    assert "z_ref[...] = chain.reference(x, y)" in source  # TPU
    assert "rt.store(z_ref, chain.reference(x, y), inside)" in source  # Triton
    assert "z_smem[...] = chain.reference(x, y)" in source  # Mosaic GPU
    assert "b = a + x" not in source.split("\ndef chain(")[0]  # its lets: in the reference alone


@pytest.mark.parametrize(
    "spec",
    [
        CHAIN.replace(
            "    let a = x * y\n    let b = a + x\n    z = b * b", "    let a = x * y\n    z = a + x"
        ),  # one let
        CHAIN.replace("x", "chain"),  # an input named as the kernel: the call would read the array
        CHAIN.replace("in  y", "param chain: f32 = 2.0\n    in  y").replace("x * y", "x * chain"),  # a param
    ],
)
def test_a_body_with_a_let_per_output_or_a_name_the_call_would_shadow_stays_written_out(spec):
    assert "chain.reference(" not in generate(spec, "chain.pallas", "chain.pallas")


def test_a_kernel_names_its_size_keywords_only_where_they_are_not_its_dimensions_in_lower_case():
    """rt.kernel's default (`default_sizes`): each dimension's name in lower case, in the
    order the outputs, then the inputs, first name them."""
    assert "    sizes=" not in generate(SPEC, "fma.pallas", "fma.pallas")
    clash = "kernel k {\n    in  x: f32[S, N]\n    out y: f32[S, N]\n    let s = x * 2\n    y = s + 1\n}\n"
    assert '    sizes={"S": "size_s", "N": "n"},\n' in generate(clash, "k.pallas", "k.pallas")
    product = "kernel k {\n    in  x: f32[M, K]\n    in  w: f32[K, N]\n    out y: f32[M, N]\n    y = x @ w\n}\n"
    assert "    sizes=" not in generate(product, "k.pallas", "k.pallas")  # M, N (y's), then K


DELTA = """kernel dq {
    in  q: bf16[S, D]
    in  k, v: bf16[T, D]
    in  o, do: bf16[S, D]
    in  lse: f32[S]
    out dq: bf16[S, D]
    out delta: f32[S]
    let p = exp((q @ k.T) - lse)
    let dp = do @ v.T
    delta = sum(f32(do) * f32(o), D)
    dq = bf16(p * (dp - delta)) @ k
    block S = 64, T = 64
}
"""


def _function(source: str, name: str) -> str:
    """The text of the generated function `name`, up to the next top-level one."""
    return source.split(f"\ndef {name}(")[1].split("\ndef ")[0]


def test_a_value_of_the_pass_that_does_not_vary_along_it_is_computed_once_before_it_on_gpus():
    """delta, a reduction of the once-read o and do, is computed before the pass over T
    (Triton's loop, Mosaic GPU's pipeline, which carries it instead of o and do) and
    stored as it is after it; on TPU each step is a program of its own and computes it."""
    source = generate(DELTA, "dq.pallas", "dq.pallas")
    for kernel in ("_dq_gpu_kernel", "_dq_mosaic_gpu_kernel"):
        code = _function(source, kernel)
        computed = [line for line in code.splitlines() if line.strip().startswith("delta = ")]
        assert len(computed) == 1 and code.count("jnp.sum(") == 1, kernel
        step = code.split("def step")[1] if "def step" in code else code.split("def accumulate")[1]
        assert "o.astype" not in step.split("return")[0], kernel  # not in the pass
    assert "acc_t, lse, delta = carry" in _function(source, "_dq_mosaic_gpu_kernel")
    tpu = _function(source, "_dq_kernel")
    assert tpu.count("delta = jnp.sum(") == 2  # in each step's strip, and in the last step's outputs
