"""Debian's own ROCm ``hipcc`` (7.2.4+dfsg-1~exp1, on Debian's clang 22.1.8), as mori's ``compile_genco``
and its JIT v2 run it: the oracle of the ``-k debian`` parity tests. Nothing of it is ours: the program is Debian's,
run in the toolchain's tree of Debian's packages (``gemmar_aot.toolchain.debian_rocm``).

``ROCM_PATH/bin/hipcc`` is a shell line running this file. Given mori's own hipcc command it:

* stages mori's ``_jit-sources`` as ``mori`` in a working directory, every path under it made
  relative (``mori/...``; a translation unit mori's JIT v2 rendered outside that tree is copied there
  as ``kernel.hip``), and adds ``-cuid=mori_<source stem>``: the two normalisations every
  byte-parity test of the project makes (a pod's own paths and command-line hash would otherwise
  reach ``__FILE__`` strings and a symbol);
* runs Debian's real ``hipcc`` there, in the tree (a chroot);
* writes to mori's ``-o`` the code object of the bundle hipcc made, extracted by Debian's own
  ``clang-offload-bundler`` (mori loads the bundle; the code object inside is what runs);
* appends the command hipcc ran clang with (``HIPCC_VERBOSE=7``) to ``$DEBIAN_HIPCC_LOG``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

MARK = "/_jit-sources"


def main(argv: list[str]) -> int:
    from gemmar_aot.toolchain import debian_rocm

    if argv == ["--version"]:
        p = debian_rocm.run_hipcc(["--version"])
        sys.stdout.write(p.stdout)
        return p.returncode
    source = next(a for a in argv if a.endswith(".hip"))
    out_at = argv.index("-o") + 1
    dest, arch = argv[out_at], next(a.split("=", 1)[1] for a in argv if a.startswith("--offload-arch="))
    args = list(argv)
    args[out_at] = "bundle.o"
    staged = None
    if MARK in source:  # a source of mori's tree (compile_genco)
        mori_root = source[: source.index(MARK) + len(MARK)]
    else:  # a translation unit mori's JIT v2 rendered into its cache: mori's tree is its -I root
        inc = next(a for a in args if MARK in a)
        inc = inc[2:] if inc.startswith("-I") else inc
        mori_root = inc[: inc.index(MARK) + len(MARK)]
        staged, source = source, "kernel.hip"
        args = ["kernel.hip" if a == staged else a for a in args]
    rel = ["mori" + a[len(mori_root):] if a.startswith(mori_root) else
           ("-Imori" + a[2 + len(mori_root):] if a.startswith("-I" + mori_root) else a) for a in args]
    rel.append(f"-cuid=mori_{Path(source).stem}")
    with tempfile.TemporaryDirectory(prefix="debian-hipcc-") as td:
        stage = Path(td)
        (stage / "mori").symlink_to(mori_root)
        if staged is not None:
            shutil.copyfile(staged, stage / "kernel.hip")
        p = debian_rocm.run_hipcc(rel, stage, verbose=True, timeout=1800)
        if p.returncode != 0 or not (stage / "bundle.o").is_file():
            sys.stderr.write(p.stdout + p.stderr)
            return p.returncode or 1
        debian_rocm.unbundle(stage / "bundle.o", arch, stage / "out.hsaco")
        shutil.copyfile(stage / "out.hsaco", dest)
    cmd = [line.split("hipcc-cmd:", 1)[1].strip() for line in (p.stdout + p.stderr).splitlines() if "hipcc-cmd:" in line]
    log = os.environ.get("DEBIAN_HIPCC_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"hipcc": argv, "clang": cmd}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
