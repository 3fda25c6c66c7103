# Two commands that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo
# A failing pipeline stage (mypy | sed) fails the recipe; each recipe stops at its first failure.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: demo test lint typecheck layers docs graph setup clean

$(BIN)/fedfilter: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(BIN)/fedfilter

setup: $(BIN)/fedfilter

demo: setup
	$(BIN)/fedfilter demo --clients 10 --rounds 5 --population 6000 --out $(OUT)

lint: setup
	@echo "== ruff check"
	$(BIN)/ruff check .
	@echo "== ruff format --check"
	$(BIN)/ruff format --check .

typecheck: setup
	@echo "== mypy -p fedfilter"
	$(BIN)/mypy

# pyproject's [tool.importlinter] contracts, on the source as it lies.
layers: setup
	@echo "== lint-imports"
	$(BIN)/lint-imports --no-cache --no-logo

# The documentation site (mkdocs.yml): every page, and the API reference generated from every module's
# docstrings; --strict turns a broken link, a missing anchor or a page outside the nav into an error.
docs: setup
	@echo "== mkdocs build --strict"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The import graph, drawn by import-linter from the source alone (DOT; render with graphviz's `dot -Tsvg`
# where it is installed). A dependency that closes a cycle would be marked; none is.
graph: setup
	$(BIN)/import-linter drawgraph fedfilter --show-cycle-breakers > docs/import-graph.dot
	$(BIN)/import-linter drawgraph fedfilter.client --show-cycle-breakers > docs/import-graph-client.dot

# pytest on two workers (pytest-xdist), a test file at a time per worker (--dist loadfile).
test: lint typecheck layers docs
	@echo "== pytest"
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

clean:
	rm -rf $(VENV) out .mypy_cache site
