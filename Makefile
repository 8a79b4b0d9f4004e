# gemmar-aot: setup / build / test / clean.
#
#   make setup   .venv with the pinned build+test deps, then the build toolchain in
#                .toolchain (mori sources, HIP headers, cco bitcode, ld.lld) for every
#                toolchain profile (TOOLCHAIN=default or TOOLCHAIN=nightly for one), the HIP SDK
#                for mori's hipcc kernels (Debian's, pinned), and Debian's own ROCm compiler
#                (hipcc 7.2.4 + clang 22, 29 pinned packages, ~100 MB, in .toolchain/debian-rocm;
#                the oracle those kernels are compared with, run in a chroot). Idempotent:
#                a re-run verifies digests and redoes only what is missing or changed.
#                Also an nginx with WebDAV for the remote-cache tests (Debian's package,
#                unpacked into .toolchain/nginx unless one is installed; see tests/nginx_server.py).
#   make build   compile $(MANIFEST) into artifacts/: by default the whole MI355X pod, the GEMM +
#                all-reduce manifest, the MoE EP dispatch/combine v2 one (FlyDSL), mori's hipcc-JIT
#                kernels (EP v1, collectives, shmem, IO; ~100 s with 2 workers) and mori's JIT v2 ones
#                (EP v2's HIP backend, multi-node included; ~15 s) (MANIFEST=path for one; JOBS=N
#                for parallel workers, PROFILE=nightly for another toolchain profile). The MI300X
#                manifest (manifests/mi300x-hipcc.toml) is built in bench, not here.
#   make test    pytest (PYTEST_ARGS="-k foo" etc.)
#   make gpu-report   on an MI355X node: the GPU tier and the PR's comparison, as JSON + Markdown
#   make setup-py312   a Python 3.12 build environment beside .venv (.venv312, .toolchain312)
#                for tests/test_keys_travel.py (PYTHON312=/path/to/python3.12; ~4 GB: PyPI's
#                torch 2.13.0 for cp312 is the CUDA build). Not part of setup or CI.
#   make clean   remove .venv and .toolchain

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
MANIFEST    ?= manifests/dsv4-pro-wo_b.toml manifests/dsv4-pro-ep.toml manifests/dsv4-pro-hipcc.toml \
               manifests/dsv4-pro-ep-hip.toml
OUT         ?= artifacts
JOBS        ?=
PYTEST_ARGS ?=
# Toolchain profiles to install: all, or a comma-separated list (default, nightly).
TOOLCHAIN   ?= all
# The profile `make build` compiles with (empty: $$GEMMAR_AOT_TOOLCHAIN_PROFILE, else default).
PROFILE     ?=
PYTHON312   ?= python3.12

# pip install runs again when pyproject.toml changes.
DEPS_STAMP  := $(VENV)/.gemmar-deps.stamp

.PHONY: setup setup-py312 build test lint clean gpu-report

setup: $(DEPS_STAMP)
	$(VPY) -m gemmar_aot.toolchain setup --profile $(TOOLCHAIN)
	$(VPY) tests/nginx_server.py install

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): pyproject.toml | $(VPY)
	$(VENV)/bin/pip install -e '.[build,test,ray]'
	touch $@

# Its own toolchain (toolchain.json records the Python), linking the same cco bitcode as
# .venv's: the bitcode's sha256 is a key ingredient, how it was built is not.
setup-py312: setup
	$(PYTHON312) -m venv .venv312
	.venv312/bin/pip install -e '.[build]'
	GEMMAR_AOT_TOOLCHAIN=$(CURDIR)/.toolchain312 \
	MORI_CCO_BC=$$($(VPY) -c 'from gemmar_aot.toolchain import load_toolchain; print(load_toolchain(profile="default").cco_bc)') \
	.venv312/bin/python -m gemmar_aot.toolchain setup --profile default

build: setup
	for m in $(MANIFEST); do \
	  $(VENV)/bin/gemmar-aot build $$m --out $(OUT)$(if $(strip $(JOBS)), -j $(JOBS))$(if $(strip $(PROFILE)), --toolchain $(PROFILE)) || exit 1; \
	done

test: setup
	$(VPY) -m pytest -q $(PYTEST_ARGS)

# On an MI355X node: the GPU tier and the PR's mode comparison -> gpu-report/gpu-report.{json,md}
# (.github/workflows/gpu.yml runs it on a self-hosted gfx950 runner). Elsewhere it reports the skips.
gpu-report: setup
	$(VPY) bench/gpu_report.py --out gpu-report

lint: setup
	$(VENV)/bin/ruff check gemmar_aot kernels tests bench --select F,E9

clean:
	rm -rf $(VENV) .toolchain .venv312 .toolchain312
