"""Where the store lives when the user does not say."""

from __future__ import annotations

import os
from pathlib import Path

from gemmar_aot.util.checkout import checkout_dir

ENV_VAR = "GEMMAR_AOT_STORE"


def default_store_root(explicit: str | os.PathLike | None = None) -> Path:
    """``--store DIR`` if given, else ``$GEMMAR_AOT_STORE``, else ``<checkout>/artifacts``."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return checkout_dir() / "artifacts"
