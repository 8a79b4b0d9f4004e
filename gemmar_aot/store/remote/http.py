"""An HTTP client for Bazel's remote-cache protocol: ``GET/PUT/HEAD /ac/<key>`` and ``/cas/<sha256>``.

Any server that speaks it can host the cache: bazel-remote, nginx with WebDAV ``PUT``,
an object store behind a proxy. This module moves bytes and nothing else (what the
bytes mean, and checking them, is :mod:`.remote_backend`'s job):

- **Connections** are kept alive and reused, one per thread (``http.client``; https
  with the system's CA store, or ``$GEMMAR_AOT_REMOTE_CA`` for a private CA).
- **Timeouts** bound every socket operation (``timeout``) and every request as a whole
  (``4 * timeout``), so a server that stalls or trickles cannot hang a build.
- **Retries**: a connection error, a timeout, a truncated body or a 5xx/408/429 is
  retried ``retries`` times with exponential backoff. When the retries are spent the
  client is **down** (:attr:`HttpCache.down` says why) and every later call fails at
  once with :class:`RemoteUnavailable` -- one slow failure per build, not one per key.
  Any other 4xx (401, 403, 413, ...) is :class:`RemoteRefused` and also marks it down:
  a wrong password does not fix itself halfway through a build.
- **Credentials** come from the environment (``$GEMMAR_AOT_REMOTE_TOKEN`` as a bearer
  token, or ``$GEMMAR_AOT_REMOTE_USER`` + ``$GEMMAR_AOT_REMOTE_PASSWORD``) or from
  ``~/.netrc`` (``$NETRC``) for the URL's host, never from the URL itself: a URL ends
  up in logs, summaries and shell history. :attr:`HttpCache.name` is the URL without
  any of it, and nothing here ever prints a header.
- **Content encoding**: we ask for ``zstd`` or ``identity`` and undo ``zstd`` (bazel-remote
  can serve it); uploads are plain bytes, which every server stores as they are.

Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import base64
import http.client
import netrc
import os
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

from ..store_errors import StoreError

ENV_URL = "GEMMAR_AOT_REMOTE"
ENV_TOKEN = "GEMMAR_AOT_REMOTE_TOKEN"
ENV_USER = "GEMMAR_AOT_REMOTE_USER"
ENV_PASSWORD = "GEMMAR_AOT_REMOTE_PASSWORD"
ENV_CA = "GEMMAR_AOT_REMOTE_CA"
ENV_TIMEOUT = "GEMMAR_AOT_REMOTE_TIMEOUT"
#: Largest body we accept (a code object is ~10-200 KB; a record ~10 KB).
MAX_BODY = 256 << 20
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_CHUNK = 1 << 20


class RemoteError(StoreError):
    """The remote cache failed. ``str(e)`` names the server (never a credential) and the fix."""


class RemoteUnavailable(RemoteError):
    """Down, too slow, or failing with 5xx after the retries."""


class RemoteRefused(RemoteError):
    """The server answered with a client error (401, 403, 413, ...)."""


class _Transient(Exception):
    """Internal: one attempt failed in a way worth retrying."""


class _Fatal(Exception):
    """Internal: one attempt failed in a way retrying cannot fix (an untrusted certificate)."""


@dataclass
class Response:
    status: int
    body: bytes


def parse_remote_url(url: str) -> urllib.parse.SplitResult:
    """Check a remote URL; ValueError naming the problem and the fix."""
    u = urllib.parse.urlsplit(url.strip())
    if u.scheme not in ("http", "https"):
        raise ValueError(f"remote cache URL {redact(url)!r}: the scheme must be http or https "
                         f"(e.g. https://cache.example.com/gemmar)")
    if not u.hostname:
        raise ValueError(f"remote cache URL {redact(url)!r} has no host")
    if u.username or u.password:
        raise ValueError(f"remote cache URL {redact(url)!r} carries credentials; URLs end up in logs: "
                         f"put them in ~/.netrc (machine {u.hostname} login USER password PASS) or "
                         f"${ENV_TOKEN} / ${ENV_USER} + ${ENV_PASSWORD}")
    if u.query or u.fragment:
        raise ValueError(f"remote cache URL {redact(url)!r}: no query or fragment, please")
    try:
        u.port  # noqa: B018 - validates the port
    except ValueError as e:
        raise ValueError(f"remote cache URL {redact(url)!r}: {e}") from None
    return u


def redact(url: str) -> str:
    """``url`` without userinfo, query and fragment: safe to print."""
    try:
        u = urllib.parse.urlsplit(url)
        host = u.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{u.port}" if u.port else ""
        return urllib.parse.urlunsplit((u.scheme, host + port, u.path, "", ""))
    except ValueError:
        return "<unparseable URL>"


def auth_header(host: str, environ=os.environ) -> str | None:
    """The Authorization header value for ``host``: environment first, then netrc. Never logged."""
    token = environ.get(ENV_TOKEN)
    if token:
        return f"Bearer {token.strip()}"
    user, password = environ.get(ENV_USER), environ.get(ENV_PASSWORD)
    if user and password is not None:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if os.path.isfile(path):
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError) as e:
            raise ValueError(f"{path}: cannot read it for the remote cache's credentials ({e.__class__.__name__}); "
                             f"fix the file or set ${ENV_TOKEN}") from None
        if entry and entry[0] is not None:
            return "Basic " + base64.b64encode(f"{entry[0]}:{entry[2] or ''}".encode()).decode()
    return None


class HttpCache:
    """GET/PUT/HEAD against ``<url>/ac/<key>`` and ``<url>/cas/<digest>``. Thread-safe."""

    def __init__(self, url: str, *, timeout: float | None = None, retries: int = 2, backoff: float = 0.2,
                 environ=os.environ):
        u = parse_remote_url(url)
        self.name = redact(url).rstrip("/")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        if timeout is None:
            raw = environ.get(ENV_TIMEOUT, "").strip()
            try:
                timeout = float(raw) if raw else 10.0
            except ValueError:
                raise ValueError(f"${ENV_TIMEOUT}={raw!r} is not a number of seconds") from None
        if not timeout > 0:
            raise ValueError(f"remote cache timeout must be > 0 seconds, got {timeout}")
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self._auth = auth_header(self.host, environ)
        self._ssl = None
        if self.scheme == "https":
            cafile = environ.get(ENV_CA) or None
            self._ssl = ssl.create_default_context(cafile=cafile)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all_conns: list[http.client.HTTPConnection] = []
        #: Why the client gave up (None while it works). Set once; see the module docstring.
        self.down: str | None = None
        #: Requests, retries, bytes up and down (this process).
        self.stats = {"requests": 0, "retries": 0, "bytes_down": 0, "bytes_up": 0}

    def __repr__(self) -> str:
        return f"HttpCache({self.name!r})"

    # ---- public: one call per protocol verb ----

    def get(self, kind: str, name: str) -> bytes | None:
        """The body at ``/<kind>/<name>``; None on 404."""
        r = self._request("GET", kind, name)
        return None if r.status == 404 else r.body

    def head(self, kind: str, name: str) -> bool:
        return self._request("HEAD", kind, name).status != 404

    def put(self, kind: str, name: str, data: bytes) -> None:
        self._request("PUT", kind, name, bytes(data))

    def mark_down(self, reason: str) -> None:
        with self._lock:
            if self.down is None:
                self.down = reason

    def close(self) -> None:
        with self._lock:
            conns, self._all_conns = self._all_conns, []
        for c in conns:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    # ---- internals ----

    def path(self, kind: str, name: str) -> str:
        if kind not in ("ac", "cas"):
            raise ValueError(f"unknown cache namespace {kind!r}")
        if not (len(name) == 64 and all(c in "0123456789abcdef" for c in name)):
            raise ValueError(f"{kind} name must be 64 lowercase hex, got {name!r}")
        return f"{self.prefix}/{kind}/{name}"

    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is not None and not fresh:
            return c
        if c is not None:
            c.close()
        if self.scheme == "https":
            c = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl)
        else:
            c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._local.conn = c
        with self._lock:
            self._all_conns.append(c)
        return c

    def _request(self, method: str, kind: str, name: str, body: bytes | None = None) -> Response:
        path = self.path(kind, name)
        if self.down is not None:
            raise RemoteUnavailable(f"remote cache {self.name} is unavailable ({self.down})")
        headers = {"Accept-Encoding": "zstd, identity", "User-Agent": "gemmar-aot"}
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        if self._auth:
            headers["Authorization"] = self._auth
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            try:
                r = self._attempt(method, path, headers, body, fresh=attempt > 0)
            except _Transient as e:
                last = str(e)
                continue
            except _Fatal as e:
                self.mark_down(str(e))
                raise RemoteRefused(f"remote cache {self.name}: {e}") from None
            if r.status in _RETRY_STATUS:
                last = f"HTTP {r.status} on {method} {kind}/"
                continue
            if r.status in (200, 201, 204) or (r.status == 404 and method != "PUT"):
                return r
            reason = (f"HTTP {r.status} on {method} {kind}/: "
                      + {401: "the server wants credentials (see ~/.netrc or $" + ENV_TOKEN + ")",
                         403: "forbidden (wrong credentials, or a read-only cache: use --remote-read-only)",
                         413: "body too large for the server (raise nginx's client_max_body_size)",
                         405: "the server does not allow this method (WebDAV PUT not enabled?)",
                         409: "conflict (nginx: enable create_full_put_path)"}.get(
                          r.status, r.body[:120].decode("utf-8", "replace").strip() or "client error"))
            self.mark_down(reason)
            raise RemoteRefused(f"remote cache {self.name}: {reason}")
        reason = f"{last}, {self.retries + 1} attempts"
        self.mark_down(reason)
        raise RemoteUnavailable(f"remote cache {self.name} is unavailable: {reason}")

    def _attempt(self, method, path, headers, body, *, fresh: bool) -> Response:
        deadline = time.monotonic() + 4 * self.timeout
        self.stats["requests"] += 1
        conn = self._conn(fresh)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY:
                raise _Transient(f"{method} answer of {length} bytes exceeds {MAX_BODY}")
            chunks = []
            total = 0
            while method != "HEAD":
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_BODY:
                    raise _Transient(f"{method} answer exceeds {MAX_BODY} bytes")
                if time.monotonic() > deadline:
                    raise _Transient(f"{method} took longer than {4 * self.timeout:g} s")
            if method == "HEAD":
                resp.read()
            data = b"".join(chunks)
            if body is not None:
                self.stats["bytes_up"] += len(body)
            self.stats["bytes_down"] += len(data)
            if resp.getheader("Connection", "").lower() == "close" or resp.will_close:
                conn.close()
                self._local.conn = None
            enc = (resp.getheader("Content-Encoding") or "identity").strip().lower()
            if enc == "zstd" and resp.status == 200 and data:
                data = _unzstd(data)
            elif enc not in ("identity", "zstd"):
                raise _Transient(f"{method} answer in unsupported Content-Encoding {enc!r}")
            return Response(resp.status, data)
        except _Transient:
            conn.close()
            self._local.conn = None
            raise
        except ssl.SSLCertVerificationError as e:
            conn.close()
            self._local.conn = None
            raise _Fatal(f"TLS certificate not trusted ({e.verify_message}); for a private CA set "
                         f"${ENV_CA} to its PEM bundle") from None
        except (OSError, http.client.HTTPException, socket.timeout) as e:
            conn.close()
            self._local.conn = None
            what = "timed out" if isinstance(e, (socket.timeout, TimeoutError)) else e.__class__.__name__
            raise _Transient(f"{method} {path.rsplit('/', 2)[-2]}/ failed: {what}"
                             + (f" ({e})" if str(e) and what != "timed out" else "")) from None


def _unzstd(data: bytes) -> bytes:
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_BODY)
    except zstandard.ZstdError as e:
        raise _Transient(f"undecodable zstd Content-Encoding ({e})") from None
