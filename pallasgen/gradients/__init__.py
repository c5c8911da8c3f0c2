"""Gradient derivation: backward kernels as ordinary IR kernels, derived from a checked kernel."""
