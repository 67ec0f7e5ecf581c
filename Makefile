# Two commands for a new user: `make demo` (set up, then run the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, pinned, so pip takes the local CPU wheel and never a CUDA build.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev,serve]'
	touch $@

setup: $(VENV)/.installed

# The demo finds Multi30k through --data-dir, $$AIAYN_DATA_DIR or the user cache; ../shared/data when present.
DATA_DIR ?= $(if $(wildcard ../shared/data/multi30k),../shared/data)

demo: setup
	$(VENV)/bin/aiayn demo $(if $(DATA_DIR),--data-dir $(DATA_DIR))

# One pytest worker per core (pytest-xdist), each running torch on one thread (tests/conftest.py);
# worksteal rebalances when a few long tests (the tutorial, torchrun chains) land on one worker.
test: setup
	$(PY) -m pytest -q -n auto --dist worksteal

# ruff (lint) on the package, its tests and benchmarks, and mypy on the package, as configured in pyproject.toml.
lint: setup
	$(PY) -m ruff check aiayn tests benchmarks
	$(PY) -m mypy
