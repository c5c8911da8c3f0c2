"""What runs generated kernels: `run` and `bench` on the devices at hand, and the real compilers (Mosaic, Triton) and their cost estimates without a TPU or GPU."""
