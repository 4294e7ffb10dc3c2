# Two commands on a fresh machine: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
STAMP  := $(VENV)/.installed
REAL_VENV ?= .venv-real

.PHONY: run test lint types unit install sysdeps clean agent bench bench-all fuzz load test-real cluster

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# redis-server, postgresql, haproxy, nginx, chromium, strace (Debian) and the pinned Codex CLI
# (npm), installed when missing.
sysdeps:
	bash .ci/sysdeps

# Stored responses survive restarts in data/ (ignored by git); STORE ?= redis://… to share them.
STORE ?= sqlite:///data/rollout.db
run: $(STAMP)
	$(BIN)/rollout serve --host $(HOST) --port $(PORT) --store $(STORE)

# A redis-server, NODES `rollout serve` nodes and HAProxy on PORT, in the foreground until
# Ctrl-C (CLUSTER-1); `kill -HUP` the launcher for a rolling restart (DRAIN-5).
NODES ?= 2
CLUSTER_STORE ?= redis://127.0.0.1:6379/0
BALANCER ?= haproxy
cluster: $(STAMP) sysdeps
	$(BIN)/rollout cluster --nodes $(NODES) --host $(HOST) --port $(PORT) --balancer $(BALANCER) \
	  --store $(if $(filter redis://% rediss://%,$(STORE)),$(STORE),$(CLUSTER_STORE))

agent: $(STAMP)
	$(BIN)/rollout agent --url http://$(HOST):$(PORT)/v1

lint: $(STAMP)
	$(BIN)/ruff check protocol engine clients cli tests
	$(BIN)/ruff format --check protocol engine clients cli tests

types: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/pytest

# The real llama.cpp tests run last: the first run builds llama-cpp-python (~5 min on 2 cores).
test: sysdeps lint types unit test-real

# Benchmarks are not tests: they report figures, they assert nothing about time.
bench: $(STAMP)
	$(BIN)/rollout bench --json bench.json --png bench.png

bench-all: $(STAMP)
	$(BIN)/rollout bench --json bench.json --png bench.png
	$(BIN)/rollout bench --turns 100 --json bench100.json --png bench100.png
	$(BIN)/rollout bench --scenario codex --json bench-codex.json --png bench-codex.png
	$(BIN)/rollout bench --stream --memory --json bench-extras.json

# 200 WebSocket agents x 20 tool-call turns plus HTTP traffic, every event checked.
load: $(STAMP)
	$(BIN)/rollout bench --load

# The deep hypothesis profile (>= 10,000 sequences); slow, opt-in. It prints its seed first;
# `make fuzz SEED=<seed>` replays that run's generation (FUZZ-6).
fuzz: $(STAMP)
	@seed="$(SEED)"; [ -n "$$seed" ] || seed=$$($(BIN)/python -c 'import secrets; print(secrets.randbits(32))'); \
	echo "fuzz seed: $$seed (replay: make fuzz SEED=$$seed)"; \
	HYPOTHESIS_PROFILE=deep $(BIN)/pytest tests/fuzz tests/protocol -q -p no:cacheprovider --timeout 0 --hypothesis-show-statistics --hypothesis-seed=$$seed

# End-to-end tests against real llama.cpp (part of `make test`; the build of llama-cpp-python
# into .venv-real takes ~5 min on 2 cores, once): the chat
# upstream through its server, and a token-in rollout (TOK-2) through llama.cpp's /completion.
$(REAL_VENV)/.installed:
	$(PYTHON) -m venv $(REAL_VENV)
	CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
	  $(REAL_VENV)/bin/pip install --quiet 'llama-cpp-python[server]==0.3.36' gguf numpy
	touch $@

test-real: $(STAMP) $(REAL_VENV)/.installed
	ROLLOUT_REAL_PYTHON=$(REAL_VENV)/bin/python $(BIN)/pytest tests/upstream/test_real_llama_cpp.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
