# Everything a fresh machine with Python 3.11+ and make needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test lint typecheck check bench-api bench-webhooks bench-stats clean lock

# `make run` installs what the service needs (requirements-run.lock); everything else (tests,
# linters, benchmarks) also installs the test tools (requirements.lock, the same pins plus dev).
$(RUN_STAMP): requirements-run.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements-run.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) requirements.lock
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	touch $(STAMP)

## make run: the service on 127.0.0.1:8000 with an embedded SQLite database in ./data
run: $(RUN_STAMP)
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
	$(BIN)/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 -c requirements.lock -o requirements-run.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
