"""Where the source checkout is: the directory holding the ``gemmar_aot`` package."""

from __future__ import annotations

from pathlib import Path


def checkout_dir() -> Path:
    """The directory that holds the ``gemmar_aot`` package (the checkout, in a source tree).

    The default homes of the toolchain (``.toolchain/``) and the store (``artifacts/``)
    are under it.
    """
    import gemmar_aot  # wherever this module lives in the package

    return Path(gemmar_aot.__file__).resolve().parent.parent
