# Everything a fresh machine with Python 3.11+ and make needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck check bench-api bench-webhooks bench-stats clean lock

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

## make run: the service on 127.0.0.1:8000 with an embedded SQLite database in ./data
run: $(STAMP)
	$(BIN)/flowyard serve

## make test: lint, type check and the whole test suite (SQLite and PostgreSQL)
test: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

bench-api: $(STAMP)
	$(BIN)/python bench/api.py

bench-webhooks: $(STAMP)
	$(BIN)/python bench/webhooks.py

bench-stats: $(STAMP)
	$(BIN)/python bench/stats.py

## make lock: re-pin dependencies after editing pyproject.toml
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 -o requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
