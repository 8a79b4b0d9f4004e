"""A real nginx (Debian's, WebDAV PUT built in) serving a Bazel HTTP cache on 127.0.0.1.

``python tests/nginx_server.py install [DIR]`` (run by ``make setup``) makes an nginx
binary available without installing anything system-wide: it uses ``$GEMMAR_AOT_NGINX``
or an nginx with the dav module on PATH / in /usr/sbin, else ``apt-get download nginx``
and ``dpkg -x`` into ``.toolchain/nginx`` (Debian 12's package; its libraries -- libc,
libssl3, libpcre2, zlib -- are on every Debian 12). No root needed unless the apt lists
are empty (then it runs ``apt-get update``, which needs root).

:class:`Nginx` runs one unprivileged single-process server (``master_process off``, so
the PID we started is the whole server) with its own prefix, config, logs and data
directory, on a free loopback port, and stops it by that PID. :class:`FaultProxy` is a
tiny HTTP proxy in front of it that injects faults (500s, stalls, truncated or altered
bodies, a killed server); it is test scaffolding, not the thing under test.
"""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".toolchain" / "nginx"

CONF = """\
daemon off;
master_process off;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 512; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port}{tls};
        root {data};
        client_max_body_size 64m;
        location / {{
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            {extra}
        }}
    }}
}}
"""


def _has_dav(binary: str) -> bool:
    try:
        p = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--with-http_dav_module" in p.stderr


def find_nginx() -> str | None:
    """An nginx binary with WebDAV support, or None."""
    env = os.environ.get("GEMMAR_AOT_NGINX")
    candidates = [env] if env else []
    candidates += [str(DEFAULT_DIR / "usr" / "sbin" / "nginx"), shutil.which("nginx") or "", "/usr/sbin/nginx"]
    for c in candidates:
        if c and os.access(c, os.X_OK) and _has_dav(c):
            return c
    return None


def install(dest: Path = DEFAULT_DIR) -> str:
    """Make an nginx available (see the module docstring); returns its path."""
    found = find_nginx()
    if found:
        return found
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".nginx-") as tmp:
        cmd = ["apt-get", "download", "nginx"]
        p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if p.returncode != 0 and os.geteuid() == 0:
            subprocess.run(["apt-get", "update", "-qq"], check=False)
            p = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob("nginx_*.deb"))
        if p.returncode != 0 or not debs:
            raise SystemExit(f"could not download Debian's nginx package ({' '.join(cmd)}: {p.stderr.strip()[-500:]})"
                             f"\n  fix: run `apt-get update` as root, or install nginx, or set GEMMAR_AOT_NGINX")
        unpacked = Path(tmp) / "root"
        subprocess.run(["dpkg", "-x", str(debs[0]), str(unpacked)], check=True)
        binary = unpacked / "usr" / "sbin" / "nginx"
        if not _has_dav(str(binary)):
            raise SystemExit(f"{debs[0].name}: its nginx does not run here or lacks the WebDAV module")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(unpacked, dest)
    return str(dest / "usr" / "sbin" / "nginx")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (Linux), so a
    test run that crashes (a segfault skips every fixture finalizer) leaves no server behind."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class Nginx:
    """One nginx serving ``data`` (the cache's files) on 127.0.0.1; ``url`` is its base URL."""

    def __init__(self, workdir: Path, binary: str | None = None, *, data: Path | None = None, extra: str = "",
                 tls: tuple[Path, Path] | None = None):
        self.binary = binary or find_nginx()
        if self.binary is None:
            raise RuntimeError("no nginx with WebDAV found: run `make setup` (it unpacks Debian's nginx into "
                               ".toolchain/nginx) or set GEMMAR_AOT_NGINX")
        self.dir = Path(workdir)
        self.data = Path(data) if data else self.dir / "data"
        self.extra = extra
        self.tls = tls  # (certificate, key) PEM files: serve https
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, port: int | None = None) -> "Nginx":
        for d in (self.dir / "tmp", self.data):
            d.mkdir(parents=True, exist_ok=True)
        for attempt in range(5):
            self.port = port or free_port()
            conf = self.dir / "nginx.conf"
            tls = (f" ssl;\n        ssl_certificate {self.tls[0]};\n        ssl_certificate_key {self.tls[1]}"
                   if self.tls else "")
            conf.write_text(CONF.format(dir=self.dir, data=self.data, port=self.port, extra=self.extra, tls=tls))
            self.proc = subprocess.Popen([self.binary, "-p", str(self.dir), "-c", str(conf), "-e",
                                          str(self.dir / "error.log")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         preexec_fn=_die_with_parent)
            try:
                wait_listening(self.port, proc=self.proc)
                return self
            except RuntimeError:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                self.stop()
                if port is not None or "Address already in use" not in err + self.error_log():
                    raise RuntimeError(f"nginx did not start: {err}{self.error_log()[-2000:]}") from None
        raise RuntimeError("nginx found no free port")

    def error_log(self) -> str:
        try:
            return (self.dir / "error.log").read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, like a crash: no graceful finish of requests in flight."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def files(self, kind: str) -> dict[str, Path]:
        d = self.data / kind
        return {p.name: p for p in d.iterdir()} if d.is_dir() else {}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class FaultProxy:
    """A threaded HTTP proxy to ``upstream`` (host, port) that injects faults.

    ``fault(method, path, count)`` -> None (forward) or an action: ``("status", code)``,
    ``("stall", seconds)``, ``("truncate", n_bytes)`` / ``("flip", offset)`` on the answer's
    body, ``("drop",)`` (close the connection unanswered), ``("call", fn)`` (run ``fn``,
    e.g. kill the server, then forward). ``count`` is how many requests it has seen.
    ``delay``: seconds every request waits before it is forwarded (the round trip to a cache
    in another region), so a test counts round trips and a benchmark measures their cost.
    """

    def __init__(self, upstream_port: int, fault=None, *, delay: float = 0.0):
        self.upstream_port = upstream_port
        self.fault = fault or (lambda method, path, n: None)
        self.delay = delay  # seconds added to every request: a round trip to a far cache
        self.seen: list[tuple[str, str]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                proxy.seen.append((self.command, self.path))
                if proxy.delay:
                    time.sleep(proxy.delay)
                act = proxy.fault(self.command, self.path, len(proxy.seen))
                if act and act[0] == "status":
                    return self._send(act[1], b"injected fault\n")
                if act and act[0] == "stall":
                    time.sleep(act[1])
                if act and act[0] == "drop":
                    self.close_connection = True
                    return
                if act and act[0] == "call":
                    act[1]()
                try:
                    c = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection", "accept-encoding")}
                    c.request(self.command, self.path, body=body, headers=headers)
                    r = c.getresponse()
                    data = r.read()
                    c.close()
                except OSError:
                    self.close_connection = True
                    return
                if act and act[0] == "truncate" and data:
                    data = data[: max(0, len(data) - act[1])]
                if act and act[0] == "flip" and data:
                    i = act[1] % len(data)
                    data = data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:]
                self._send(r.status, data, head=self.command == "HEAD", length=r.getheader("Content-Length"))

            def _send(self, status, data, head=False, length=None):
                self.send_response(status)
                self.send_header("Content-Length", str(length if head and length else len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "install":
        print(install(Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_DIR))
    else:
        raise SystemExit("usage: nginx_server.py install [DIR]")
