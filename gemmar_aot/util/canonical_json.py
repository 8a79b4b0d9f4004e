"""The canonical JSON encodings of files and JSON Lines. Standard library only. (The hashing form,
sorted keys, no spaces, ASCII -- what every digest is taken over: spec ids, action keys, the
toolchain fingerprint -- is :func:`gemmar_aot.model.spec.canonical_json`: the spec is compile
code, and the form is part of every key.)

* :func:`canonical_json_bytes` -- sorted keys, indent 1, ASCII, finite numbers only and a
  trailing newline: what every JSON file we publish holds (store records, wheel
  metadata). The same value always gives the same bytes, whatever the insertion order of
  its dicts, so files diff cleanly and can be compared by digest.
* :func:`canonical_json_line` -- the hashing form, finite numbers only, as bytes: one line of
  a JSON Lines file (the lock file, whose parts are read one at a time).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json_bytes", "canonical_json_line"]


def canonical_json_bytes(obj: Any) -> bytes:
    """The canonical file bytes of ``obj``. Raises ValueError on NaN/inf, TypeError on non-JSON."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode()


def canonical_json_line(obj: Any) -> bytes:
    """``obj`` as one line of JSON Lines: :func:`canonical_json` (no newline in it: strings escape
    theirs), finite numbers only, as bytes. Raises ValueError on NaN/inf, TypeError on non-JSON."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
