# Two commands set up and exercise a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench gpu-test clean

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples scripts/*.py
	$(VENV)/bin/ruff format --check src tests benchmarks examples

test: $(STAMP) lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(MAKE) -C benchmarks all

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
