# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
STAMP  := $(VENV)/.installed

.PHONY: run test lint types unit install clean agent

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/rollout serve --host $(HOST) --port $(PORT)

agent: $(STAMP)
	$(BIN)/rollout agent --url http://$(HOST):$(PORT)/v1

lint: $(STAMP)
	$(BIN)/ruff check protocol engine clients tests
	$(BIN)/ruff format --check protocol engine clients tests

types: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint types unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
