"""Running the oracle process (shared by the parity tier and bench/bench_parity.py).

:func:`start_oracle` starts ``tests/parity/oracle.py`` for a list of scenarios in
the background (so a candidate build can run beside it) and returns a handle
whose :meth:`OracleJob.wait` gives each scenario's record by name. With a
``keep`` directory an earlier record is reused when, and only when, the inputs
are identical (scenarios, toolchain digest, the oracle's, shims' and doubles' sources).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ORACLE = TESTS / "parity" / "oracle.py"


def inputs_digest(scenarios: list, extra: str = "") -> str:
    from gemmar_aot.toolchain import load_toolchain

    h = hashlib.sha256()
    h.update(json.dumps([s.to_json() for s in scenarios], sort_keys=True).encode())
    h.update(extra.encode())
    h.update(load_toolchain().digest.encode())
    # what the oracle's record depends on (not the comparison or the candidate side)
    for f in [TESTS / "parity" / n for n in ("oracle.py", "shims.py", "scenario.py", "ep_scenario.py",
                                             "compare.py")] + [
            TESTS / "hipstub" / "hipstub.c", TESTS / "hipstub" / "__init__.py", TESTS / "fakes.py"]:
        h.update(f.read_bytes())
    return h.hexdigest()


class OracleJob:
    def __init__(self, out: Path, log: Path, proc: subprocess.Popen | None, digest: str):
        self.out, self.log, self.proc, self.digest = out, log, proc, digest

    def wait(self, timeout: float = 3600) -> dict:
        if self.proc is not None:
            rc = self.proc.wait(timeout=timeout)
            if rc != 0:
                raise RuntimeError(f"the oracle failed (exit {rc}); its log ({self.log}):\n"
                                   f"{self.log.read_text()[-6000:]}")
            data = json.loads(self.out.read_text())
            data["inputs"] = self.digest
            self.out.write_text(json.dumps(data))
            self.proc = None
        data = json.loads(self.out.read_text())
        return {r["scenario"]["name"]: r for r in data["results"]}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_oracle(scenarios: list, stub_path: str | os.PathLike, work: Path, *, reuse: bool = False,
                 extra_inputs: str = "") -> OracleJob:
    """Start the oracle on ``scenarios`` (or reuse ``work``'s record of the same inputs when ``reuse``)."""
    work.mkdir(parents=True, exist_ok=True)
    out, log = work / "oracle.json", work / "oracle.log"
    digest = inputs_digest(scenarios, extra_inputs)
    if reuse and out.is_file():
        try:
            if json.loads(out.read_text()).get("inputs") == digest:
                return OracleJob(out, log, None, digest)
        except ValueError:
            pass
    job = {"stub": str(stub_path), "scenarios": [s.to_json() for s in scenarios]}
    (work / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(stub_path).parent)}
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, str(ORACLE), str(work / "job.json"), str(out)], env=env,
                                stdout=fh, stderr=subprocess.STDOUT, cwd=TESTS.parent)
    return OracleJob(out, log, proc, digest)
