"""The process one hipcc or JIT v2 compile runs in, and how it ends.

``python -m gemmar_aot.compiler.hipcc_process SPEC_JSON TOOLCHAIN_ROOT MORI_DIR WORK_DIR`` compiles one
spec with its recipe's ``main`` (``gemmar_aot_kernels.hipcc``, ``gemmar_aot_kernels.jitv2``) into
``WORK_DIR/out.hsaco`` and prints what the recipe prints (the clang command, as JSON).
``... plans REQUEST_JSON WORK_DIR`` runs JIT v2's plan step (``gemmar_aot_kernels.jitv2_plans``) the same
way: mori's own code, in a process that goes with the build. ``WORK_DIR`` is this compile's own (the build makes it under the store's
``work/``); the build reads the code object and removes it.

What this module adds to the recipe is the process's life, nothing that reaches clang's output:

* it leads a process group of its own, which holds everything the compile starts: clang's driver,
  its ``-cc1`` and the linker;
* SIGTERM, SIGINT or SIGHUP, or the death of the build (``$GEMMAR_AOT_BUILD_PID``) however it
  died, SIGKILL included (the parent-death signal and a watchdog:
  :func:`gemmar_aot.util.lifecycle.die_with_parent`), end that whole group and remove ``WORK_DIR``;
* ``TMPDIR`` is ``WORK_DIR``: the recipe's staging directory and clang's own temporaries land
  there, never in the system temp directory, and go with it.

It is not in any key: a process group, signal handlers and where temporaries live change no
byte (paths clang sees are relative to the staging directory, whatever its parent).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

#: What the build sets: the PID whose death ends the compile.
BUILD_PID_ENV = "GEMMAR_AOT_BUILD_PID"
#: The code object's name in a compile's work directory.
OUT_NAME = "out.hsaco"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def guard(work: Path) -> None:
    """Make this process end with its build or on a stop signal, taking its group and ``work`` along."""
    from gemmar_aot.util.lifecycle import die_with_parent, sweep_process_group

    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)  # a group of our own: the sweep never reaches whoever started us
    stopping: list[int] = []

    def stop(signum: int) -> None:
        if stopping:
            return
        stopping.append(signum)
        for s in _STOP_SIGNALS:
            try:
                signal.signal(s, signal.SIG_IGN)
            except ValueError:  # called from the watchdog's thread: ``stopping`` guards instead
                pass
        sweep_process_group()
        shutil.rmtree(work, ignore_errors=True)
        os._exit(128 + signum)

    for s in _STOP_SIGNALS:
        signal.signal(s, lambda signum, _frame: stop(signum))
    build = int(os.environ.get(BUILD_PID_ENV) or os.getppid())
    die_with_parent(build, on_death=lambda: stop(signal.SIGTERM), death_signal=signal.SIGTERM)


def main(argv: list[str]) -> int:
    if argv[:1] == ["plans"] and len(argv) == 3:  # JIT v2's plan step: mori's code finds the units
        work = Path(argv[2])
        guard(work)
        os.environ["TMPDIR"] = str(work)
        from gemmar_aot_kernels import jitv2_plans

        return jitv2_plans.main(argv[1:2])
    if len(argv) != 4:
        sys.stderr.write(f"usage: python -m {__spec__.name} SPEC_JSON TOOLCHAIN_ROOT MORI_DIR WORK_DIR\n"
                         f"       python -m {__spec__.name} plans REQUEST_JSON WORK_DIR\n")
        return 2
    work = Path(argv[3]).resolve()  # TMPDIR below: clang runs in another directory
    guard(work)
    os.environ["TMPDIR"] = str(work)  # read by tempfile at its first use, and by clang
    import json

    from gemmar_aot_kernels import recipe_module

    return recipe_module(json.loads(argv[0])["recipe"]).main([*argv[:3], str(work / OUT_NAME)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
