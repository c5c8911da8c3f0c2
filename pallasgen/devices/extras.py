"""The optional dependencies a command that runs or compiles kernels needs, and what to
install when one is missing: jax (`pallasgen[jax]`) to run and time kernels, and libtpu
as well (`pallasgen[tpu]`) for the TPU compiler's estimates."""

from __future__ import annotations

import os


class MissingExtra(Exception):
    """An optional dependency a command needs is not installed; the message says what to install."""


def require(command: str, tpu: bool) -> None:
    """Raises `MissingExtra` unless jax, and libtpu if `tpu`, can be loaded."""
    extra = "tpu" if tpu else "jax"
    try:
        import jax  # noqa: F401
    except ImportError as error:
        raise MissingExtra(f"{command} needs jax, which cannot be imported ({error}); {_install(extra)}") from None
    if tpu and not _libtpu_found():
        raise MissingExtra(f"{command} needs libtpu, the TPU compiler, which is not installed; {_install(extra)}")


def _install(extra: str) -> str:
    return f"install it with: pip install 'pallasgen[{extra}]'"


def _libtpu_found() -> bool:
    """Where jax looks for libtpu: the file TPU_LIBRARY_PATH names, else the libtpu package."""
    if os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", "")):
        return True
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True
