"""The action key: sha256 over everything that can change a kernel's bytes or record.

Ingredients, each named so ``gemmar-aot explain`` can say which one changed:

* ``spec``       the fully resolved kernel spec: every builder argument, the rank,
                 every window-layout field, phase options, code-changing env values.
* ``generator``  mori's version, the content digest of its kernel generator sources
                 (``mori/ops/gemm_ar``, ``mori/cco/device``) and the wheel's digest (its
                 host library fixes the ccoDevComm/window struct layouts the kernels inline).
* ``toolchain``  FlyDSL's build (:func:`flydsl_build`), target arch, code object version,
                 opt level, the cco bitcode's content digest, the linker's identity.
* ``compiler``   our own version, recipe version and the content digest of the code that
                 turns a spec into bytes and a record (recipes, worker, host-IR reader).

No absolute paths, hostnames, usernames or timestamps: the same inputs in another
checkout or on another machine give the same key.

Keys travel across Python versions (key schema 2). Three things the toolchain
fingerprint records are *not* ingredients, because they never change the bytes of a
kernel and would split a shared cache between runners for nothing:

* the Python version -- the code objects of the reference manifest are byte-identical
  under CPython 3.11 and 3.12; the interpreter only runs FlyDSL's tracer, whose
  sources are in the key through :func:`flydsl_build`;
* the torch version -- torch only supplies placeholder tensors (dtype and shape) to
  the tracer; 3.11/torch 2.13 and 3.12/torch 2.11 give the same bytes;
* how the cco bitcode was built (compiler flags, header packages such as triton's
  cp311 or cp312 wheel) -- the bitcode's own sha256, which *is* in the key, already
  changes with anything that changes what gets linked.

FlyDSL is one per-Python wheel per release, and the native libraries in the cp311 and
cp312 wheels of 0.4.2 differ byte-wise (built separately) while their Python sources
are identical and they emit identical code objects. So the key names a FlyDSL *build*:
``flydsl-0.4.2`` when the installed package's content digest is one of that release's
known wheels (:data:`FLYDSL_WHEEL_DIGESTS`), else the digest itself -- a locally built
or patched FlyDSL never shares entries with the released one.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from gemmar_aot import __version__
from gemmar_aot.canonical_json import canonical_json
from gemmar_aot.spec import KernelSpec

#: 2: python, cco_bitcode_build and flydsl_package_digest left the key; ``flydsl`` names the build.
KEY_SCHEMA = 2

#: Content digests (``toolchain.fingerprint.flydsl_package_digest``: its .py and native
#: .so files) of the released FlyDSL wheels whose compiles are byte-identical, by version.
#: Add a wheel only after its code objects for the reference manifest were compared.
FLYDSL_WHEEL_DIGESTS = {
    "0.4.2": {
        # flydsl-0.4.2-cp311-cp311-manylinux_2_27_x86_64.whl (the pinned build wheel)
        "3c5cac0b6947213fcc0eee9b351a3eb6844e557e8072ce59a51ebe1395f94011": "cp311",
        # flydsl-0.4.2-cp312-cp312-manylinux_2_27_x86_64.whl (wheel sha256 fa9adf07...6816bf)
        "7f3a00d71be55c9b801c759d498898a16be333ece9d4707d5a8918c3485bcbb0": "cp312",
    },
}

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
    ("gemmar_aot_kernels", "fused_lsa.py"),
    ("gemmar_aot_kernels", "split_sdma.py"),
    ("gemmar_aot_kernels", "split_lsa.py"),
    ("gemmar_aot_kernels", "gemm_only.py"),
    ("gemmar_aot_kernels", "gemv.py"),
    ("gemmar_aot_kernels", "sdma_phases.py"),
)


@lru_cache(maxsize=1)
def compiler_sources_digest() -> str:
    h = hashlib.sha256()
    for pkg, name in COMPILER_SOURCES:
        data = resources.files(pkg).joinpath(name).read_bytes()
        h.update(f"{pkg}/{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def flydsl_build(fp: Mapping[str, Any]) -> str:
    """``flydsl-<version>`` for a released wheel of that version, else ``flydsl-<version>+<digest>``."""
    version, digest = fp["flydsl"]["version"], fp["flydsl"]["package_digest"]
    if digest in FLYDSL_WHEEL_DIGESTS.get(version, {}):
        return f"flydsl-{version}"
    return f"flydsl-{version}+{digest}"


def toolchain_ingredients(fp: Mapping[str, Any]) -> dict:
    """The parts of a toolchain fingerprint (toolchain.json) that go into every key."""
    from gemmar_aot_kernels import RECIPE_VERSION

    bc = fp["cco_bitcode"]
    return {
        "generator": {
            "mori_version": fp["mori"]["version"],
            "mori_sources_digest": fp["mori"]["sources_digest"],
            "mori_wheel_sha256": fp["mori"]["wheel_sha256"],
            # What the pod's installed mori must match (the runtime checks both); implied by the
            # wheel, so they never split a key the wheel does not, but the lock carries them.
            "mori_distribution": fp["mori"]["distribution"],
            "mori_device_abi_digest": fp["mori"]["device_abi_digest"],
        },
        "toolchain": {
            "flydsl": flydsl_build(fp),
            "arch": fp["target"]["arch"],
            "code_object_version": fp["target"]["code_object_version"],
            "opt_level": fp["flydsl_opt_level"],
            "cco_bitcode_sha256": bc["sha256"],
            "linker": fp["linker"]["identity"],
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
