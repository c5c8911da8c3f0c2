"""Generated kernels on 8 CPU devices: the scenarios that tests/test_many_devices.py runs.

jax reads XLA_FLAGS once, when it starts, so these run in a process of their own:
`python tests/many_devices.py [SCENARIO ...]` prints one JSON line per scenario,
{"scenario": NAME, "error": null or the failure}. Each scenario compares a sharded
computation with NumPy in float64.
"""

from __future__ import annotations

import os
import sys

# Before jax starts: it reads these once.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json
import traceback

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kernel_cases import (
    BF16,
    bias_gelu_inputs,
    bias_gelu_numpy,
    f64,
    gelu_tanh_numpy,
    generated_module,
    leaky_inputs,
    leaky_numpy,
)

# Auto axes: jax.make_mesh's default became Explicit, where shard_map wants inputs
# already sharded as its in_specs say and plain jit of a kernel is refused.
MESH = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
SIZES = {"M": 8 * 16, "N": 256}  # 16 rows per device


def close(got, want, rtol, atol, what):
    np.testing.assert_allclose(f64(got), want, rtol=rtol, atol=atol, err_msg=what)


def rows_of_leaky_sharded():
    """Each device runs `leaky` on its 16 rows; both outputs come back sharded by rows."""
    (x,) = leaky_inputs(np.random.default_rng(0), SIZES)
    leaky = generated_module("activations").leaky
    sharded = jax.jit(
        jax.shard_map(
            lambda x: leaky(x, slope=0.2), mesh=MESH, in_specs=P("d"), out_specs=(P("d"), P("d")), check_vma=False
        )
    )
    y, mask = sharded(x)
    want_y, want_mask = leaky_numpy(x, slope=0.2)
    assert y.sharding.spec == P("d") and len(y.sharding.device_set) == 8
    close(y, want_y, 1e-6, 0, "y")
    np.testing.assert_array_equal(np.asarray(mask), want_mask)


def rows_of_bias_gelu_sharded():
    """x and the per-row scale are split by rows; the per-column bias is replicated."""
    x, bias, scale = bias_gelu_inputs(np.random.default_rng(1), SIZES)
    bias_gelu = generated_module("activations").bias_gelu
    sharded = jax.jit(
        jax.shard_map(bias_gelu, mesh=MESH, in_specs=(P("d"), P(), P("d")), out_specs=P("d"), check_vma=False)
    )
    (want,) = bias_gelu_numpy(x, bias, scale)
    close(sharded(x, bias, scale), want, 2.0**-7, 1e-5, "y")


def matmul_with_k_sharded_then_psum_and_epilogue():
    """x[:, K] and y[K, :] split along K: each device multiplies its slices with the bundled
    `matmul`, `psum` adds the partial products, and bias + gelu run after the sum (the
    epilogue is not linear, so it cannot run on partial products)."""
    mm = generated_module("matmul")
    rng = np.random.default_rng(2)
    m, k, n = 32, 8 * 128, 256
    x, y = (rng.standard_normal(shape).astype(BF16) for shape in ((m, k), (k, n)))
    bias = rng.standard_normal(n).astype(np.float32)

    def layer(x, y, bias):
        partial = mm.matmul(x.astype(np.float32), y.astype(np.float32))  # [M, N] from this device's K slice
        return jax.nn.gelu(jax.lax.psum(partial, "d") + bias, approximate=True).astype(BF16)

    sharded = jax.jit(
        jax.shard_map(layer, mesh=MESH, in_specs=(P(None, "d"), P("d", None), P()), out_specs=P(), check_vma=False)
    )
    got = sharded(x, y, bias)
    want = gelu_tanh_numpy(f64(x) @ f64(y) + f64(bias))
    close(got, want, 2.0**-7, 1e-3, "against NumPy")
    close(got, f64(mm.matmul_bias_gelu.reference(x, y, bias)), 2.0**-7, 1e-3, "against matmul_bias_gelu.reference")


def check_vma_true_is_refused():
    """With check_vma=True (shard_map's default) pallas_call wants each output's
    ShapeDtypeStruct to say over which mesh axes it varies; generated kernels do not say,
    so they need check_vma=False."""
    (x,) = leaky_inputs(np.random.default_rng(3), SIZES)
    leaky = generated_module("activations").leaky
    strict = jax.jit(jax.shard_map(leaky, mesh=MESH, in_specs=P("d"), out_specs=(P("d"), P("d"))))
    try:
        strict(x)
    except ValueError as error:
        assert "check_vma=True" in str(error) and "manual_axis_type" in str(error), error
    else:
        raise AssertionError("check_vma=True was accepted: update the README's 'Many devices'")


def plain_jit_on_a_sharded_array():
    """No shard_map: the jitted kernel takes an array sharded by rows and is still right."""
    x, bias, scale = bias_gelu_inputs(np.random.default_rng(4), SIZES)
    rows = NamedSharding(MESH, P("d"))
    x_sharded, scale_sharded = jax.device_put(x, rows), jax.device_put(scale, rows)
    assert len(x_sharded.sharding.device_set) == 8
    got = generated_module("activations").bias_gelu(x_sharded, bias, scale_sharded)
    (want,) = bias_gelu_numpy(x, bias, scale)
    close(got, want, 2.0**-7, 1e-5, "y")


SCENARIOS = {
    f.__name__: f
    for f in (
        rows_of_leaky_sharded,
        rows_of_bias_gelu_sharded,
        matmul_with_k_sharded_then_psum_and_epilogue,
        check_vma_true_is_refused,
        plain_jit_on_a_sharded_array,
    )
}


def main(names: list[str]) -> None:
    assert jax.device_count() == 8, jax.devices()
    for name in names or SCENARIOS:
        try:
            SCENARIOS[name]()
            error = None
        except Exception:
            error = traceback.format_exc()
        print(json.dumps({"scenario": name, "error": error}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
