# Two commands for a new user: `make demo` (set up, then run the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, pinned, so pip takes the local CPU wheel and never a CUDA build.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/aiayn copy-task

test: setup
	$(PY) -m pytest -q
