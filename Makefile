# Two commands set up and exercise a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint bench clean redis-server

$(STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

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

test: $(STAMP) lint redis-server
	$(PY) -m pytest -q

# Everything `make test` runs, plus the full-scale reliability runs (soak-marked:
# thousands of kills, minute-long soaks, a million hits per backend). Each figure goes
# to $(FIGURES); the table docs/reliability.md shows is printed at the end.
FIGURES ?= reliability-figures.jsonl
test-all: $(STAMP) lint redis-server
	rm -f $(FIGURES)
	CUFORGE_FIGURES=$(abspath $(FIGURES)) CUFORGE_HYPOTHESIS_EXAMPLES=600 \
	  $(PY) -m pytest -q --soak
	$(PY) scripts/reliability-table $(FIGURES) --scale full

# cuda-core is the peer we measure against: it lives only in this separate venv,
# beside an editable cuforge, so one run prints both columns and their ratio.
BENCH_VENV := .bench-venv
BENCH_STAMP := $(BENCH_VENV)/.installed
$(BENCH_STAMP): pyproject.toml setup.py $(wildcard src/cuforge/_native/*.c)
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[redis]' 'cuda-core==1.2.2' numpy
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) redis-server
	$(BENCH_VENV)/bin/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build src/*.egg-info .pytest_cache
