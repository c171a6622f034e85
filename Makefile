# Two commands set up and exercise a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all test-cu12 test-dist test-integrations test-jit bench-mirror bench-herd dist lint bench bench-check docs plots clean redis-server

$(STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[cu13,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# mypy --strict on src/ (settings in pyproject.toml, [tool.mypy]): zero errors; lint-imports:
# the architecture contracts (pyproject.toml, [tool.importlinter]; docs/architecture.md).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples docs/conf.py docs/_apiref.py
	$(VENV)/bin/ruff format --check src tests benchmarks examples docs/conf.py docs/_apiref.py
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The Redis tests start their own redis-server on free loopback ports (never 6379);
# install it when this machine lacks one (apt: Debian/Ubuntu, as root or via sudo).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null 2>&1 || { echo "install redis-server (>= 6.2) first" >&2; exit 1; }; \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "installing redis-server with apt-get"; \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q redis-server >/dev/null 2>&1 || { \
	    $$sudo apt-get update -q >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q redis-server >/dev/null; }; }

# Tests comparing CUDA 12 with 13 run here too once .venv-cu12 exists (make test-cu12).
test: $(STAMP) lint redis-server
	CUFORGE_OTHER_PYTHON=$(wildcard $(abspath $(CU12_VENV))/bin/python) $(PY) -m pytest -q -m "not dist"

# The CPU suite again on CUDA 12 (cuda-bindings 12.x and the -cu12 wheels), in a
# second venv; key tests compare with the default venv's keys (CUFORGE_OTHER_PYTHON).
CU12_VENV := .venv-cu12
CU12_STAMP := $(CU12_VENV)/.installed
$(CU12_STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(CU12_VENV)/bin/python || $(PYTHON) -m venv $(CU12_VENV)
	$(CU12_VENV)/bin/python -m pip install -q --upgrade pip
	$(CU12_VENV)/bin/python -m pip install -q -e '.[cu12,test]'
	touch $(CU12_STAMP)

test-cu12: $(CU12_STAMP) $(STAMP) redis-server
	CUFORGE_OTHER_PYTHON=$(abspath $(PY)) $(CU12_VENV)/bin/python -m pytest -q -m "not dist"

# The integrations (cuforge.integrations) against the real systems, in a venv of their
# own: torch (a CPU build is enough: Inductor's FX-graph cache compiles C++ with the
# host compiler) and triton. Each test starts fresh processes, so it stays out of make test.
INT_VENV := .venv-int
INT_STAMP := $(INT_VENV)/.installed
INT_TESTS := tests/test_integrations_cache.py tests/test_integrations_inductor.py \
	tests/test_integrations_triton.py tests/test_run_inductor.py
$(INT_STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(INT_VENV)/bin/python || $(PYTHON) -m venv $(INT_VENV)
	$(INT_VENV)/bin/python -m pip install -q --upgrade pip
	$(INT_VENV)/bin/python -m pip install -q -e '.[cu13,test]' torch==2.13.0 triton==3.9.0
	touch $(INT_STAMP)

test-integrations: $(INT_STAMP) redis-server
	$(INT_VENV)/bin/python -m pytest -q -m "not dist" $(INT_TESTS)

# The JITs that need no GPU here, for real, in a venv of their own (each test starts
# processes, so it stays out of make test): JAX's persistent compilation cache on the
# CPU (cuforge.integrations.jax), and Warp's CPU kernels and Numba's cache=True through
# the directory mirror (cuforge.integrations.mirror), in fresh processes with empty
# directories. Other JIT-facing test files append themselves to JIT_TESTS.
JIT_VENV := .venv-jit
JIT_STAMP := $(JIT_VENV)/.installed
JIT_TESTS := tests/test_integrations_mirror.py tests/test_integrations_jax.py \
	tests/test_run_mirror.py tests/test_integrations_mirror_bundles.py
$(JIT_STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(JIT_VENV)/bin/python || $(PYTHON) -m venv $(JIT_VENV)
	$(JIT_VENV)/bin/python -m pip install -q --upgrade pip
	$(JIT_VENV)/bin/python -m pip install -q -e '.[cu13,test]' warp-lang==1.19.0 numba==0.68.1 \
		'jax==0.10.0' 'jaxlib==0.10.0'
	touch $(JIT_STAMP)

test-jit: $(JIT_STAMP) redis-server
	$(JIT_VENV)/bin/python -m pytest -q -m "not dist" $(JIT_TESTS)

# The mirror against the stock JITs: a fresh process with empty directories through
# the mirror vs the JIT's own warm directory (ratios, in one run).
bench-mirror: $(JIT_STAMP)
	$(JIT_VENV)/bin/python benchmarks/bench_mirror.py $(BENCH_MIRROR_ARGS)

# An sdist and a manylinux wheel (the C helpers compiled in, pthread calls bound to
# glibc 2.2.5 symbols: see src/cuforge/_native/glibc_compat.h) in dist/.
DIST_PLAT ?= manylinux_2_17_$(shell uname -m)
dist: $(STAMP)
	rm -rf dist build
	$(PY) -m build --outdir dist .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair --only-plat --plat $(DIST_PLAT) \
		--wheel-dir dist dist/cuforge-*-linux_*.whl
	rm -f dist/cuforge-*-linux_*.whl
	ls dist

# Builds the wheel (make dist), installs it into a fresh venv outside the tree and
# runs what make demo runs there (tests/test_dist.py).
test-dist: $(STAMP)
	$(PY) -m pytest -q -m dist

# Everything `make test` runs, plus the full-scale reliability runs (soak-marked:
# thousands of kills, minute-long soaks, a million hits per backend, the differential
# oracle's long random run: CUFORGE_HYPOTHESIS_EXAMPLES / 40 sequences of 25 steps).
# Each figure goes to $(FIGURES); the table docs/reliability.md shows is printed at the end.
FIGURES ?= reliability-figures.jsonl
test-all: $(STAMP) lint redis-server
	rm -f $(FIGURES)
	CUFORGE_FIGURES=$(abspath $(FIGURES)) CUFORGE_HYPOTHESIS_EXAMPLES=600 \
	  $(PY) -m pytest -q --soak -m "not dist"
	$(PY) scripts/reliability-table $(FIGURES) --scale full

# cuda-core is the peer we measure against: it lives only in this separate venv,
# beside an editable cuforge, so one run prints both columns and their ratio.
# diskcache (the SQLite-backed Python cache) is the peer of SQLiteProgramCache.
BENCH_VENV := .bench-venv
BENCH_STAMP := $(BENCH_VENV)/.installed
$(BENCH_STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[cu13,redis]' 'cuda-core==1.2.2' numpy
	$(BENCH_VENV)/bin/python -m pip install -q 'diskcache==5.6.3'
	touch $(BENCH_STAMP)

# BENCH_ARGS: e.g. --json benchmarks/results/run-cpu-DATE.json --note "..." (make plots)
bench: $(BENCH_STAMP) redis-server
	$(BENCH_VENV)/bin/python benchmarks/run.py $(BENCH_ARGS)

# The herd (docs/scaling.md): hundreds of real client processes cold-start on the same
# kernels against Redis, a Redis Cluster and SeaweedFS -- the scale sweep (1 rank per
# host), 200 ranks 8 per host, and a holder SIGKILLed mid-compile. ~15 min on 2 cores,
# ~12 GiB of memory at 200 clients. BENCH_HERD_ARGS: e.g. --json benchmarks/results/...
bench-herd: $(STAMP) redis-server
	$(PY) benchmarks/bench_herd.py --suite $(BENCH_HERD_ARGS)

# The benchmark guard (~1 min on a 2-core machine; the first run also builds .bench-venv
# and the integrations venv): the CPU hot paths as ratios to their peers measured in one
# run, and the first compile (triton_cold: Triton kernels compiled cold through cuforge
# vs stock, in the integrations venv, which has the triton wheel), checked against
# benchmarks/thresholds.toml (a failing figure is measured again before it fails the
# run). The GPU figures: scripts/gpu-test --bench.
bench-check: $(BENCH_STAMP) $(INT_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/bench_check.py --triton-python $(INT_VENV)/bin/python \
		$(BENCH_CHECK_ARGS)

# The docs site in docs/_build/html: Sphinx with MyST (docs/*.md, README.md, CHANGELOG.md)
# and autodoc (docs/api/, importing the real objects). Strict: -n -W make a broken link,
# page anchor or cross-reference an error, and so is a public name no API page documents
# (docs/_apiref.py); -E rereads everything, as the API pages follow the source.
# The plots are drawn from the recorded results in benchmarks/results/ (make plots).
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[cu13,test,docs]'
	touch $(DOCS_STAMP)

plots: $(DOCS_STAMP)
	$(PY) benchmarks/plot.py --results benchmarks/results --out docs/_generated/plots

docs: plots
	$(PY) -m sphinx -b html -n -W --keep-going -E -q docs docs/_build/html
	@echo "docs/_build/html/index.html"

clean:
	rm -rf $(VENV) $(CU12_VENV) $(BENCH_VENV) $(INT_VENV) $(JIT_VENV) build dist src/*.egg-info .pytest_cache \
		docs/_build docs/_generated
