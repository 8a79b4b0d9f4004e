"""The action key: sha256 over everything that can change a kernel's bytes or record.

Ingredients, each named so ``gemmar-aot explain`` can say which one changed:

* ``spec``       the fully resolved kernel spec: every builder argument, the rank,
                 every window-layout field, phase options, code-changing env values.
* ``generator``  mori's version, the content digest of its kernel generator sources
                 (``mori/ops/gemm_ar``, ``mori/cco/device``) and the wheel's digest (its
                 host library fixes the ccoDevComm/window struct layouts the kernels inline).
* ``toolchain``  FlyDSL's build (:func:`flydsl_build`), target arch, code object version,
                 opt level, the cco bitcode's content digest, the linker's identity.
* ``compiler``   the recipe version and the digest of the *compile code* this kernel's
                 build runs (:func:`compile_code_digest`): the compile worker, the
                 toolchain set-up it does, and the recipe modules of the spec's own
                 recipe -- in normal form (:mod:`gemmar_aot.compiler.source_form`): import names
                 and syntax trees, so comments, docstrings, formatting and file paths are
                 not in the key, and a new mode's recipe moves no existing key.

Not in the key (key schema 3): our version number, and the *derive code* (the code-object
note parser, the launch-record reader, the record's derived fields). Derive code turns a
stored code object and its launcher into the record the runtime reads; it cannot change a
byte of the code object, so a change to it re-derives records from stored blobs
(:mod:`gemmar_aot.compiler.derive`, milliseconds a kernel) instead of recompiling. Each
record names the derive-code digest it was made with.

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

from functools import lru_cache
from typing import Any, Mapping

from gemmar_aot.model.spec import canonical_json
from gemmar_aot.compiler.source_form import ModuleNames, modules_digest
from gemmar_aot.model.spec import KernelSpec
from gemmar_aot.util.filedigest import sha256_hex

#: 2: python, cco_bitcode_build and flydsl_package_digest left the key; ``flydsl`` names the build.
#: 3: our own code by normal form and per recipe (``compile_code``), not file bytes; the
#:    derive code and gemmar-aot's version left the key.
#: 4: our own code under logical module names (``MODULES``): moving a module moves no key.
KEY_SCHEMA = 4

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

#: Every module of ours the compile and derive code is or imports, by *logical name*: what the
#: module is, never where it lives (:mod:`gemmar_aot.compiler.source_form`, form 2). A key hashes a
#: module under its logical name, with every import of ours written by logical name too, so
#: moving or renaming a module -- its importers updated and its entry here pointed at the new
#: place -- moves no key. Logical names never change; a new module gets a new one.
MODULES = ModuleNames({
    "package": "gemmar_aot",
    "model": "gemmar_aot.model",
    "util": "gemmar_aot.util",
    "atomic_write": "gemmar_aot.util.atomic_write",
    "checkout": "gemmar_aot.util.checkout",
    "codeobject": "gemmar_aot.model.codeobject",
    "compiler": "gemmar_aot.compiler",
    "compiler.derive": "gemmar_aot.compiler.derive",
    "compiler.hostir": "gemmar_aot.compiler.hostir",
    "compiler.launcher": "gemmar_aot.compiler.launcher",
    "compiler.worker": "gemmar_aot.compiler.worker",
    "device_abi": "gemmar_aot.model.device_abi",
    "errors": "gemmar_aot.util.errors",
    "filedigest": "gemmar_aot.util.filedigest",
    "keys": "gemmar_aot.compiler.keys",
    "launch": "gemmar_aot.model.launch",
    "launch_sequence": "gemmar_aot.model.launch_sequence",
    "model.ep": "gemmar_aot.model.ep",
    "model.layout": "gemmar_aot.model.layout",
    "rules": "gemmar_aot.model.rules",
    "spec": "gemmar_aot.model.spec",
    "store": "gemmar_aot.store",
    "store.backend": "gemmar_aot.store.backend",
    "store.errors": "gemmar_aot.store.store_errors",
    "toolchain": "gemmar_aot.toolchain",
    "toolchain.diagnose": "gemmar_aot.toolchain.diagnose",
    "toolchain.fingerprint": "gemmar_aot.toolchain.fingerprint",
    "toolchain.install": "gemmar_aot.toolchain.install",
    "toolchain.load": "gemmar_aot.toolchain.load",
    "toolchain.mori_import": "gemmar_aot.toolchain.mori_import",
    "toolchain.paths": "gemmar_aot.toolchain.paths",
    "toolchain.pins": "gemmar_aot.toolchain.pins",
    "toolchain.profiles": "gemmar_aot.toolchain.profiles",
    "toolchain.tools": "gemmar_aot.toolchain.tools",
    "kernels": "gemmar_aot_kernels",
    "kernels.common": "gemmar_aot_kernels._common",
    "kernels.ep": "gemmar_aot_kernels.ep",
    "kernels.fused_lsa": "gemmar_aot_kernels.fused_lsa",
    "kernels.fused_sdma": "gemmar_aot_kernels.fused_sdma",
    "kernels.gemm_only": "gemmar_aot_kernels.gemm_only",
    "kernels.gemv": "gemmar_aot_kernels.gemv",
    "kernels.hipcc": "gemmar_aot_kernels.hipcc",
    "model.hipcc": "gemmar_aot.model.hipcc",
    "kernels.jitv2": "gemmar_aot_kernels.jitv2",
    "model.jitv2": "gemmar_aot.model.jitv2",
    "types": "gemmar_aot.model.types",
    "kernels.sdma_phases": "gemmar_aot_kernels.sdma_phases",
    "kernels.split_lsa": "gemmar_aot_kernels.split_lsa",
    "kernels.split_sdma": "gemmar_aot_kernels.split_sdma",
})


def _imports(*logical: str) -> tuple[str, ...]:
    """The import names of registered modules (what the lists below hold, and tests trace)."""
    return tuple(MODULES.import_name(n) for n in logical)


def _logical(import_names) -> tuple[str, ...]:
    return tuple(MODULES.logical(n) for n in import_names)


#: Compile code every kernel's build runs: the worker (trace, lower, link) and the toolchain
#: set-up it does in its process (the compile environment, mori's device modules), and what
#: those import. ``tests/test_source_form.py`` fails when a module imported on a compile
#: worker's path before the code object exists is in neither this list, nor its recipe's, nor
#: IMPORTED_ONLY. (Import names, made from the registry's logical names.)
COMPILE_CODE = _imports("checkout", "compiler", "compiler.launcher", "compiler.worker", "filedigest", "spec",
                        "toolchain", "toolchain.fingerprint", "toolchain.load", "toolchain.mori_import",
                        "toolchain.paths", "toolchain.pins", "toolchain.profiles", "kernels", "kernels.common")

#: Modules a compile worker imports (through the packages it needs) whose code never runs on
#: the compile path: no function of theirs is called between the worker's start and the code
#: object (``tests/test_source_form.py`` traces every call to check it), and the compile code
#: reads none of their values -- each says what it is for. Not in any key: their changes
#: cannot change a byte.
IMPORTED_ONLY = {MODULES.import_name(k): why for k, why in {
    "package": "the package: its docstring and __version__ (a version number is no compile input)",
    "model": "a package: its docstring",
    "util": "a package: its docstring",
    "atomic_write": "writes files atomically; a compile writes none",
    "device_abi": "the pod's mori check; the worker imports only its exception class",
    "errors": "exception classes, raised only when a compile cannot produce a code object",
    "toolchain.diagnose": "`gemmar-aot doctor`'s checks",
    "toolchain.tools": "locates and fingerprints setup tools (clang, ld.lld) at setup",
}.items()}

#: Per recipe with a build half (a ``KernelSpec.recipe``), the modules its build imports
#: beyond COMPILE_CODE: its own module and the ones that imports. Only these join
#: COMPILE_CODE in the key of a kernel of that recipe: a change to one recipe module moves
#: the keys of the recipes that import it, no others; a new recipe moves no existing key.
#: (split-sdma has no build half: its kernels are gemm-only's and sdma-phases'.)
RECIPE_CODE = {recipe: _imports(*mods) for recipe, mods in {
    "fused-sdma": ("kernels.fused_sdma", "kernels.sdma_phases"),
    "fused-lsa": ("kernels.fused_lsa", "kernels.fused_sdma", "kernels.sdma_phases"),
    "split-lsa": ("kernels.split_lsa", "kernels.gemm_only", "kernels.sdma_phases"),
    "gemm-only": ("kernels.gemm_only",),
    "gemv": ("kernels.gemv", "rules"),
    "sdma-phases": ("kernels.sdma_phases",),
    "ep": ("kernels.ep",),
    # mori's hipcc-JIT kernels: no FlyDSL worker; a process of their own drives mori's command
    # builder and runs clang (OWN_COMPILE): what they import of ours, nothing of COMPILE_CODE
    "hipcc": ("kernels.hipcc", "model.hipcc", "spec", "filedigest"),
    # mori's JIT v2 kernels: a process of their own drives mori's plan creation, whose hipcc is
    # ours (kernels.jitv2) and runs clang as the hipcc recipe does (kernels.hipcc)
    "jitv2": ("kernels.jitv2", "kernels.hipcc", "model.jitv2", "model.hipcc", "spec", "filedigest"),
}.items()}
#: Recipes compiled without the FlyDSL worker (COMPILE_CODE): their compile code is their own alone.
OWN_COMPILE = frozenset({"hipcc", "jitv2"})

#: Generator ingredients only some recipes' kernels are made from, by recipe: mori's EP sources
#: (``toolchain.fingerprint.MORI_EP_SOURCE_GLOBS``) can change an EP kernel and no other.
RECIPE_GENERATOR = {"ep": ("mori_ep_sources_digest",)}
_RECIPE_ONLY = {f for fields in RECIPE_GENERATOR.values() for f in fields}

#: Derive code: what turns a code object and its launcher into the record's derived
#: fields (kernel metadata, launch record). Not in any action key; every record names
#: :func:`derive_code_digest`, and a record made by other derive code is re-derived.
DERIVE_CODE = _imports("codeobject", "compiler.derive", "compiler.hostir", "launch")


@lru_cache(maxsize=None)
def compile_code_digest(recipe: str) -> str:
    """The digest of the compile code a kernel of ``recipe`` is built by (normal form)."""
    try:
        own = RECIPE_CODE[recipe]
    except KeyError:
        raise KeyError(f"no compile code listed for recipe {recipe!r}: add it to keys.RECIPE_CODE "
                       f"(known: {sorted(RECIPE_CODE)})") from None
    return modules_digest(_logical((() if recipe in OWN_COMPILE else COMPILE_CODE) + own), MODULES)


@lru_cache(maxsize=1)
def derive_code_digest() -> str:
    """The digest of the derive code (normal form): what every record names."""
    return modules_digest(_logical(DERIVE_CODE), MODULES)


def compiler_ingredients() -> dict:
    """Our code as the toolchain sees it: the compile code of every recipe and the derive code
    (the lock's ``toolchain``, and what every node of a cluster build must agree on)."""
    from gemmar_aot_kernels import RECIPE_VERSION

    return {
        "recipe_version": RECIPE_VERSION,
        "compile_code": {r: compile_code_digest(r) for r in sorted(RECIPE_CODE)},
        "derive_code": derive_code_digest(),
    }


def flydsl_build(fp: Mapping[str, Any]) -> str:
    """``flydsl-<version>`` for a released wheel of that version, else ``flydsl-<version>+<digest>``."""
    version, digest = fp["flydsl"]["version"], fp["flydsl"]["package_digest"]
    if digest in FLYDSL_WHEEL_DIGESTS.get(version, {}):
        return f"flydsl-{version}"
    return f"flydsl-{version}+{digest}"


def toolchain_ingredients(fp: Mapping[str, Any]) -> dict:
    """The parts of a toolchain fingerprint (toolchain.json) that go into every key."""
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
            # Only the EP recipe's keys hash it (RECIPE_GENERATOR); None: set up before EP.
            "mori_ep_sources_digest": fp["mori"].get("ep_sources_digest"),
        },
        "toolchain": {
            "flydsl": flydsl_build(fp),
            "arch": fp["target"]["arch"],
            "code_object_version": fp["target"]["code_object_version"],
            "opt_level": fp["flydsl_opt_level"],
            "cco_bitcode_sha256": bc["sha256"],
            "linker": fp["linker"]["identity"],
        },
        "compiler": compiler_ingredients(),
    }


def ingredients(spec: KernelSpec, fp: Mapping[str, Any]) -> dict:
    """Everything one kernel's key hashes: the spec, the toolchain, and the compile code of its recipe."""
    from gemmar_aot_kernels import RECIPE_VERSION

    if spec.recipe == "hipcc":
        return hipcc_ingredients(spec, fp)
    if spec.recipe == "jitv2":
        return jitv2_ingredients(spec, fp)

    ti = toolchain_ingredients(fp)
    compiler = {"recipe_version": RECIPE_VERSION, "compile_code": compile_code_digest(spec.recipe)}
    own = RECIPE_GENERATOR.get(spec.recipe, ())
    generator = {k: v for k, v in ti["generator"].items() if k not in _RECIPE_ONLY or k in own}
    missing = [k for k in own if generator.get(k) is None]
    if missing:
        from gemmar_aot.util.errors import ToolchainError

        raise ToolchainError(f"the toolchain was set up before gemmar-aot hashed {missing} into {spec.recipe} "
                             f"kernels' keys (its toolchain.json lacks them): run `make setup` (or `python -m "
                             f"gemmar_aot.toolchain setup`) again")
    return {"key_schema": KEY_SCHEMA, "spec": spec.to_json(), "generator": generator,
            "toolchain": ti["toolchain"], "compiler": compiler}


def hipcc_ingredients(spec: KernelSpec, fp: Mapping[str, Any]) -> dict:
    """A hipcc kernel's ingredients: the spec (source, arch, NIC variant, proxy); mori's sources as
    its own JIT cache keys them (the source's subsystem tree and ``include/mori``, whole) and its
    compile driver (``mori/jit``: the flags); the HIP SDK, clang, its resource dir, the host headers
    a device compile reads, the linker; the recipe's compile code (which says how clang is invoked).
    Nothing of FlyDSL, the cco bitcode or mori's version: none of them reaches these bytes."""
    from gemmar_aot_kernels import RECIPE_VERSION

    h = fp.get("hipcc")
    if not h:
        from gemmar_aot.util.errors import ToolchainError

        raise ToolchainError("the toolchain was set up before gemmar-aot built mori's hipcc kernels (its "
                             "toolchain.json has no hipcc section): run `make setup` (or `python -m "
                             "gemmar_aot.toolchain setup`) again")
    tree = spec.param_dict()["dir"].rsplit("/", 1)[0]
    trees = h["mori"]["trees"]
    return {"key_schema": KEY_SCHEMA, "spec": spec.to_json(),
            "generator": {"mori_jit": h["mori"]["jit"], "mori_trees": {t: trees[t] for t in (tree, "include/mori")}},
            "toolchain": {k: h[k] for k in ("clang", "sdk_digest", "resource_dir_digest", "host_headers", "linker")},
            "compiler": {"recipe_version": RECIPE_VERSION, "compile_code": compile_code_digest(spec.recipe)}}


def jitv2_ingredients(spec: KernelSpec, fp: Mapping[str, Any]) -> dict:
    """A JIT v2 kernel's ingredients: the spec (the plan, its request, the text mori rendered, the
    hipcc flags it used, arch and NIC variant); what that text can include of mori's (the trees
    mori's own key hashes) and the libraries that render it and publish it (``libmori_jit.so``,
    ``libmori_ops_v2.so``: they name the cache entry a record states); the compiler as for a hipcc
    kernel (SDK, clang, resource dir, host headers, linker); the recipe's compile code."""
    from gemmar_aot_kernels import RECIPE_VERSION

    h, j = fp.get("hipcc"), fp.get("jitv2")
    if not h or not j:
        from gemmar_aot.util.errors import ToolchainError

        raise ToolchainError("the toolchain was set up before gemmar-aot built mori's JIT v2 kernels (its "
                             "toolchain.json has no jitv2 section): run `make setup` (or `python -m "
                             "gemmar_aot.toolchain setup`) again")
    return {"key_schema": KEY_SCHEMA, "spec": spec.to_json(),
            "generator": {"mori_jitv2": j["mori"]},
            "toolchain": {k: h[k] for k in ("clang", "sdk_digest", "resource_dir_digest", "host_headers", "linker")},
            "compiler": {"recipe_version": RECIPE_VERSION, "compile_code": compile_code_digest(spec.recipe)}}


def action_key(ingr: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(ingr).encode())


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


#: Per recipe: (its compile code's digest under key schema 3, the same code's digest under
#: key schema 4), taken at the commit that moved to schema 4 (the code itself did not change).
#: While a recipe's compile code is still that code, a store's schema-3 entry of the same spec
#: and toolchain holds exactly the kernel schema 4 names: the build takes it over
#: (:func:`schema3_key`, ``build.pipeline``) instead of compiling it again. A recipe whose
#: compile code changed since compiles, as any changed code does.
SCHEMA3_COMPILE_CODE: dict[str, tuple[str, str]] = {
    "ep": ("ad81cc47c2d4c00b18941d3978ef4f25dc5d5f95f4d70329078c08f69d5912b7",
           "b174f39708933ce6bbea8625bac78cf075ff3533c2a181dcef084d2f22d10d69"),
    "fused-lsa": ("c35450ad11e6cc8b81fcad1a068c89310e4e31cd7fc190ceadc83e622d164423",
                  "986e27c56f32a09392bcc1448c2ef99ed46fbca0bbf16a73378e89240173b4e9"),
    "fused-sdma": ("d4832451e70a07065f79e58d8705e632c29ddfa3260577e2519188ae2d29d0cf",
                   "3423b10997699a5178760172e615b13470e0db1a3bfa82e0a1a7604926a9e914"),
    "gemm-only": ("cf1ed4354a7c8f9823c9acf1cee5e21873689937a065da5e7c67f0d618437f56",
                  "1edce5e6b700a3e504814b117e69947d7de0cb0170afc57e96a6e1c088a669eb"),
    "gemv": ("dcb5905a1d0604affc6238d04ca6c610e123440b0fa74dcebae96b36ff5b107b",
             "00a1e6b9062d10284abb39e11828690182e36a2ff4c5af6c950eaeea8327a2b8"),
    "sdma-phases": ("a0678d4a9db16f1ece6ce605eb42f7f5333402e11b4d624ae9ee0066edbd88c3",
                    "d791d0596acb70c346b82363a551140047c0161c3a822504f81e183cc76a1df2"),
    "split-lsa": ("53dd39c06c643bdfd1ea834e7a49cbf66c7621f977f84486f3a831ac5f08538f",
                  "9b15c3c5049e0c6011e82da273f9f160269558d43ec23d9dc4319bc2c24580ed"),
}


def schema3_key(ingr: Mapping[str, Any]) -> str | None:
    """The key schema 3 gave the kernel of ``ingr`` (this schema's ingredients), or None when its
    recipe's compile code is not the code both schemas hashed (:data:`SCHEMA3_COMPILE_CODE`)."""
    got = SCHEMA3_COMPILE_CODE.get(ingr["spec"]["recipe"])
    if got is None or ingr["compiler"]["compile_code"] != got[1]:
        return None
    generator = {k: v for k, v in ingr["generator"].items() if k not in _RECIPE_ONLY}  # schema 3 had none
    return action_key({**ingr, "key_schema": 3, "generator": generator,
                       "compiler": {**ingr["compiler"], "compile_code": got[0]}})
