"""The HTTP client against a real nginx (WebDAV PUT) on loopback, with faults injected by
a small proxy in front of it: retries, timeouts, the down state, credentials."""

from __future__ import annotations

import hashlib
import time

import pytest
from nginx_server import FaultProxy, Nginx

from gemmar_aot.store.http import HttpCache, RemoteRefused, RemoteUnavailable, parse_remote_url


def _blob(i: int = 0) -> tuple[str, bytes]:
    data = f"code object {i}\n".encode() * 50
    return hashlib.sha256(data).hexdigest(), data


def test_put_get_head_round_trip_on_one_kept_alive_connection(nginx):
    c = HttpCache(nginx.url)
    h, data = _blob()
    assert c.get("cas", h) is None and not c.head("cas", h)
    c.put("cas", h, data)
    c.put("cas", h, data)  # idempotent: a re-put of the same content is fine
    assert c.head("cas", h) and c.get("cas", h) == data
    assert (nginx.data / "cas" / h).read_bytes() == data  # plain bytes: what the sha256 names
    for _ in range(20):
        c.get("cas", h)
    assert len(c._all_conns) == 1  # one connection reused for all 26 requests
    assert c.stats["requests"] == 26 and c.stats["bytes_up"] == 2 * len(data)


def test_5xx_is_retried_then_succeeds(nginx):
    h, data = _blob()
    with FaultProxy(nginx.port, lambda m, p, n: ("status", 503) if n <= 2 else None) as proxy:
        c = HttpCache(proxy.url, retries=2, backoff=0.01)
        c.put("cas", h, data)
        assert c.stats["retries"] == 2 and c.down is None
        assert c.get("cas", h) == data


def test_persistent_500s_mark_the_remote_down_once(nginx):
    with FaultProxy(nginx.port, lambda m, p, n: ("status", 500)) as proxy:
        c = HttpCache(proxy.url, retries=2, backoff=0.01)
        with pytest.raises(RemoteUnavailable, match="HTTP 500"):
            c.get("cas", _blob()[0])
        assert len(proxy.seen) == 3
        with pytest.raises(RemoteUnavailable, match="unavailable"):
            c.get("ac", _blob(1)[0])
        assert len(proxy.seen) == 3  # down: no more requests, no more waiting


def test_a_stalled_server_times_out_within_the_bound(nginx):
    with FaultProxy(nginx.port, lambda m, p, n: ("stall", 3.0)) as proxy:
        c = HttpCache(proxy.url, timeout=0.3, retries=1, backoff=0.01)
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="timed out"):
            c.get("cas", _blob()[0])
        assert time.monotonic() - t0 < 2.0


def test_a_dead_server_is_unavailable_quickly(tmp_path):
    server = Nginx(tmp_path / "n").start()
    url = server.url
    server.stop()
    c = HttpCache(url, timeout=1, retries=2, backoff=0.01)
    t0 = time.monotonic()
    with pytest.raises(RemoteUnavailable, match="ConnectionRefused"):
        c.head("cas", _blob()[0])
    assert time.monotonic() - t0 < 2.0


def test_credentials_come_from_netrc_or_env_and_never_show(tmp_path, monkeypatch):
    secret = "s3cr3t-do-not-print"
    (tmp_path / "htpasswd").write_text(f"ci:{{PLAIN}}{secret}\n")
    server = Nginx(tmp_path / "n", extra=f'auth_basic "cache"; auth_basic_user_file {tmp_path}/htpasswd;').start()
    try:
        h, data = _blob()
        anon = HttpCache(server.url, environ={"NETRC": str(tmp_path / "none")})
        with pytest.raises(RemoteRefused, match="401.*netrc") as e:
            anon.put("cas", h, data)
        netrc = tmp_path / "netrc"
        netrc.write_text(f"machine 127.0.0.1 login ci password {secret}\n")
        netrc.chmod(0o600)
        c = HttpCache(server.url, environ={"NETRC": str(netrc)})
        c.put("cas", h, data)
        assert c.get("cas", h) == data
        wrong = HttpCache(server.url, environ={"GEMMAR_AOT_REMOTE_USER": "ci", "GEMMAR_AOT_REMOTE_PASSWORD": "nope"})
        with pytest.raises(RemoteRefused) as e:
            wrong.get("cas", h)
        for text in (str(e.value), c.name, repr(c)):
            assert secret not in text and "nope" not in text
    finally:
        server.stop()
    with pytest.raises(ValueError, match="netrc") as e:
        parse_remote_url(f"https://ci:{secret}@cache.example.com/x")
    assert secret not in str(e.value)
