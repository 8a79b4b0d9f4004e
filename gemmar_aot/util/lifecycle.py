"""Child processes that end with the process that started them, however it ends.

A build's helpers (FlyDSL workers, hipcc compiles and the clang under them) must not outlive
the build: not after Ctrl-C, not after SIGKILL or the OOM killer, which give the build no chance
to clean up. Two mechanisms, because neither alone is enough:

* the kernel's parent-death signal (``PR_SET_PDEATHSIG``): immediate, but tied to the *thread*
  that forked us and set only after we start (a parent that died in between sends nothing);
* a watchdog thread that notices being reparented (``getppid()`` no longer the parent we were
  told of): covers that race, a forking thread that ends before us, and platforms without prctl.

:func:`sweep_process_group` ends every other member of this process's group: what a compile
process that leads its own group (``start_new_session``) uses to take clang's driver, ``-cc1``
and the linker with it, without knowing their PIDs. :func:`kill_process_group` is the same from
outside the group: what the build runs once a compile process has ended or it is interrupted.
:func:`remove_stale_work` removes what a compile killed together with everything around it (a
machine that lost power) left in a ``work/``: ``gc`` runs it on a store, a Ray node before it compiles.

``gemmar_aot.compiler.worker`` keeps its own ``die_with_parent`` (SIGKILL, no clean-up): it is part
of the compile code every FlyDSL kernel's key hashes, and moving it here would re-key every kernel
of every store for no byte of difference.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Callable

PR_SET_PDEATHSIG = 1
#: A compile directory whose entries have not changed for this long belongs to no running compile.
STALE_WORK_S = 3600.0


def die_with_parent(parent_pid: int, *, on_death: Callable[[], None] | None = None,
                    death_signal: int = signal.SIGKILL) -> None:
    """Run ``on_death`` (default: end the process at once, no clean-up) when ``parent_pid`` goes away.

    ``death_signal`` is what the kernel sends when the forking thread dies: SIGKILL (nothing to
    clean), or a signal this process handles itself (it must call ``on_death`` from its handler)."""
    act = on_death or (lambda: os._exit(1))
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        act()
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                act()
                os._exit(1)

    threading.Thread(target=watch, name="gemmar-parent-watchdog", daemon=True).start()


def _group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group ``pgid`` (from /proc; zombies excluded)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 2 and fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            out.append(int(name))
    return out


def sweep_process_group(*, rounds: int = 50) -> None:
    """SIGKILL every other live member of this process's group, until none is left.

    Repeats the scan: a member forking while we scan (clang's driver starting the linker) is
    caught on the next round, and a killed driver forks nothing more."""
    me, pgid = os.getpid(), os.getpgid(0)
    for _ in range(rounds):
        others = [p for p in _group_members(pgid) if p != me]
        if not others:
            return
        for p in others:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
        _reap_children()


def kill_process_group(pgid: int, *, timeout: float = 2.0) -> bool:
    """SIGKILL every live member of process group ``pgid`` (not ours: a compile's) until none is
    left or ``timeout`` seconds pass; True when the group is gone. What a directory its members
    write to must wait for before it is removed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        if not _group_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def _reap_children() -> None:
    """Collect this process's children that have ended (no zombie stays behind us)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def remove_stale_work(work: Path, cutoff: float, *, dry_run: bool = False) -> int:
    """How many entries of ``work`` (compile directories) were last modified before ``cutoff``,
    each removed unless ``dry_run``."""
    if not work.is_dir():
        return 0
    n = 0
    for d in work.iterdir():
        with contextlib.suppress(OSError):
            if d.lstat().st_mtime < cutoff:
                n += 1
                if not dry_run:
                    if d.is_dir() and not d.is_symlink():
                        shutil.rmtree(d, ignore_errors=True)
                    else:
                        d.unlink()
    return n
