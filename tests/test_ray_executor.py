"""``gemmar-aot build --executor ray`` against a real local Ray cluster on loopback.

The clusters (tests/raycluster.py) are real ``ray start`` processes: a head and a worker
node, each with one CPU, plus nodes that individual tests add (one that is SIGKILLed
mid-build, one with a different toolchain); and, first, a head without CPUs whose worker
nodes come and go (one joins late with a different toolchain, the last good one dies).
Builds run through the CLI (or the Python API) in a subprocess (the driver), compiles
through the real FlyDSL on the nodes. Only the processes the fixtures started are
stopped, by PID.

The first tests need no cluster: optional-import hygiene and the pure checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemmar_aot.compiler.scheduler import Task
from gemmar_aot.compiler.worker import CompileResult
from gemmar_aot.model.spec import KernelSpec

ROOT = Path(__file__).resolve().parent.parent

TINY = """
[manifest]
name = "{name}"

[[tuple]]
transport = "split-lsa"
m = {ms}
n = 1024
k = 256
world = 2
quant = "blockscale"
"""


def _manifest(tmp_path: Path, name: str, ms: str) -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(TINY.format(name=name, ms=ms))
    return p


def _n_specs(manifest: Path) -> int:
    """How many distinct specs the plan has for ``manifest`` (the recipes decide, not us)."""
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan

    return len(make_plan(load_manifest(manifest)).specs)


# ---------------------------------------------------------------- no cluster


def test_base_install_local_build_and_runtime_never_import_ray():
    code = ("import sys; import gemmar_aot.cli, gemmar_aot.builder.pipeline, gemmar_aot.compiler.scheduler, "
            "gemmar_aot.runtime, gemmar_aot.store; from gemmar_aot.cli import main; "
            "print('ray' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_without_ray_the_ray_executor_says_how_to_install_it(monkeypatch):
    from gemmar_aot.compiler.ray_executor import RayExecutorError, _import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(RayExecutorError, match=r"pip install 'gemmar-aot\[ray\]'"):
        _import_ray()


def test_ray_options_are_checked_before_anything_starts(tmp_path):
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    m = _manifest(tmp_path, "opts", "256")
    r = CliRunner().invoke(main, ["build", str(m), "--ray-address", "127.0.0.2:1"])
    assert r.exit_code == 2 and "--ray-address needs --executor ray" in r.output
    r = CliRunner().invoke(main, ["build", str(m), "--executor", "ray", "-j", "2"])
    assert r.exit_code == 2 and "-j/--jobs is for the local executor" in r.output
    assert not (tmp_path / "artifacts").exists()


def _task() -> Task:
    spec = KernelSpec.make("split_lsa", "lsa_ar", 0, {"n": 1024, "m": 256})
    return Task(spec, "0" * 64, {"key_schema": 1, "spec": spec.to_json()})


def test_a_result_is_stored_only_if_it_matches_the_digest_the_node_reported():
    import hashlib

    from gemmar_aot.compiler.ray_executor import verify_result

    t = _task()
    code, launcher = b"\x7fELF code object", b'{"schema":1}'
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    both = (sha(code), sha(launcher))
    good = CompileResult(t.spec.spec_id, True, 1.0, {"spec": t.spec.to_json(), "ingredients": t.ingredients})
    assert verify_result(t, good, (code, launcher), both) is None
    flipped = code[:-1] + b"X"
    why = verify_result(t, good, (flipped, launcher), both)
    assert why and "code object" in why and sha(flipped) in why and sha(code) in why
    why = verify_result(t, good, (code, launcher + b" "), both)
    assert why and "launcher" in why and sha(launcher) in why
    assert "no code object" in verify_result(t, good, None, None)
    other = CompileResult("f" * 64, True, 1.0, good.record)
    assert "not " + t.spec.spec_id[:12] in verify_result(t, other, (code, launcher), both)
    wrong_fields = CompileResult(t.spec.spec_id, True, 1.0, {"spec": t.spec.to_json(), "ingredients": {}})
    assert "record fields" in verify_result(t, wrong_fields, (code, launcher), both)
    failed = CompileResult(t.spec.spec_id, False, 1.0, error="boom")
    assert verify_result(t, failed, None, None) is None  # a builder failure is reported as it is


def test_a_toolchain_mismatch_names_each_differing_ingredient():
    from gemmar_aot.compiler.ray_executor import describe_mismatch, toolchain_identity
    from gemmar_aot.toolchain import load_toolchain

    fp = load_toolchain().fingerprint
    theirs = json.loads(json.dumps(fp))
    theirs["flydsl_opt_level"] = fp["flydsl_opt_level"] + 1
    theirs["python"] = "3.12.0"
    assert toolchain_identity(fp) == toolchain_identity(json.loads(json.dumps(fp)))
    msg = describe_mismatch(toolchain_identity(fp), toolchain_identity(theirs))
    assert "2 ingredient(s)" in msg
    assert f"fingerprint.flydsl_opt_level: driver {fp['flydsl_opt_level']}, node {fp['flydsl_opt_level'] + 1}" in msg
    assert f"fingerprint.python: driver '{fp['python']}', node '3.12.0'" in msg


# ---------------------------------------------------------------- a real cluster

def _odd_toolchain(tmp_path: Path) -> tuple[Path, int, int]:
    """A valid toolchain that differs from the real one in one ingredient (the opt level):
    the real one's files, linked, with its own toolchain.json. Returns (root, ours, theirs)."""
    from gemmar_aot.toolchain import toolchain_root
    from gemmar_aot.toolchain.fingerprint import fingerprint_digest

    real = toolchain_root()
    other = tmp_path / "other-toolchain"
    other.mkdir()
    for entry in real.iterdir():
        if entry.name != "toolchain.json":
            (other / entry.name).symlink_to(entry)
    fp = json.loads((real / "toolchain.json").read_text())
    ours = fp["flydsl_opt_level"]
    fp["flydsl_opt_level"] = theirs = 3 if ours != 3 else 2
    fp["digest"] = fingerprint_digest(fp)
    (other / "toolchain.json").write_text(json.dumps(fp, indent=2, sort_keys=True) + "\n")
    return other, ours, theirs


#: A build driven through the Python API with a short wait for CPUs (the CLI waits 120 s).
_DRIVER = """
import json, sys
from gemmar_aot.builder.pipeline import run_build
from gemmar_aot.compiler.ray_executor import RayExecutor
from gemmar_aot.util.errors import GemmarError

ex = RayExecutor(sys.argv[1], no_cpu_timeout=float(sys.argv[4]))
try:
    s = run_build(sys.argv[2], store=sys.argv[3], progress=False, executor=ex)
except GemmarError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
finally:
    ex.close()
print(json.dumps(s))
"""


def _wait_for(what: str, cond, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the build ended ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="class")
def bare():
    """A head without CPUs; the tests add (and kill) worker nodes."""
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    from raycluster import LocalRayCluster

    c = LocalRayCluster()
    try:
        c.start_head(num_cpus=0)
        c.wait_for_nodes(1)
        yield c
    finally:
        c.stop()


@pytest.mark.ray
@pytest.mark.compile  # the slow tier: a cluster of its own, node starts, small compiles
class TestAClusterThatLosesItsCPUs:
    """A head without CPUs, worker nodes that come and go: no build waits forever, a node
    with another toolchain never compiles, the build finishes on the nodes that match.

    The tests run in order on one cluster (class scope: it is stopped, by PID, before the
    module's own cluster starts)."""

    def test_a_cluster_without_cpus_fails_at_once_and_says_how_to_fix_it(self, bare, tmp_path):
        m = _manifest(tmp_path, "ray-nocpu", "256")
        t0 = time.monotonic()
        rc, out, err = _ray_build(bare, m, tmp_path / "s", timeout=120)
        assert rc == 2, (out, err[-3000:])
        assert time.monotonic() - t0 < 90
        assert f"the Ray cluster at {bare.address} has no node with CPUs to compile on" in err
        assert f"ray start --address {bare.address}" in err and "drop --executor ray" in err
        assert not (tmp_path / "s" / "ac").exists()

    def test_a_node_that_joins_late_with_another_toolchain_refuses_and_the_build_goes_on(self, bare, tmp_path):
        odd, ours, theirs = _odd_toolchain(tmp_path)
        w1 = bare.add_node("w1", num_cpus=1)
        bare.wait_for_nodes(2)
        m = _manifest(tmp_path, "ray-late", "256")
        err_path = tmp_path / "driver.err"
        with open(err_path, "w") as err_file:
            p = subprocess.Popen([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(tmp_path / "s"),
                                  "--executor", "ray", "--ray-address", bare.address, "--json", "-q"],
                                 stdout=subprocess.PIPE, stderr=err_file, text=True, cwd=ROOT, env=bare.env)
        try:
            # The check before the build passed on w1 (it runs a compile task); then w1 dies, so
            # the only CPU the build can be offered is the late node's. The driver waits (up to
            # its no-CPU timeout, 120 s) for a node that matches: w3.
            _wait_for("a compile task on w1", lambda: w1.workers("ray::compile_on_node"), 300, p)
            bare.kill_node(w1)
            bare.add_node("late", num_cpus=1, env={"GEMMAR_AOT_TOOLCHAIN": str(odd)})
            _wait_for("the late node's refusal", lambda: "node 'late'" in err_path.read_text(), 240, p)
            bare.add_node("w3", num_cpus=1)
            out, _ = p.communicate(timeout=600)
        finally:
            _stop(p)
        err = err_path.read_text()
        assert p.returncode == 0, err[-4000:]
        assert "warning: node 'late'" in err and "refuses to compile" in err and "the build goes on without it" in err
        assert f"fingerprint.flydsl_opt_level: driver {ours}, node {theirs}" in err
        s = json.loads(out)
        n = _n_specs(m)
        assert s["failed"] == 0 and s["compiled"] == s["distinct_specs"] == n
        ex = s["executor"]
        [(name, why)] = ex["refused_nodes"].items()
        assert "'late'" in name and f"driver {ours}, node {theirs}" in why
        # each refused task ran again elsewhere, once: the label selector keeps it off "late"
        assert 1 <= ex["resubmitted"] <= n
        assert sum(ex["specs_by_node"].values()) == n
        assert all("'w3'" in node for node in ex["specs_by_node"]), ex["specs_by_node"]

    def test_when_only_refusing_nodes_are_left_the_build_stops_and_names_them(self, bare, tmp_path):
        [w3] = [n for n in bare.nodes if n.name == "w3"]
        bare.kill_node(w3)
        bare.wait_for_nodes(2, timeout=120)  # the head and the late node
        m = _manifest(tmp_path, "ray-none", "256")
        rc, out, err = _ray_build(bare, m, tmp_path / "s", timeout=300)
        assert rc == 2, (out, err[-3000:])
        assert "has no node with the driver's toolchain to compile on" in err
        assert "node 'late'" in err and "fingerprint.flydsl_opt_level" in err and "fix: add worker nodes" in err
        assert not (tmp_path / "s" / "ac").exists()

    def test_a_build_whose_last_cpu_dies_stops_after_the_timeout(self, bare, tmp_path):
        w4 = bare.add_node("w4", num_cpus=1)
        bare.wait_for_nodes(3)
        m = _manifest(tmp_path, "ray-lost", "[256, 512]")
        p = subprocess.Popen([sys.executable, "-c", _DRIVER, bare.address, str(m), str(tmp_path / "s"), "10"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=bare.env)
        try:
            _wait_for("a compile task on w4", lambda: w4.workers("ray::compile_on_node"), 300, p)
            bare.kill_node(w4)
            t_kill = time.monotonic()
            out, err = p.communicate(timeout=300)
        finally:
            _stop(p)
        # Ray notices the dead node (~5 s: raycluster.QUIET_ENV), then the driver waits 10 s for a usable CPU.
        assert p.returncode == 2, (out, err[-3000:])
        assert time.monotonic() - t_kill < 150
        assert "has had no node with CPUs and the driver's toolchain for 10 s" in err
        assert "spec(s) were not compiled (every kernel that finished is in the store)" in err
        assert "fix: add worker nodes" in err



@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    from raycluster import LocalRayCluster

    c = LocalRayCluster()
    try:
        c.start_head(num_cpus=1)
        c.add_node("w1", num_cpus=1)
        c.wait_for_nodes(2)
        yield c
    finally:
        c.stop()


def _ray_build(cluster, manifest: Path, store: Path, *extra: str, timeout: float = 900):
    p = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(manifest), "--store", str(store),
                        "--executor", "ray", "--ray-address", cluster.address, "--json", "-q", *extra],
                       capture_output=True, text=True, cwd=ROOT, env=cluster.env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.ray
@pytest.mark.compile
def test_a_ray_build_compiles_moris_hipcc_and_jitv2_kernels_on_the_cluster_s_workers(cluster, tmp_path):
    """--executor ray spreads mori's clang-compiled kernels (a [[hipcc]] code object and a HIP-backend
    EP entry's JIT v2 units) over the cluster's workers: every one is counted on a node, none ran in
    the driver's own compile processes, and the store and lock equal a local build's."""
    m = tmp_path / "ray-clang.toml"
    m.write_text('[manifest]\nname = "ray-clang"\narch = "gfx950"\n\n[[hipcc]]\nsources = ["cast_kernel"]\n'
                 'archs = ["gfx950", "gfx942"]\nnics = ["mlx5"]\n\n[[ep]]\nkernel_backend = "hip"\nworld = 8\n'
                 'hidden = 1024\nmax_tokens = 128\nexperts = 8\ntopk = 2\ndispatch_dtype = "bf16"\n'
                 'device = "MI355X"\n')
    rc, out, err = _ray_build(cluster, m, tmp_path / "ray")
    assert rc == 0, err[-4000:]
    s = json.loads(out)
    assert s["failed"] == 0 and s["compiled"] == s["distinct_specs"] == 4, s
    assert sum(s["executor"]["specs_by_node"].values()) == 4, s["executor"]
    assert not (tmp_path / "ray" / "work").exists() or not list((tmp_path / "ray" / "work").iterdir())
    local = subprocess.run([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(tmp_path / "local"),
                            "-q", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]
    name = "locks/ray-clang.lock.json"
    assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


@pytest.mark.ray
def test_a_ray_build_killed_mid_hipcc_compile_takes_its_compiles_with_it(cluster, tmp_path):
    """Under ``--executor ray`` too, where the clang compiles run in the cluster's workers: the driver
    killed with SIGKILL while clang runs leaves no compile process, no temp file and no work directory
    (the node's, under its toolchain) 5 s after Ray has ended the job's workers (tests/test_lifecycle.py's
    checks)."""
    import signal

    from gemmar_aot.toolchain import load_toolchain
    from test_lifecycle import assert_nothing_left, hipcc_build_compiling

    with hipcc_build_compiling(tmp_path, "--executor", "ray", "--ray-address", cluster.address, env=cluster.env,
                               anywhere=True) as b:
        b.proc.send_signal(signal.SIGKILL)
        b.proc.communicate(timeout=60)
        assert_nothing_left(b, seconds=20, work_dir=load_toolchain().root / "work")


@pytest.mark.ray
@pytest.mark.compile
def test_ray_build_writes_the_same_store_entries_as_a_local_build(cluster, tmp_path):
    from gemmar_aot.builder.pipeline import run_build
    from gemmar_aot.store import Store, inventory
    from gemmar_aot.model.lock import read_lock

    from gemmar_aot.builder.compile_vouch import VouchCheck
    from gemmar_aot.trust.signing_keys import generate_key
    from gemmar_aot.trust.trust_set import load_trust

    m = _manifest(tmp_path, "ray-same", "256")
    key, pub, keyid = generate_key(tmp_path / "keys", "builder")
    rc, out, err = _ray_build(cluster, m, tmp_path / "ray", "--compile-key", str(key))
    assert rc == 0, err[-4000:]
    s = json.loads(out)
    n = _n_specs(m)
    assert s["failed"] == 0 and s["compiled"] == s["distinct_specs"] == n
    # the driver signs what the cluster compiled, as a local build does (builder.compile_vouch)
    assert s["compile_keys"]["signer"] == keyid and s["compile_keys"]["signed"] == n
    check, ray_store = VouchCheck(load_trust(pub)), Store(tmp_path / "ray")
    assert all(check(k, ray_store.get_record(k)) == keyid for k, _p in ray_store.local.iter_record_files())
    assert s["executor"]["name"] == "ray" and s["jobs"] == 2
    assert sum(s["executor"]["specs_by_node"].values()) == n
    spent = s["executor"]["driver_seconds"]
    assert set(spent) == {"connect", "toolchain_check", "store_writes"}
    assert all(v > 0 for v in spent.values()), spent
    local = run_build(m, store=tmp_path / "local", jobs=1, progress=False)
    assert local["failed"] == 0 and local["executor"] == {"name": "local"}
    # Same keys, same blobs (sha256 of every code object), same launch records.
    assert (read_lock(tmp_path / "ray" / "locks" / "ray-same.lock.json").check_parts()
            == read_lock(tmp_path / "local" / "locks" / "ray-same.lock.json").check_parts())
    assert inventory.verify(Store(tmp_path / "ray")).clean
    # A second Ray build finds everything in the store and starts nothing on the cluster.
    rc, out, err = _ray_build(cluster, m, tmp_path / "ray")
    again = json.loads(out)
    assert rc == 0 and again["compiled"] == 0 and again["hits"] == n, err[-2000:]


@pytest.mark.ray
@pytest.mark.compile
def test_a_spec_that_fails_everywhere_is_reported_like_a_local_failure(cluster, tmp_path):
    from gemmar_aot.compiler.scheduler import compile_all
    from gemmar_aot.compiler.ray_executor import RayExecutor
    from gemmar_aot.compiler.keys import action_key, ingredients
    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan
    from gemmar_aot.store import Store, inventory
    from gemmar_aot.toolchain import load_toolchain

    fp = load_toolchain().fingerprint
    plan = make_plan(load_manifest(_manifest(tmp_path, "ray-bad", "256")))
    gemm = next(s for s in plan.specs if s.kind == "gemm")
    p = gemm.param_dict()
    p["builder"]["no_such_builder_argument"] = 1  # the real builder rejects it
    bad = KernelSpec.make(gemm.recipe, gemm.kind, gemm.rank, p)
    ingr = ingredients(bad, fp)
    task = Task(bad, action_key(ingr), ingr)

    [(spec_l, local)] = compile_all([task], str(tmp_path / "local"), jobs=1, progress=False)
    ex = RayExecutor(cluster.address)
    try:
        [(spec_r, remote)] = list(ex.run([task], str(tmp_path / "ray")))
    finally:
        ex.close()
    assert spec_l == spec_r == bad
    assert not local.ok and not remote.ok
    first = local.error.splitlines()[0]
    assert "no_such_builder_argument" in first
    assert remote.error.splitlines()[0] == first  # the builder's own error, not a Ray error
    assert ex.resubmitted == 0  # a builder error is not retried
    assert inventory.ls(Store(tmp_path / "ray")) == []


@pytest.mark.ray
@pytest.mark.compile
def test_a_killed_worker_node_loses_only_its_in_flight_tasks(cluster, tmp_path):
    from gemmar_aot.store import Store, inventory

    victim = cluster.add_node("w2", num_cpus=1)
    cluster.wait_for_nodes(3)
    m = _manifest(tmp_path, "ray-kill", "[256, 512]")
    p = subprocess.Popen([sys.executable, "-m", "gemmar_aot", "build", str(m), "--store", str(tmp_path / "s"),
                          "--executor", "ray", "--ray-address", cluster.address, "--json", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=cluster.env)
    try:
        deadline = time.monotonic() + 300
        busy: list[int] = []
        while time.monotonic() < deadline and p.poll() is None and not busy:
            busy = victim.workers("ray::compile_on_node")
            time.sleep(0.1)
        assert busy, "the build never ran a compile task on w2"
        killed = cluster.kill_node(victim)
        assert set(busy) <= set(killed)
        out, err = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err[-4000:]
    s = json.loads(out)
    n = _n_specs(m)
    assert s["failed"] == 0 and s["compiled"] == s["distinct_specs"] == n
    # w2 was killed during its first task (FlyDSL's import alone outlasts the 0.1 s poll), so
    # it delivered nothing: that task ran again on the nodes that were left.
    assert sum(s["executor"]["specs_by_node"].values()) == n
    assert not any("'w2'" in node for node in s["executor"]["specs_by_node"]), s["executor"]
    assert inventory.verify(Store(tmp_path / "s")).clean
    assert victim.pids() == []


@pytest.mark.ray
@pytest.mark.compile
def test_a_node_with_a_different_toolchain_is_named_and_left_out(cluster, tmp_path):
    odd, ours, theirs = _odd_toolchain(tmp_path)
    cluster.add_node("odd", num_cpus=1, env={"GEMMAR_AOT_TOOLCHAIN": str(odd)})
    alive = sum(1 for n in cluster.nodes if n.pids())
    cluster.wait_for_nodes(alive)
    m = _manifest(tmp_path, "ray-odd", "256")
    rc, out, err = _ray_build(cluster, m, tmp_path / "s", timeout=600)
    assert rc == 0, (out, err[-3000:])
    assert "node 'odd'" in err and "refuses to compile" in err
    assert "1 ingredient(s)" in err and f"fingerprint.flydsl_opt_level: driver {ours}, node {theirs}" in err
    assert "node 'w1'" not in err and "node 'head'" not in err  # only the odd node refuses
    s = json.loads(out)
    assert s["failed"] == 0 and s["compiled"] == s["distinct_specs"] == _n_specs(m)
    assert [n for n in s["executor"]["refused_nodes"] if "'odd'" in n]
    assert not any("'odd'" in node for node in s["executor"]["specs_by_node"]), s["executor"]
    assert s["jobs"] == 2  # the CPUs of the nodes that match (head and w1)
