# Two commands that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo
# mypy sees the installed layout: fedfilter/ plus client/, coordinator/, protos/, simulations/ linked
# in as fedfilter.client etc. (pyproject's package-dir), so each module is checked once, by its real name.
MYPY_TREE := build/mypy-tree

# A failing pipeline stage (mypy | sed) fails the recipe; each recipe stops at its first failure.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: demo test lint typecheck setup clean

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

# The tree is rebuilt each time, so new modules are seen; sed prints paths as they are in the repository.
typecheck: setup
	@echo "== mypy -p fedfilter"
	@rm -rf $(MYPY_TREE) && mkdir -p $(MYPY_TREE)/fedfilter
	@for f in fedfilter/*; do ln -s "$(CURDIR)/$$f" $(MYPY_TREE)/fedfilter/; done
	@for p in client coordinator privacy protocol protos simulations; do ln -s "$(CURDIR)/$$p" $(MYPY_TREE)/fedfilter/$$p; done
	$(BIN)/mypy | sed -E 's#^$(MYPY_TREE)/fedfilter/(client|coordinator|privacy|protocol|protos|simulations)/#\1/#; s#^$(MYPY_TREE)/##'

test: lint typecheck
	@echo "== pytest"
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out build/mypy-tree .mypy_cache
