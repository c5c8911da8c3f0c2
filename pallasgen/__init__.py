"""pallasgen: JAX Pallas kernels generated from short spec files."""
