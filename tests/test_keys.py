"""Action keys: stable across processes and checkouts, sensitive to every ingredient."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemmar_aot.compiler.keys import action_key, diff_ingredients, ingredients, toolchain_ingredients
from gemmar_aot.builder.manifest import load_manifest
from gemmar_aot.builder.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent

# A toolchain fingerprint of the shape toolchain.json has (values are arbitrary).
FP = {
    "schema": 1,
    "digest": "d" * 64,
    "cco_bitcode": {"sha256": "b" * 64, "source": "built", "build": {"compiler": "clang version 22.1.8"}},
    "flydsl": {"version": "0.4.2", "package_digest": "f" * 64},
    "flydsl_opt_level": 2,
    "linker": {"identity": "LLD 22.1.8", "via": "ziglang 0.17.0"},
    "mori": {"distribution": "amd-mori", "version": "1.2.4", "sources_digest": "5" * 64, "ep_sources_digest": "6" * 64, "wheel": "w.whl",
             "wheel_sha256": "a" * 64, "device_abi_digest": "4" * 64},
    "python": "3.11.7",
    "target": {"arch": "gfx950", "code_object_version": 6},
    "torch": {"version": "2.13.0+cpu"},
    "hipcc": {"clang": "clang version 22.1.8", "sdk_digest": "1" * 64, "resource_dir_digest": "2" * 64,
              "host_headers": ["libc6-dev 2.36-9+deb12u14"], "linker": "LLD 22.1.8",
              "debs": [], "mori": {"jit": "3" * 64, "trees": {"include/mori": "7" * 64, "src/ops": "8" * 64,
                                                               "src/io": "9" * 64, "src/collective": "0" * 64}}},
    "jitv2": {"mori": {"trees": {"include/mori": "7" * 64, "src/ops/dispatch_combine_v2": "b" * 64, "src/cco": "c" * 64},
                       "libs": "d" * 64}},
}


def _spec():
    plan = make_plan(load_manifest(ROOT / "manifests" / "smoke.toml"), env={})
    return next(s for s in plan.specs if s.kind == "gemm" and s.recipe == "fused-sdma")


def test_key_is_sha256_of_ingredients_and_has_no_paths():
    ingr = ingredients(_spec(), FP)
    key = action_key(ingr)
    assert len(key) == 64 and int(key, 16) >= 0
    text = json.dumps(ingr)
    for bad in (str(ROOT), "/tmp", "/root", "/home", "/work"):
        assert bad not in text


@pytest.mark.parametrize("path,value", [
    ("cco_bitcode.sha256", "c" * 64),
    ("flydsl.version", "0.5.0"),
    ("flydsl.package_digest", "e" * 64),
    ("flydsl_opt_level", 3),
    ("linker.identity", "Debian LLD 19.1.7"),
    ("mori.version", "1.2.5"),
    ("mori.sources_digest", "6" * 64),
    ("mori.wheel_sha256", "9" * 64),
    ("mori.distribution", "amd-mori-nightly"),
    ("mori.device_abi_digest", "3" * 64),
    ("target.arch", "gfx942"),
    ("target.code_object_version", 5),
])
def test_every_toolchain_ingredient_changes_the_key(path, value):
    base = action_key(ingredients(_spec(), FP))
    fp = copy.deepcopy(FP)
    node = fp
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    changed = ingredients(_spec(), fp)
    assert action_key(changed) != base
    assert diff_ingredients(ingredients(_spec(), FP), changed)


def test_irrelevant_fingerprint_fields_do_not_change_the_key():
    base = action_key(ingredients(_spec(), FP))
    fp = copy.deepcopy(FP)
    fp["torch"]["version"] = "2.14.0+cpu"  # torch only hosts placeholder tensors
    fp["mori"]["wheel"] = "renamed.whl"  # a file name, not content
    fp["digest"] = "0" * 64
    fp["linker"]["via"] = "something else"
    assert action_key(ingredients(_spec(), fp)) == base


def test_keys_travel_across_python_torch_and_the_released_flydsl_wheels():
    """What never changes the bytes is not in the key (see keys.py): a 3.12 runner with torch
    2.11 and FlyDSL's cp312 wheel shares every entry with a 3.11 runner with torch 2.13 and the
    cp311 wheel. A FlyDSL that is not a known release wheel shares nothing."""
    from gemmar_aot.compiler.keys import FLYDSL_WHEEL_DIGESTS

    cp311, cp312 = sorted(FLYDSL_WHEEL_DIGESTS["0.4.2"], key=FLYDSL_WHEEL_DIGESTS["0.4.2"].get)
    plan = make_plan(load_manifest(ROOT / "manifests" / "smoke.toml"), env={})
    a = copy.deepcopy(FP)
    a["flydsl"]["package_digest"] = cp311
    b = copy.deepcopy(a)
    b["python"], b["torch"]["version"], b["flydsl"]["package_digest"] = "3.12.1", "2.11.0+cpu", cp312
    b["cco_bitcode"]["build"] = {"compiler": "clang version 22.1.8", "headers": {"hip": "triton cp312 wheel"}}
    keys_a = [action_key(ingredients(s, a)) for s in plan.specs]
    assert keys_a == [action_key(ingredients(s, b)) for s in plan.specs]
    c = copy.deepcopy(b)
    c["flydsl"]["package_digest"] = "e" * 64  # a local FlyDSL build of the same version
    flydsl = [s for s in plan.specs if s.recipe not in ("hipcc", "jitv2")]  # mori's clang kernels: no FlyDSL
    assert not {action_key(ingredients(s, a)) for s in flydsl} & {action_key(ingredients(s, c)) for s in flydsl}


def test_a_hipcc_kernel_s_key_is_its_sources_clang_and_sdk_and_nothing_of_flydsl():
    """mori's hipcc kernels: their subsystem's tree, include/mori, mori's JIT driver, clang, the SDK,
    the resource dir, the host headers and lld move their keys; FlyDSL, the
    cco bitcode, mori's version and wheel, Python, torch, and another subsystem's tree do not."""
    plan = make_plan(load_manifest(ROOT / "manifests" / "smoke.toml"), env={})
    hip = [s for s in plan.specs if s.recipe == "hipcc"]
    ops = [s for s in hip if s.param_dict()["dir"] == "src/ops/kernels"]
    io = [s for s in hip if s.param_dict()["dir"] == "src/io/kernels"]
    assert ops and io

    def keys(fp, specs):
        return [action_key(ingredients(s, fp)) for s in specs]

    def edited(path: str, value):
        fp = copy.deepcopy(FP)
        node = fp
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
        return fp

    for path, value in (("flydsl.package_digest", "e" * 64), ("cco_bitcode.sha256", "c" * 64), ("python", "3.12.1"),
                        ("mori.version", "1.2.5"), ("mori.wheel_sha256", "9" * 64), ("torch.version", "2.11.0"),
                        ("hipcc.mori.trees.src/io", "5" * 64)):
        assert keys(edited(path, value), ops) == keys(FP, ops), path
    for path, value in (("hipcc.clang", "clang version 23.0.0"), ("hipcc.sdk_digest", "5" * 64),
                        ("hipcc.resource_dir_digest", "5" * 64), ("hipcc.host_headers", ["libc6-dev 2.41"]),
                        ("hipcc.linker", "LLD 23"), ("hipcc.mori.jit", "5" * 64),
                        ("hipcc.mori.trees.include/mori", "5" * 64), ("hipcc.mori.trees.src/ops", "5" * 64)):
        assert not set(keys(edited(path, value), ops)) & set(keys(FP, ops)), path
    assert keys(edited("hipcc.mori.trees.src/ops", "5" * 64), io) == keys(FP, io)


def test_every_builder_argument_changes_the_key():
    spec = _spec()
    base = action_key(ingredients(spec, FP))
    d = spec.to_json()
    for section in ("builder", "cfg"):
        for name, value in d["params"][section].items():
            d2 = copy.deepcopy(d)
            d2["params"][section][name] = (not value) if isinstance(value, bool) else (
                value + 1 if isinstance(value, int) else f"{value}-x")
            from gemmar_aot.model.spec import KernelSpec

            assert action_key(ingredients(KernelSpec.from_json(d2), FP)) != base, (section, name)
    d2 = copy.deepcopy(d)
    d2["rank"] += 1
    from gemmar_aot.model.spec import KernelSpec

    assert action_key(ingredients(KernelSpec.from_json(d2), FP)) != base


def test_a_kernels_key_names_the_compile_code_of_its_own_recipe_and_no_derive_code():
    from gemmar_aot.compiler.keys import compile_code_digest, derive_code_digest
    from gemmar_aot.model.spec import KernelSpec

    spec = KernelSpec.make("sdma-phases", "drain", 0, {"world": 2})
    ingr = ingredients(spec, FP)
    assert ingr["compiler"] == {"recipe_version": ingr["compiler"]["recipe_version"],
                                "compile_code": compile_code_digest("sdma-phases")}
    assert ingr["compiler"]["recipe_version"] >= 1
    # Another recipe's compile code is another digest; the derive code is in no key.
    assert compile_code_digest("sdma-phases") != compile_code_digest("gemv")
    assert derive_code_digest() not in json.dumps(ingr)
    assert "gemmar_aot_version" not in json.dumps(ingr)
    # The lock's toolchain (and a cluster's node check) sees all of our code.
    ti = toolchain_ingredients(FP)
    assert ti["compiler"]["derive_code"] == derive_code_digest()
    assert ti["compiler"]["compile_code"]["sdma-phases"] == compile_code_digest("sdma-phases")


_KEYS = """
import json, sys
from gemmar_aot.compiler.keys import action_key, ingredients
from gemmar_aot.builder.manifest import load_manifest
from gemmar_aot.builder.plan import make_plan
fp = json.loads(sys.argv[1])
plan = make_plan(load_manifest("manifests/smoke.toml"), env={})
print(json.dumps(sorted(action_key(ingredients(s, fp)) for s in plan.specs)))
"""


def test_keys_are_stable_across_processes_and_checkout_paths(tmp_path):
    """The same inputs in another checkout give the same keys."""
    import tree_copy

    clone = tree_copy.copy_tree(tmp_path / "elsewhere" / "checkout")
    shutil.copytree(ROOT / "manifests", clone / "manifests")
    outs = []
    for cwd in (ROOT, clone):
        # the one toolchain: a HIP-backend [[ep]] entry is planned by the toolchain's mori
        env = {"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "random",
               "GEMMAR_AOT_TOOLCHAIN": str(ROOT / ".toolchain")}
        p = subprocess.run([sys.executable, "-c", _KEYS, json.dumps(FP)], cwd=cwd, env=env,
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        outs.append(json.loads(p.stdout))
    assert outs[0] == outs[1] and len(outs[0]) == len(make_plan(load_manifest(ROOT / "manifests" / "smoke.toml")).specs)


def test_the_ep_sources_are_in_the_ep_kernels_keys_and_no_others():
    """mori's EP generator sources can change an EP kernel and no other: only the EP recipe's
    keys hash their digest, and a toolchain set up before they were recorded is told to set up
    again (for EP only)."""
    from gemmar_aot.util.errors import ToolchainError

    plan = make_plan(load_manifest(ROOT / "manifests" / "smoke.toml"), env={})
    other = copy.deepcopy(FP)
    other["mori"]["ep_sources_digest"] = "7" * 64
    ep = [s for s in plan.specs if s.recipe == "ep"]
    rest = [s for s in plan.specs if s.recipe != "ep"]
    assert ep and rest
    assert all(action_key(ingredients(s, FP)) != action_key(ingredients(s, other)) for s in ep)
    assert all(action_key(ingredients(s, FP)) == action_key(ingredients(s, other)) for s in rest)
    old = copy.deepcopy(FP)
    del old["mori"]["ep_sources_digest"]
    assert all(action_key(ingredients(s, FP)) == action_key(ingredients(s, old)) for s in rest)
    with pytest.raises(ToolchainError, match=r"run `make setup`"):
        ingredients(ep[0], old)
