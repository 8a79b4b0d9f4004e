"""The normal form of our code that keys hash, and the lists of compile and derive code."""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemmar_aot.compiler import keys
from gemmar_aot.compiler.source_form import normal_form

ROOT = Path(__file__).resolve().parent.parent

BASE = '''"""A module."""
import os

X = 1


def f(a, b=2):
    """Add."""
    return a + b * X  # times X


class C:
    """A class."""

    def m(self):
        return f"{self!r:>{X}} and {os.sep}"
'''


@pytest.mark.parametrize("variant", [
    BASE.replace('"""A module."""', '"""Another module docstring,\n\nover lines."""'),
    BASE.replace('    """Add."""\n', ""),
    BASE.replace('"""A class."""', "'''Documented otherwise.'''"),
    "# a comment first\n" + BASE + "\n\n# and one last\n",
    BASE.replace("return a + b * X  # times X", "return (a +\n            b * X)"),
    BASE.replace("def f(a, b=2):", "def f(\n    a,\n    b=2,\n):"),
    BASE.replace("X = 1", "X = (1)"),
    BASE.replace("    def m(self):", "\n\n    def m(self):"),
])
def test_the_normal_form_is_blind_to_comments_docstrings_and_formatting(variant):
    assert normal_form(variant) == normal_form(BASE)


def test_an_empty_module_and_a_module_of_only_a_docstring_are_alike():
    assert normal_form("") == normal_form('"""Only a docstring."""\n') == normal_form("# only a comment\n")
    assert normal_form("") != normal_form("pass\n")


@pytest.mark.parametrize("variant", [
    BASE.replace("X = 1", "X = 2"),
    BASE.replace("X = 1", "X = 1.0"),
    BASE.replace("X = 1", "X = True"),
    BASE.replace("b=2", "b=3"),
    BASE.replace("a + b * X", "a - b * X"),
    BASE.replace("a + b * X", "(a + b) * X"),
    BASE.replace("def f(a, b=2)", "def g(a, b=2)"),
    BASE.replace("import os", "import os.path"),
    BASE.replace("!r:>", "!s:>"),
    BASE.replace("and {os.sep}", "or {os.sep}"),
    BASE.replace('"""A class."""\n', '"""A class."""\n    doc = "a string that is not a docstring"\n'),
    BASE + "\nY = f(1)\n",
])
def test_the_normal_form_sees_every_change_a_program_can_observe(variant):
    assert normal_form(variant) != normal_form(BASE)


def _listed_modules():
    mods = set(keys.COMPILE_CODE) | set(keys.DERIVE_CODE) | set(keys.IMPORTED_ONLY)
    for own in keys.RECIPE_CODE.values():
        mods |= set(own)
    return sorted(mods)


def test_every_listed_module_exists_and_none_reads_its_docstring():
    from gemmar_aot.compiler.source_form import module_source

    for name in _listed_modules():
        origin, data = module_source(name)
        tree = ast.parse(data)
        reads = [n.lineno for n in ast.walk(tree)
                 if (isinstance(n, ast.Name) and n.id == "__doc__")
                 or (isinstance(n, ast.Attribute) and n.attr == "__doc__")]
        assert not reads, f"{origin} reads __doc__ (lines {reads}): docstrings are not in its key"
    assert not set(keys.COMPILE_CODE) & set(keys.DERIVE_CODE), "a module is compile code or derive code"
    assert not set(keys.IMPORTED_ONLY) & (set(keys.COMPILE_CODE) | set(keys.DERIVE_CODE))


def test_every_recipe_with_a_build_half_has_its_compile_code_listed():
    import pkgutil

    import gemmar_aot_kernels
    from gemmar_aot_kernels import recipe_module

    with_build = set()
    for info in pkgutil.iter_modules(gemmar_aot_kernels.__path__):
        if info.name.startswith("_"):
            continue
        mod = recipe_module(info.name.replace("_", "-"))
        if hasattr(mod, "build") or hasattr(mod, "compile_object"):  # FlyDSL's build half, or clang's (hipcc)
            with_build.add(mod.RECIPE)
    assert with_build == set(keys.RECIPE_CODE)


def _pythons() -> list[str]:
    """Every CPython 3.10+ on this machine (pyenv's included), one per minor version."""
    found: dict[str, str] = {}
    candidates = [shutil.which(f"python3.{m}") for m in range(10, 15)]
    candidates += glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3"))
    for exe in filter(None, candidates):
        try:
            v = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30, env={**os.environ, "PYENV_VERSION": ""})
        except (OSError, subprocess.TimeoutExpired):
            continue
        if v.returncode == 0 and tuple(map(int, v.stdout.split("."))) >= (3, 10):
            found.setdefault(v.stdout.strip(), exe)
    return sorted(found.values())


_FORMS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import source_form
files = sys.argv[2:]
print(json.dumps({f: source_form.normal_form(open(f, "rb").read()) for f in files}))
"""


def test_the_normal_form_of_the_whole_package_is_the_same_under_every_python_here():
    """Keys travel across Pythons: a 3.11 and a 3.12 runner must hash our code alike."""
    pythons = _pythons()
    if len(pythons) < 2:
        pytest.skip(f"only {pythons or 'no'} CPython 3.10+ found here: nothing to compare")
    files = [str(p) for p in sorted((ROOT / "gemmar_aot").rglob("*.py")) + sorted((ROOT / "kernels").glob("*.py"))]
    forms = {}
    for exe in pythons:
        p = subprocess.run([exe, "-c", _FORMS, str(ROOT / "gemmar_aot" / "compiler"), *files], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYENV_VERSION": ""})
        assert p.returncode == 0, (exe, p.stderr[-2000:])
        forms[exe] = json.loads(p.stdout)
    first, *rest = pythons
    for exe in rest:
        differ = [f for f in files if forms[exe][f] != forms[first][f]]
        assert not differ, f"{exe} and {first} write different normal forms of {differ}"


# ---- the compile path imports only listed modules (real compiles) ----

_PROBE = """
import inspect, json, sys
from gemmar_aot.model.spec import KernelSpec
spec = KernelSpec.from_json(json.loads(sys.argv[1]))
called = {}

def profile(frame, event, arg):
    code = frame.f_code
    # Functions only: not module bodies, class bodies, or the __init__ dataclasses generate for a class.
    if event == "call" and code.co_flags & inspect.CO_OPTIMIZED and code.co_name != "__create_fn__":
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith("gemmar"):
            called.setdefault(mod, set()).add(code.co_name)

sys.setprofile(profile)
from gemmar_aot.compiler import worker
worker.init(None, False)
code, launcher = worker.compile_code(spec)
sys.setprofile(None)
# The compile is over: the code object and the launcher exist, the derive step has not run.
print(json.dumps({"code": len(code), "modules": sorted(m for m in sys.modules if m.startswith("gemmar")),
                  "called": {m: sorted(f) for m, f in called.items()}}))
"""


#: A hipcc compile, as the build runs it: ``python -m gemmar_aot_kernels.hipcc`` in a process of its own.
_HIPCC_PROBE = _PROBE[:_PROBE.index("sys.setprofile(profile)")] + """
import tempfile
from pathlib import Path
sys.setprofile(profile)
from gemmar_aot_kernels import hipcc
with tempfile.TemporaryDirectory() as td:
    hipcc.compile_object(json.loads(sys.argv[1])["params"], Path(sys.argv[2]), Path(sys.argv[3]), Path(td) / "o")
    size = (Path(td) / "o").stat().st_size
sys.setprofile(None)
print(json.dumps({"code": size, "modules": sorted(m for m in sys.modules if m.startswith("gemmar")),
                  "called": {m: sorted(f) for m, f in called.items()}}))
"""


@pytest.mark.compile
def test_a_hipcc_compile_imports_only_its_own_compile_code(tmp_path):
    """mori's hipcc kernels compile without a FlyDSL worker: in their own process, what of ours is
    imported is the recipe's compile code (keys.RECIPE_CODE["hipcc"]) or a package's docstring, and
    only the recipe's code runs -- nothing of COMPILE_CODE, whose changes must not move their keys."""
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot.toolchain import load_toolchain

    spec = next(s for s in make_plan(load_manifest(ROOT / "manifests" / "smoke.toml")).specs if s.recipe == "hipcc")
    tc = load_toolchain()
    p = subprocess.run([sys.executable, "-c", _HIPCC_PROBE, json.dumps(spec.to_json()), str(tc.root), str(tc.mori_dir)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["code"] > 0
    listed = set(keys.RECIPE_CODE["hipcc"])
    packages = {"gemmar_aot", "gemmar_aot.model", "gemmar_aot.util", "gemmar_aot_kernels"}
    assert set(got["modules"]) - listed == packages & set(got["modules"]), sorted(set(got["modules"]) - listed)
    assert set(got["called"]) <= listed and "gemmar_aot_kernels.hipcc" in got["called"]


@pytest.mark.compile
def test_a_compile_worker_imports_only_the_compile_code_its_recipe_lists():
    """In a fresh process, as a pool worker starts: everything of ours imported by the time the
    code object exists is in COMPILE_CODE or the recipe's RECIPE_CODE -- else a change to it
    could change bytes without moving a key -- or in IMPORTED_ONLY, and then none of its
    functions ran."""
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan

    one = {}
    for m in ("smoke.toml", "dsv4-pro-ep.toml"):
        for s in make_plan(load_manifest(ROOT / "manifests" / m)).specs:
            one.setdefault(s.recipe, s)
    assert set(one) == set(keys.RECIPE_CODE), "smoke.toml and dsv4-pro-ep.toml build a kernel of every recipe"
    for recipe in keys.OWN_COMPILE:  # no FlyDSL worker: test_a_hipcc_compile_imports_only_its_own_compile_code
        del one[recipe]
    imported_only_seen = set()
    for recipe, spec in sorted(one.items()):
        p = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(spec.to_json())], capture_output=True,
                           text=True, timeout=600, cwd=ROOT)
        assert p.returncode == 0, p.stderr[-3000:]
        got = json.loads(p.stdout.strip().splitlines()[-1])
        assert got["code"] > 0
        listed = set(keys.COMPILE_CODE) | set(keys.RECIPE_CODE[recipe])
        missing = sorted(set(got["modules"]) - listed - set(keys.IMPORTED_ONLY))
        assert not missing, (f"a {recipe} compile imports {missing} before its code object exists: add them "
                             f"to keys.COMPILE_CODE (every recipe) or keys.RECIPE_CODE[{recipe!r}]")
        ran = {m: f for m, f in got["called"].items() if m in keys.IMPORTED_ONLY}
        assert not ran, (f"a {recipe} compile runs code of modules listed as imported only: {ran}; "
                         f"move them to keys.COMPILE_CODE")
        assert not set(got["modules"]) & set(keys.DERIVE_CODE), "derive code ran inside the compile action"
        imported_only_seen |= set(got["modules"]) & set(keys.IMPORTED_ONLY)
        # The probe sees the calls: the listed compile code did run.
        assert "gemmar_aot.compiler.worker" in got["called"] and got["called"].get("gemmar_aot.toolchain.load")
    assert imported_only_seen == set(keys.IMPORTED_ONLY), "IMPORTED_ONLY names modules no compile imports"
