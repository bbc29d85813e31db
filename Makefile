# The one place for commands. `make run` starts Agora; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The tests mostly wait on real processes: two at a time halve the wall time.
PYTEST_WORKERS ?= 2

.PHONY: run test lint typecheck migrations-check check bench clean

# A stamp per requirements set: a second `make run` with unchanged requirements installs nothing.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.base-installed: requirements/base.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements/base.txt
	touch $@

$(VENV)/.dev-installed: requirements/base.txt requirements/dev.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements/dev.txt
	touch $@ $(VENV)/.base-installed

run: $(VENV)/.base-installed
	$(BIN)/python -m config.stack

test: $(VENV)/.dev-installed
	AGORA_DATA_DIR=$(CURDIR)/var/test $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(VENV)/.dev-installed
	$(BIN)/mypy .

migrations-check: $(VENV)/.dev-installed
	$(BIN)/python manage.py makemigrations --check --dry-run

check: lint typecheck migrations-check test

bench: $(VENV)/.dev-installed
	$(BIN)/python bench/journal_append.py

clean:
	rm -rf $(VENV) var
