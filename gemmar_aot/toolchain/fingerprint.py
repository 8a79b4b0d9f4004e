"""The toolchain fingerprint written to ``toolchain.json``.

It names every input that can change the bytes of a compiled kernel and holds
no absolute paths, hostnames or timestamps, so two hosts with equal inputs get
equal fingerprints. ``digest`` is a sha256 over the rest (canonical JSON); a
cache key can use it whole.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

from gemmar_aot.model.spec import canonical_json

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import iter_files, sha256_hex, tree_digest
from gemmar_aot.util.atomic_write import atomic_write_text
from .pins import DEFAULT_FLYDSL_OPT_LEVEL

SCHEMA = 1

#: The generator sources whose digest is recorded (globs relative to the dir holding ``mori/``).
MORI_SOURCE_GLOBS = (
    "mori/ops/gemm_ar/*.py",
    "mori/cco/device/*.py",  # includes ops.py, bitcode.py, _build_flags.py
    "mori/cco/device/flydsl/*.py",
)


#: The EP generator's sources (dispatch/combine v2 and the wave-size detection its kernels
#: import): only the EP recipe's kernels are generated from them, so only their keys hash this
#: digest (``keys.RECIPE_GENERATOR``).
MORI_EP_SOURCE_GLOBS = (
    "mori/ops/dispatch_combine_v2/*.py",
    "mori/jit/config.py",
)


def fingerprint_digest(fp: dict) -> str:
    body = {k: v for k, v in fp.items() if k != "digest"}
    return sha256_hex(canonical_json(body).encode())


# ---------------------------------------------------------------- inputs


def mori_source_files(mori_dir: Path, globs: tuple[str, ...] = MORI_SOURCE_GLOBS) -> list[str]:
    """Relative paths (``mori/...``) of the generator sources, sorted."""
    files = set()
    for pattern in globs:
        for p in Path(mori_dir).glob(pattern):
            if p.is_file():
                files.add(p.relative_to(mori_dir).as_posix())
    return sorted(files)


def mori_sources_digest(mori_dir: Path) -> str:
    files = mori_source_files(mori_dir)
    if not files:
        raise ToolchainError(f"no mori generator sources under {mori_dir} ({', '.join(MORI_SOURCE_GLOBS)})")
    return tree_digest(mori_dir, files)


def mori_ep_sources_digest(mori_dir: Path) -> str:
    files = mori_source_files(mori_dir, MORI_EP_SOURCE_GLOBS)
    if not files:
        raise ToolchainError(f"no mori EP generator sources under {mori_dir} ({', '.join(MORI_EP_SOURCE_GLOBS)})")
    return tree_digest(mori_dir, files)


def flydsl_package_dir() -> Path:
    spec = importlib.util.find_spec("flydsl")  # does not import it
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("FlyDSL is not installed in this Python\n  fix: run `make setup` (or `pip install -e '.[build]'`)")
    return Path(next(iter(spec.submodule_search_locations)))


def _is_flydsl_code(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(".py") or name.endswith(".so") or ".so." in name


def flydsl_package_digest(cache: Path | None = None) -> str:
    """Digest of FlyDSL's .py and native .so files (hundreds of MB: cached by ``cache``).

    ``cache`` (a JSON file) remembers the digest with a signature of the files'
    paths, sizes and mtimes, so an unchanged installation is not re-hashed.
    """
    pkg = flydsl_package_dir()
    files = iter_files(pkg, _is_flydsl_code)
    sig = hashlib.sha256()
    for rel in files:
        st = (pkg / rel).stat()
        sig.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    signature = f"{pkg}\0{sig.hexdigest()}"
    if cache is not None and cache.is_file():
        try:
            cached = json.loads(cache.read_text())
            if cached.get("signature") == signature:
                return cached["digest"]
        except (ValueError, KeyError):
            pass
    digest = tree_digest(pkg, files)
    if cache is not None:
        atomic_write_text(cache, json.dumps({"signature": signature, "digest": digest}, indent=1) + "\n", mode=0o644)
    return digest


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def flydsl_opt_level() -> int:
    raw = os.environ.get("FLYDSL_COMPILE_OPT_LEVEL", "").strip()
    if not raw:
        return DEFAULT_FLYDSL_OPT_LEVEL
    try:
        level = int(raw)
    except ValueError:
        level = -1
    if not 0 <= level <= 3:
        raise ToolchainError(f"FLYDSL_COMPILE_OPT_LEVEL={raw!r} is not an integer 0..3\n  fix: unset it or set 0, 1, 2 or 3")
    return level


# ---------------------------------------------------------------- portability

#: An absolute path at the start of a string, after ``=`` / whitespace, or after ``-I``/``-L``.
_ABS_PATH = re.compile(r"(^|[=\s]|-[IL])/")


def non_portable_values(obj: Any) -> list[str]:
    """Strings in ``obj`` that would tie it to this host: absolute paths, the
    hostname, the home directory. Empty when the fingerprint is portable."""
    host = socket.gethostname()
    home = str(Path.home())
    bad: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            if _ABS_PATH.search(x) or x.startswith("~"):
                bad.append(x)
            elif len(host) >= 3 and host in x:
                bad.append(x)
            elif home not in ("/", "") and home in x:
                bad.append(x)

    walk(obj)
    return bad


def finalize(fp: dict) -> dict:
    """Check portability and add ``digest``."""
    bad = non_portable_values(fp)
    if bad:
        raise ToolchainError(f"toolchain fingerprint would hold host-specific values: {bad}")
    out = dict(fp)
    out["digest"] = fingerprint_digest(out)
    return out


def write_fingerprint(path: Path, fp: dict) -> bool:
    """Atomically write ``fp`` as JSON; returns False when the file already holds it."""
    text = json.dumps(fp, indent=2, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return False
    atomic_write_text(path, text, mode=0o644)
    return True


def read_fingerprint(path: Path) -> dict:
    """Parse and self-check ``toolchain.json``. FileNotFoundError if it is absent."""
    try:
        fp = json.loads(Path(path).read_text())
    except ValueError as e:
        raise ToolchainError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(fp, dict) or fp.get("schema") != SCHEMA:
        raise ToolchainError(f"{path} has schema {fp.get('schema') if isinstance(fp, dict) else '?'}, expected {SCHEMA}")
    if fp.get("digest") != fingerprint_digest(fp):
        raise ToolchainError(f"{path} was edited: its digest does not match its content")
    return fp


def python_version() -> str:
    return platform.python_version()
