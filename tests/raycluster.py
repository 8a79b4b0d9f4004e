"""A real local Ray cluster on loopback for tests: a head and worker nodes, each a
``ray start`` of this venv's Ray, stopped by PID only.

Every node is started in a session of its own (``start_new_session``), so every
process it spawns -- gcs_server, raylet, the agents, the workers the raylet forks
later -- carries that session id; those PIDs, and nothing else, are what ``kill_node``
and ``stop`` signal. SIGTERM first; gcs_server and the raylet ignore it when their
parent is gone, so whatever is left after a grace period gets SIGKILL. Never
``ray stop`` (it ends every Ray process on the machine).

Every node has a loopback address of its own (head 127.0.0.2, then .3, .4, ...), so
all traffic stays on loopback and messages name distinct nodes. Not 127.0.0.1: Ray
rewrites "127.0.0.1" and "localhost" (in ``--node-ip-address`` and ``--address``) into
the host's routable address, which would take the cluster off loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY_BIN = Path(sys.executable).with_name("ray")

#: Memory savers: no log monitor, no usage stats, no metrics (and no dashboard UI on the head).
QUIET_FLAGS = ("--include-log-monitor=false", "--disable-usage-stats")
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_enable_metrics_collection": "0",
    "RAY_DEDUP_LOGS": "0",
    # A killed node is declared dead after 5 failed health checks of the head's GCS: one a second
    # here (~5 s) instead of Ray's default one every 3 s (~15 s). A check still waits Ray's default
    # 10 s for an answer, so a live node on a loaded 2-core host is not taken for dead.
    "RAY_health_check_period_ms": "1000",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_pids(sid: int) -> list[int]:
    """PIDs of live processes in session ``sid`` (one we created), from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(d))
    return out


def process_title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class RayNode:
    name: str
    sid: int  # the session every process of this node carries
    env: dict
    log: Path
    pids_seen: set[int] = field(default_factory=set)

    def pids(self) -> list[int]:
        live = session_pids(self.sid)
        self.pids_seen.update(live)
        return live

    def raylet_pid(self) -> int | None:
        for pid in self.pids():
            if "/raylet/raylet " in process_title(pid) + " ":
                return pid
        return None

    def workers(self, title: str) -> list[int]:
        """PIDs of this node's Ray workers whose process title starts with ``title``."""
        return [p for p in self.pids() if process_title(p).startswith(title)]


class LocalRayCluster:
    """``with LocalRayCluster(tmp) as c: c.start_head(1); c.add_node("w1", 1)``; ``c.address``."""

    def __init__(self, env: dict | None = None, start_timeout: float = 60.0):
        # Short socket paths: AF_UNIX paths are limited to 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="r-"))  # short: Ray's unix sockets live below
        self.env = {**os.environ, **QUIET_ENV, **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.start_timeout = start_timeout
        self.nodes: list[RayNode] = []
        self.port = free_port()
        self.head_ip = "127.0.0.2"
        self.address = f"{self.head_ip}:{self.port}"

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self, name: str, args: list[str], env_extra: dict | None) -> RayNode:
        env = {**self.env, **(env_extra or {})}
        log = self.temp_dir / f"{name}.start.log"
        cmd = [str(RAY_BIN), "start", f"--node-name={name}",
               f"--temp-dir={self.temp_dir}", *QUIET_FLAGS, *args]
        with open(log, "wb") as out:
            p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        node = RayNode(name, p.pid, env, log)
        self.nodes.append(node)  # before waiting: a timeout still tears it down
        try:
            rc = p.wait(timeout=self.start_timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"`ray start` for {name} took over {self.start_timeout:.0f} s:\n"
                               f"{log.read_text(errors='replace')[-3000:]}") from None
        if rc != 0:
            raise RuntimeError(f"`ray start` for {name} failed ({rc}):\n{log.read_text(errors='replace')[-3000:]}")
        node.pids()
        return node

    def start_head(self, num_cpus: int, env: dict | None = None) -> RayNode:
        return self._start("head", ["--head", f"--node-ip-address={self.head_ip}", "--include-dashboard=false",
                                    f"--port={self.port}", f"--num-cpus={num_cpus}",
                                    f"--node-manager-port={free_port()}",
                                    f"--object-manager-port={free_port()}",
                                    f"--dashboard-agent-listen-port={free_port()}",
                                    f"--object-store-memory={100 * 2**20}"], env)

    def add_node(self, name: str, num_cpus: int, env: dict | None = None) -> RayNode:
        ip = f"127.0.0.{3 + sum(1 for n in self.nodes if n.name != 'head')}"
        return self._start(name, [f"--address={self.address}", f"--node-ip-address={ip}", f"--num-cpus={num_cpus}",
                                  f"--node-manager-port={free_port()}",
                                  f"--object-manager-port={free_port()}",
                                  f"--dashboard-agent-listen-port={free_port()}",
                                  f"--object-store-memory={100 * 2**20}"], env)

    def wait_for_nodes(self, n: int, timeout: float = 60.0) -> None:
        """Until the cluster reports ``n`` alive nodes (asked from a separate driver process)."""
        code = ("import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
                "print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline = time.monotonic() + timeout
        alive = -1
        while time.monotonic() < deadline:
            p = subprocess.run([sys.executable, "-c", code, self.address], env=self.env, capture_output=True,
                               text=True, timeout=timeout)
            if p.returncode == 0 and p.stdout.strip().isdigit():
                alive = int(p.stdout.strip())
                if alive == n:
                    return
            time.sleep(1)
        raise RuntimeError(f"the cluster has {alive} alive nodes after {timeout:.0f} s, expected {n}")

    def kill_node(self, node: RayNode, sig: int = signal.SIGKILL) -> list[int]:
        """Signal every process of ``node`` (SIGKILL: the node dies as if its machine did)."""
        pids = node.pids()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every process of every node, then SIGKILL what is still alive."""
        for node in self.nodes:
            self.kill_node(node, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(n.pids() for n in self.nodes):
            time.sleep(0.2)
        for node in self.nodes:
            self.kill_node(node, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(n.pids() for n in self.nodes):
            time.sleep(0.2)
        left = {n.name: n.pids() for n in self.nodes if n.pids()}
        if left:
            raise RuntimeError(f"Ray processes survived SIGKILL: {left}")
        shutil.rmtree(self.temp_dir, ignore_errors=True)
