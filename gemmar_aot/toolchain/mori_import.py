"""Import mori's pure-Python kernel generators without ROCm.

``mori/__init__``, ``mori/ops/__init__`` and ``mori/cco/__init__`` load native
libraries that need ROCm (libamdhip64, libhsa-runtime64). The generator modules
under them are pure Python. Registering the three packages in ``sys.modules`` as
bare packages (a module with ``__path__`` set to the real directory) makes
Python import their submodules from the real files while never running those
``__init__``s.

``mori/ops/gemm_ar/op.py`` imports two names from ``mori.cco`` that only its
runtime path uses; the bare ``mori.cco`` carries build-time placeholders for
them that raise if anything tries to use them.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from .load import Toolchain

#: The packages whose ``__init__`` must not run (they load native libraries).
BARE_PACKAGES = ("mori", "mori.ops", "mori.cco")
_MARK = "__gemmar_aot_bare_package__"


class BuildTimePlaceholder:
    """Stands in for a name of mori's native ``cco`` extension in a compile-only
    process. Calling it, reading or setting its attributes, or converting it to
    an int raises; identity, hashing and repr work (introspection stays safe)."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)

    def _fail(self, *_a, **_k):
        raise RuntimeError(
            f"{self._qualname} is a build-time placeholder (gemmar_aot.toolchain.import_mori_device): "
            "mori's native cco extension is not loaded in a compile-only process"
        )

    __call__ = _fail
    __int__ = _fail
    __index__ = _fail

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()

    def __setattr__(self, name, value):
        self._fail()

    def __repr__(self) -> str:
        return f"<build-time placeholder for {self._qualname}>"


def _bare_package(name: str, directory: Path) -> types.ModuleType:
    mod = types.ModuleType(name, f"bare package for {directory} (its __init__ is not run; see gemmar_aot.toolchain.mori_import)")
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(directory)]
    mod.__spec__ = spec
    mod.__path__ = [str(directory)]
    mod.__package__ = name
    setattr(mod, _MARK, True)
    return mod


def import_mori_device(tc: Toolchain) -> None:
    """Make ``mori.ops.gemm_ar.*`` and ``mori.cco.device.*`` importable in this
    process, from the toolchain's unpacked mori, without loading any native
    library. Idempotent. Apply ``compile_env(tc)`` to ``os.environ`` before
    compiling (it tells mori where the cco bitcode is)."""
    pkg = Path(tc.mori_dir) / "mori"
    dirs = {"mori": pkg, "mori.ops": pkg / "ops", "mori.cco": pkg / "cco"}
    for name, d in dirs.items():
        if not (d / "__init__.py").is_file():
            raise ToolchainError(f"{d}/__init__.py is missing: mori is not unpacked at {tc.mori_dir}\n  fix: run `make setup`")

    existing = sys.modules.get("mori")
    if existing is not None:
        if getattr(existing, _MARK, False) and list(existing.__path__) == [str(pkg)]:
            return  # already done for this toolchain
        where = getattr(existing, "__path__", None) or getattr(existing, "__file__", "?")
        raise ToolchainError(
            f"a different mori is already imported in this process (from {where}); "
            "import_mori_device must run before anything imports mori\n"
            "  fix: call import_mori_device(tc) first, in a fresh process"
        )

    if str(tc.mori_dir) not in sys.path:
        sys.path.insert(0, str(tc.mori_dir))
    mods = {name: _bare_package(name, d) for name, d in dirs.items()}
    cco = mods["mori.cco"]
    cco.GDA_CONNECTION_NONE = BuildTimePlaceholder("mori.cco.GDA_CONNECTION_NONE")
    cco.CCODevCommRequirements = BuildTimePlaceholder("mori.cco.CCODevCommRequirements")
    mods["mori"].ops = mods["mori.ops"]
    mods["mori"].cco = cco
    sys.modules.update(mods)
