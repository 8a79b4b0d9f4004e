"""Shared fixtures. ``smoke_build`` compiles manifests/smoke.toml once per session.

The session's temp directory: everything the suite, the builds it runs and their processes put in
"the system temp directory" goes to a directory of the session's own (``TMPDIR``, and ``tempfile``'s
cache of it), and what is still there when the session ends -- pytest's own ``tmp_path`` tree aside
-- fails the session, by name: a build, a killed build or a test leaves nothing behind. The
directory is removed then (kept, with the failed tests' ``tmp_path``, when a test failed).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "smoke.toml"
#: One kernel of each family (tests/fixtures/mini.toml): for tests whose mechanism compiles a whole manifest.
MINI = ROOT / "tests" / "fixtures" / "mini.toml"
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The session's temp directory, made by the pytest process (never by a process that merely imports
#: this module). Short (``/tmp/gat-XXXXXXXX``): a Ray cluster's unix sockets live below it.
SESSION_TMP: Path | None = None


def pytest_configure(config):
    global SESSION_TMP
    SESSION_TMP = Path(tempfile.mkdtemp(prefix="gat-"))
    os.environ["TMPDIR"] = tempfile.tempdir = str(SESSION_TMP)


def pytest_sessionfinish(session, exitstatus):
    if SESSION_TMP is None:
        return
    left = sorted(p.name for p in SESSION_TMP.iterdir() if not p.name.startswith("pytest-of-"))
    if not session.testsfailed or left:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)
    else:
        sys.stderr.write(f"\nthe failed tests' directories are kept in {SESSION_TMP}\n")
    if left:
        sys.stderr.write(f"\nFAILED: the test session left {len(left)} entr{'y' if len(left) == 1 else 'ies'} in the "
                         f"temp directory: {left[:20]}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def smoke_build(tmp_path_factory):
    """(summary, store root) of a real compile of smoke.toml. Treat the store as read-only."""
    from gemmar_aot.builder.pipeline import run_build

    out = tmp_path_factory.mktemp("smoke-store")
    summary = run_build(SMOKE, store=out, jobs=2, progress=False)
    # every test of the smoke store stands on this build: a failure says so here, not as a missing lock
    assert not summary["failed"] and (out / "locks" / "smoke.lock.json").is_file(), summary["failures"]
    return summary, out


@pytest.fixture(scope="session")
def mini_store(tmp_path_factory) -> Path:
    """The store of a real compile of tests/fixtures/mini.toml (lock ``mini``). Treat it as read-only."""
    from gemmar_aot.builder.pipeline import run_build

    out = tmp_path_factory.mktemp("mini-store")
    summary = run_build(MINI, store=out, jobs=2, progress=False)
    assert not summary["failed"] and (out / "locks" / "mini.lock.json").is_file(), summary["failures"]
    return out


@pytest.fixture(scope="session")
def smoke_store(request) -> Path:
    """The smoke store: $GEMMAR_AOT_TEST_SMOKE_STORE if it holds the smoke lock, else smoke_build's."""
    env = os.environ.get("GEMMAR_AOT_TEST_SMOKE_STORE")
    if env and (Path(env) / "locks" / "smoke.lock.json").is_file():
        return Path(env)
    _summary, out = request.getfixturevalue("smoke_build")
    return Path(out)


@pytest.fixture(scope="module")
def gpu_artifacts(request):
    """The GPU tiers' store: $GEMMAR_AOT_GPU_ARTIFACTS, else the smoke build's."""
    env = os.environ.get("GEMMAR_AOT_GPU_ARTIFACTS")
    if env:
        return env
    _summary, out = request.getfixturevalue("smoke_build")
    return str(out)


@pytest.fixture(scope="session")
def smoke_lock(smoke_store):
    """The smoke store's lock (a typed, immutable gemmar_aot.model.lock.Lock)."""
    from gemmar_aot.model.lock import read_lock

    return read_lock(smoke_store / "locks" / "smoke.lock.json")


def smoke_kernels(out: Path):
    """(spec, record, verified code bytes) for every distinct FlyDSL kernel the smoke lock names (its
    hipcc and JIT v2 code objects, which mori loads whole, are tests/test_hipcc.py's and test_jitv2.py's)."""
    from gemmar_aot.model.spec import KernelSpec
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.store import Store

    store = Store(out, readonly=True)
    lock = read_lock(out / "locks" / "smoke.lock.json")
    whole = {h.entry.key for h in (*lock.hipcc, *lock.jitv2)}
    for key in sorted(lock.action_keys() - whole):
        rec, code = store.load(key)
        yield KernelSpec.from_json(rec["spec"]), rec, code


@pytest.fixture(scope="session")
def hipstub_lib(tmp_path_factory) -> Path:
    """The HIP runtime test double (tests/hipstub), built from source with zig cc once per session."""
    import hipstub

    return hipstub.build(tmp_path_factory.mktemp("hipstub"))


@pytest.fixture(scope="session")
def hip_stub(hipstub_lib):
    """The double, loaded into this process (RTLD_GLOBAL); its logs are shared by every user in the process."""
    from hipstub import HipStub

    return HipStub(hipstub_lib)


@pytest.fixture(scope="session")
def test_co(tmp_path_factory) -> bytes:
    """A clang-built gfx950 code object of small test kernels (tests/hipstub), built once per session."""
    import hipstub

    return hipstub.build_test_code_object(tmp_path_factory.mktemp("co") / "kernels.co")


@pytest.fixture(scope="session")
def gfx942_co(tmp_path_factory) -> bytes:
    """The same kernels for another GPU (gfx942): what a gfx950 device must refuse."""
    import hipstub

    return hipstub.build_test_code_object(tmp_path_factory.mktemp("co942") / "kernels.co", mcpu="gfx942")


#: One cheap tuple: split-lsa at world 2 (a GEMM per rank, the one-shot all-reduce and its
#: self-test twin), a few seconds to compile.
TINY_MANIFEST = """
[manifest]
name = "tiny"

[[tuple]]
transport = "split-lsa"
m = 256
n = 1024
k = 256
world = 2
quant = "blockscale"
"""


@pytest.fixture
def tiny_manifest(tmp_path) -> Path:
    """``tiny.toml`` (:data:`TINY_MANIFEST`) in the test's directory."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY_MANIFEST)
    return p


@pytest.fixture
def nginx(tmp_path):
    """A real nginx with WebDAV PUT on a free 127.0.0.1 port, stopped (by PID) afterwards."""
    from nginx_server import Nginx

    server = Nginx(tmp_path / "nginx").start()
    try:
        yield server
    finally:
        server.stop()


def _warmed(server, store: Path, manifest: Path, seed: Path):
    """``server`` holding every kernel of ``manifest``, uploaded by a build whose local store (a
    copy of ``store``, at ``seed``) already had them."""
    from test_remote_build import _build, _copy_store

    s = _build(_copy_store(store, seed), server.url, manifest)
    assert s["compiled"] == 0 and s["uploads"] == s["distinct_specs"] and s["remote"]["errors"] == 0
    return server


@pytest.fixture
def warm_remote(smoke_store, nginx, tmp_path):
    """nginx holding every smoke kernel, uploaded by a build whose local store already had them."""
    return _warmed(nginx, smoke_store, SMOKE, tmp_path / "seed")


@pytest.fixture
def mini_remote(mini_store, nginx, tmp_path):
    """nginx holding every kernel of tests/fixtures/mini.toml, as ``warm_remote`` does smoke's."""
    return _warmed(nginx, mini_store, MINI, tmp_path / "seed")


def drop_closures(server) -> int:
    """Take every closure entry (gemmar_aot.builder.closure) off ``server``'s action cache, so a build goes
    the per-key way; returns how many there were."""
    from gemmar_aot.builder.closure import PACK_PATH
    from gemmar_aot.store.remote import reapi

    n = 0
    for _key, path in server.files("ac").items():
        if reapi.decode_action_result(path.read_bytes()).file(PACK_PATH) is not None:
            path.unlink()
            n += 1
    return n


@pytest.fixture
def per_key_remote(warm_remote):
    """warm_remote without its closure entries: builds look kernels up one key at a time."""
    assert drop_closures(warm_remote) == 2  # the manifest's closure and its name's latest
    return warm_remote


@pytest.fixture
def mini_per_key_remote(mini_remote):
    """mini_remote without its closure entries, as ``per_key_remote``."""
    assert drop_closures(mini_remote) == 2
    return mini_remote
