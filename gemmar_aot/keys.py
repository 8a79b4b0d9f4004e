"""The action key: sha256 over everything that can change a kernel's bytes or record.

Ingredients, each named so ``gemmar-aot explain`` can say which one changed:

* ``spec``       the fully resolved kernel spec: every builder argument, the rank,
                 every window-layout field, phase options, code-changing env values.
* ``generator``  mori's version, the content digest of its kernel generator sources
                 (``mori/ops/gemm_ar``, ``mori/cco/device``) and the wheel's digest (its
                 host library fixes the ccoDevComm/window struct layouts the kernels inline).
* ``toolchain``  FlyDSL's version and package content digest, target arch, code object
                 version, opt level, the cco bitcode's content digest and how it was built,
                 the linker's identity, the Python version.
* ``compiler``   our own version, recipe version and the content digest of the code that
                 turns a spec into bytes and a record (recipes, worker, host-IR reader).

No absolute paths, hostnames, usernames or timestamps: the same inputs in another
checkout or on another machine give the same key.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from gemmar_aot import __version__
from gemmar_aot.canonical_json import canonical_json
from gemmar_aot.spec import KernelSpec

KEY_SCHEMA = 1

#: (package, file) pairs whose content shapes a compile's output or its record.
COMPILER_SOURCES = (
    ("gemmar_aot", "spec.py"),
    ("gemmar_aot", "codeobject.py"),
    ("gemmar_aot", "launch.py"),
    ("gemmar_aot.compiler", "worker.py"),
    ("gemmar_aot.compiler", "hostir.py"),
    ("gemmar_aot_kernels", "__init__.py"),
    ("gemmar_aot_kernels", "_common.py"),
    ("gemmar_aot_kernels", "fused_sdma.py"),
    ("gemmar_aot_kernels", "split_lsa.py"),
    ("gemmar_aot_kernels", "gemm_only.py"),
)


@lru_cache(maxsize=1)
def compiler_sources_digest() -> str:
    h = hashlib.sha256()
    for pkg, name in COMPILER_SOURCES:
        data = resources.files(pkg).joinpath(name).read_bytes()
        h.update(f"{pkg}/{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def toolchain_ingredients(fp: Mapping[str, Any]) -> dict:
    """The parts of a toolchain fingerprint (toolchain.json) that go into every key."""
    from gemmar_aot_kernels import RECIPE_VERSION

    bc = fp["cco_bitcode"]
    return {
        "generator": {
            "mori_version": fp["mori"]["version"],
            "mori_sources_digest": fp["mori"]["sources_digest"],
            "mori_wheel_sha256": fp["mori"]["wheel_sha256"],
        },
        "toolchain": {
            "flydsl_version": fp["flydsl"]["version"],
            "flydsl_package_digest": fp["flydsl"]["package_digest"],
            "arch": fp["target"]["arch"],
            "code_object_version": fp["target"]["code_object_version"],
            "opt_level": fp["flydsl_opt_level"],
            "cco_bitcode_sha256": bc["sha256"],
            "cco_bitcode_build": hashlib.sha256(canonical_json(bc.get("build")).encode()).hexdigest(),
            "linker": fp["linker"]["identity"],
            "python": fp["python"],
        },
        "compiler": {
            "gemmar_aot_version": __version__,
            "recipe_version": RECIPE_VERSION,
            "sources_digest": compiler_sources_digest(),
        },
    }


def ingredients(spec: KernelSpec, fp: Mapping[str, Any]) -> dict:
    return {"key_schema": KEY_SCHEMA, "spec": spec.to_json(), **toolchain_ingredients(fp)}


def action_key(ingr: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(ingr).encode()).hexdigest()


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are leaves."""
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k in sorted(d):
            out.update(flatten(d[k], f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def diff_ingredients(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every leaf that differs, as (dotted path, old value, new value)."""
    a, b = flatten(old), flatten(new)
    return [(k, a.get(k, "<absent>"), b.get(k, "<absent>"))
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]
