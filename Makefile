# Two commands that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo
# Static tools (mypy, lint-imports) see the installed layout: fedfilter/ plus the folders pyproject's
# package-dir maps into it, linked in as fedfilter.client etc., so each module is found once, by its
# real name (CONTRIBUTING: why a link tree).
TREE := build/tree
MAPPED := client coordinator privacy protocol protos simulations

# A failing pipeline stage (mypy | sed) fails the recipe; each recipe stops at its first failure.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: demo test lint typecheck layers graph tree setup clean

$(BIN)/fedfilter: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(BIN)/fedfilter

setup: $(BIN)/fedfilter

demo: setup
	$(BIN)/fedfilter demo --clients 10 --rounds 5 --out $(OUT)

lint: setup
	@echo "== ruff check"
	$(BIN)/ruff check .
	@echo "== ruff format --check"
	$(BIN)/ruff format --check .

# One link tree per checkout, rebuilt on every run so new modules are seen. No prerequisite: safe anywhere.
tree:
	@rm -rf $(TREE) && mkdir -p $(TREE)/fedfilter
	@for f in fedfilter/*; do ln -s "$(CURDIR)/$$f" $(TREE)/fedfilter/; done
	@for p in $(MAPPED); do ln -s "$(CURDIR)/$$p" $(TREE)/fedfilter/$$p; done

# sed prints paths as they are in the repository.
typecheck: setup tree
	@echo "== mypy -p fedfilter"
	$(BIN)/mypy | sed -E 's#^$(TREE)/fedfilter/(client|coordinator|privacy|protocol|protos|simulations)/#\1/#; s#^$(TREE)/##'

# pyproject's [tool.importlinter] contracts. Run from the tree: lint-imports puts the working directory
# first on sys.path, and from the repository root it would find ./fedfilter without the mapped folders.
layers: setup tree
	@echo "== lint-imports"
	cd $(TREE) && $(CURDIR)/$(BIN)/lint-imports --no-cache --no-logo $(CURDIR)/pyproject.toml

# The import graph, drawn by import-linter from the source alone (DOT; render with graphviz's `dot -Tsvg`
# where it is installed). A dependency that closes a cycle would be marked; none is.
graph: setup tree
	cd $(TREE) && $(CURDIR)/$(BIN)/import-linter drawgraph fedfilter --show-cycle-breakers > $(CURDIR)/docs/import-graph.dot
	cd $(TREE) && $(CURDIR)/$(BIN)/import-linter drawgraph fedfilter.client --show-cycle-breakers > $(CURDIR)/docs/import-graph-client.dot

test: lint typecheck layers
	@echo "== pytest"
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out $(TREE) .mypy_cache
