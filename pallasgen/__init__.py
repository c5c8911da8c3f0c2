"""pallasgen: JAX Pallas kernels generated from short spec files.

The Python API (importing the package imports neither jax nor the generator):

    import pallasgen
    changes = pallasgen.build(project=".")   # as `pallasgen build`: what it wrote or removed
    drift = pallasgen.check(project=".")     # as `pallasgen check`: [] when generated/ matches

Both raise `pallasgen.SpecErrors` for specs with errors (its `.errors`, each with its
diagnostics; `str()` is the text the CLI prints), `pallasgen.UsageError` or
`pallasgen.ConfigError`. See `pallasgen.workspace.api`.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("pallasgen")
except _metadata.PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"

__all__ = ["ConfigError", "SpecErrors", "UsageError", "__version__", "build", "check"]

_API = {
    "build": "pallasgen.workspace.api",
    "check": "pallasgen.workspace.api",
    "SpecErrors": "pallasgen.workspace.sync",
    "UsageError": "pallasgen.workspace.sync",
    "ConfigError": "pallasgen.workspace.config",
}


def __getattr__(name: str):
    """The API's functions and exceptions, imported when first used."""
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'pallasgen' has no attribute {name!r}")
