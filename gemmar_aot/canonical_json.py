"""The two canonical JSON encodings: one for hashing, one for files. Standard library only.

* :func:`canonical_json` -- sorted keys, no spaces, ASCII: what every digest is taken
  over (spec ids, action keys, the toolchain fingerprint).
* :func:`canonical_json_bytes` -- sorted keys, indent 1, ASCII, finite numbers only and a
  trailing newline: what every JSON file we publish holds (lock files, store records,
  wheel metadata). The same value always gives the same bytes, whatever the insertion
  order of its dicts, so files diff cleanly and can be compared by digest.
"""

from __future__ import annotations

import json
from typing import Any

# The hashing form lives in spec.py because that file's bytes are an ingredient of every
# action key: moving the function would re-key every store. This module is where callers
# import it from.
from gemmar_aot.spec import canonical_json

__all__ = ["canonical_json", "canonical_json_bytes"]


def canonical_json_bytes(obj: Any) -> bytes:
    """The canonical file bytes of ``obj``. Raises ValueError on NaN/inf, TypeError on non-JSON."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()
