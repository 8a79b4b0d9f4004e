"""The HTTP client against a real nginx (WebDAV PUT) on loopback, with faults injected by
a small proxy in front of it: retries, timeouts, the down state, credentials."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from nginx_server import FaultProxy, Nginx

from gemmar_aot.model.types import Digest
from gemmar_aot.store.remote.http import HttpCache, RemoteRefused, RemoteUnavailable, parse_remote_url


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
    with FaultProxy(nginx.port, lambda m, p, n: ("stall", 10.0)) as proxy:
        c = HttpCache(proxy.url, timeout=0.3, retries=1, backoff=0.01)
        t0 = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="timed out"):
            c.get("cas", _blob()[0])
        assert time.monotonic() - t0 < 5.0  # two attempts, each cut at 0.3 s; the server would take 20 s


def test_a_dead_server_is_unavailable_quickly(tmp_path):
    server = Nginx(tmp_path / "n").start()
    url = server.url
    server.stop()
    c = HttpCache(url, timeout=1, retries=2, backoff=0.01)
    t0 = time.monotonic()
    with pytest.raises(RemoteUnavailable, match="ConnectionRefused"):
        c.head("cas", _blob()[0])
    assert time.monotonic() - t0 < 5.0


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


# ---- the store backend on top of it (no compiler needed) ----


def _record(key: str, code: bytes) -> dict:
    from gemmar_aot.model.types import Digest

    d = Digest.of(code)
    return {"schema": 2, "key": key, "blob": d.to_json(), "metadata": {"kernel": "k"}}


def test_backend_stores_an_action_result_bazel_can_read_and_reads_it_back(nginx):
    from test_reapi import ActionResultPB

    from gemmar_aot.store.remote import reapi
    from gemmar_aot.store.remote.remote_backend import HttpBackend, record_bytes

    b = HttpBackend(nginx.url)
    key, code = "1" * 64, b"\x7fELF code object" * 100
    rec = _record(key, code)
    assert b.get_record(key) is None
    b.put_blob(code)
    b.put_record(key, rec)
    assert b.get_record(key) == rec and b.get_blob(reapi_digest(code)) == code
    ar = ActionResultPB.FromString((nginx.data / "ac" / key).read_bytes())  # Google's parser
    files = {f.path: (f.digest.hash, f.digest.size_bytes) for f in ar.output_files}
    assert files[reapi.CODE_PATH] == (hashlib.sha256(code).hexdigest(), len(code))
    rb = record_bytes(rec)
    assert files[reapi.RECORD_PATH] == (hashlib.sha256(rb).hexdigest(), len(rb))
    for h, _size in files.values():  # both outputs are in /cas/ as plain bytes
        assert hashlib.sha256((nginx.data / "cas" / h).read_bytes()).hexdigest() == h
    assert b.find_missing_records([key, "2" * 64]) == {"2" * 64}


def reapi_digest(code):
    from gemmar_aot.model.types import Digest

    return Digest.of(code)


def test_backend_refuses_wrong_bytes_and_treats_a_missing_record_blob_as_a_miss(nginx):
    from gemmar_aot.store.backend import BadRecord
    from gemmar_aot.store.store_errors import CorruptArtifactError
    from gemmar_aot.store.remote.remote_backend import HttpBackend, record_bytes

    b = HttpBackend(nginx.url)
    seen = []
    b.on_corrupt = lambda where, data, reason: seen.append((where, data, reason))
    key, code = "3" * 64, b"code" * 300
    d = reapi_digest(code)
    b.put_blob(code)
    b.put_record(key, _record(key, code))
    (nginx.data / "cas" / d.hash).write_bytes(code[:-7])  # truncated on the server
    with pytest.raises(CorruptArtifactError, match="sha256"):
        b.get_blob(d)
    assert seen and seen[0][0] == f"cas/{d.hash}" and seen[0][1] == code[:-7]
    # the record rides inline in the ActionResult; without it (an older client, or a server
    # that drops inlined contents) the reader fetches /cas/, and that blob evicted is a miss
    from gemmar_aot.store.remote import reapi

    rb = record_bytes(_record(key, code))
    (nginx.data / "cas" / hashlib.sha256(rb).hexdigest()).unlink()
    assert b.get_record(key) == _record(key, code)  # from the inlined copy, checked against its digest
    ar = reapi.decode_action_result((nginx.data / "ac" / key).read_bytes())
    plain = reapi.ActionResult(tuple(reapi.OutputFile(f.path, f.digest) for f in ar.output_files))
    (nginx.data / "ac" / key).write_bytes(reapi.encode_action_result(plain))
    assert b.get_record(key) is None
    b.put_blob(rb)
    assert b.get_record(key) == _record(key, code)  # fetched from /cas/ when not inlined
    # an inlined record that does not hash to its digest is refused and handed to quarantine
    k4 = "4" * 64
    b.put_record(k4, _record(k4, code))
    good_ar = (nginx.data / "ac" / k4).read_bytes()
    inlined = reapi.decode_action_result(good_ar).file(reapi.RECORD_PATH).contents
    forged = inlined.replace(b'"kernel": "k"', b'"kernel": "x"')
    assert forged != inlined and len(forged) == len(inlined)
    (nginx.data / "ac" / k4).write_bytes(good_ar.replace(inlined, forged))
    seen.clear()
    with pytest.raises(CorruptArtifactError, match="sha256"):
        b.get_record(k4)
    assert seen and seen[0][0] == f"ac/{k4}" and seen[0][1] == forged
    # entries that do not hold together are refused, never half-used
    k2, k3 = "5" * 64, "6" * 64
    rec2 = _record(k2, code)
    b.put_record(k2, rec2)
    (nginx.data / "ac" / k3).write_bytes((nginx.data / "ac" / k2).read_bytes())  # served under another key
    with pytest.raises(BadRecord, match="for key"):
        b.get_record(k3)
    rb2 = record_bytes(rec2)
    lying = reapi.ActionResult((
        reapi.OutputFile(reapi.RECORD_PATH, Digest.of(rb2)),
        reapi.OutputFile(reapi.CODE_PATH, Digest("7" * 64, 5))))
    (nginx.data / "ac" / k2).write_bytes(reapi.encode_action_result(lying))
    with pytest.raises(BadRecord, match="names code object"):
        b.get_record(k2)
    (nginx.data / "ac" / k2).write_bytes(b"\x12\xff garbage")
    with pytest.raises(BadRecord, match="ActionResult"):
        b.get_record(k2)


def test_a_remote_record_of_schema_1_is_read_as_a_stale_record_of_schema_2(nginx):
    """An entry an older gemmar-aot uploaded (record schema 1: blobs spelled ``{"digest", "size"}``)
    is a hit to re-derive, never damage: the backend reads it as schema 2 with its derive stamp
    cleared, so the build derives it again from the verified blobs and uploads it in schema 2."""
    from gemmar_aot.compiler.derive import is_current
    from gemmar_aot.store.remote import reapi
    from gemmar_aot.store.remote.remote_backend import HttpBackend

    b = HttpBackend(nginx.url)
    key, code = "8" * 64, b"\x7fELF an old entry" * 50
    d = b.put_blob(code)
    old = {"schema": 1, "key": key, "blob": {"digest": d.hash, "size": d.size}, "derive": {"code": "c" * 64},
           "metadata": {"kernel": "k"}}
    raw = json.dumps(old).encode()
    (nginx.data / "ac").mkdir(exist_ok=True)
    (nginx.data / "ac" / key).write_bytes(reapi.encode_action_result(reapi.ActionResult((
        reapi.OutputFile(reapi.RECORD_PATH, Digest.of(raw), contents=raw), reapi.OutputFile(reapi.CODE_PATH, d)))))
    got = b.get_record(key)
    assert got == {**old, "schema": 2, "blob": d.to_json(), "derive": {"code": None}} and not is_current(got)
    b.put_record(key, {**got, "derive": {"code": "e" * 64}})  # what the build uploads once derived again
    assert HttpBackend(nginx.url).get_record(key)["blob"] == d.to_json()


def test_https_with_a_private_ca(tmp_path):
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    server = Nginx(tmp_path / "n", tls=(cert, key)).start()
    try:
        assert server.url.startswith("https://")
        h, data = _blob()
        c = HttpCache(server.url, environ={"GEMMAR_AOT_REMOTE_CA": str(cert)})
        c.put("cas", h, data)
        assert c.get("cas", h) == data and c.head("cas", h)
        untrusted = HttpCache(server.url, environ={}, retries=2, backoff=0.01)
        with pytest.raises(RemoteRefused, match="not trusted.*GEMMAR_AOT_REMOTE_CA"):
            untrusted.get("cas", h)
        assert untrusted.stats["requests"] == 1  # not retried: it would fail the same way
    finally:
        server.stop()


def test_a_bad_remote_url_is_one_clean_error_that_never_shows_the_password(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "GEMMAR_AOT_REMOTE": "https://ci:hunter2-secret@cache.example.com/x"}
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(root / "manifests" / "smoke.toml"),
                        "--store", str(tmp_path / "s"), "-q"], capture_output=True, text=True, env=env,
                       cwd=root, timeout=300)
    assert p.returncode == 2 and "netrc" in p.stderr and "Traceback" not in p.stderr
    assert "hunter2-secret" not in p.stderr + p.stdout
    assert not (tmp_path / "s").exists()  # refused before anything was written
