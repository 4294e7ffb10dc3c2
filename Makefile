# Two commands on a fresh machine: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
# Two stamps: serving needs the package alone (`make run`), tests and lint need `.[dev]`.
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test lint types unit install sysdeps clean agent bench bench-all bench-peers fuzz load test-real llama-server cluster

$(STAMP): pyproject.toml
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

install: $(DEV_STAMP)

# redis-server, postgresql, haproxy, nginx, chromium, strace (Debian) and the pinned Codex CLI
# (npm), installed when missing.
sysdeps:
	bash .ci/sysdeps

# Stored responses survive restarts in data/ (ignored by git); STORE ?= redis://… to share them.
STORE ?= sqlite:///data/rollout.db
run: $(STAMP)
	$(BIN)/rollout serve --host $(HOST) --port $(PORT) --store $(STORE) $(ARGS)

# A redis-server, NODES `rollout serve` nodes and HAProxy on PORT, in the foreground until
# Ctrl-C (CLUSTER-1); `kill -HUP` the launcher for a rolling restart (DRAIN-5). ARGS go to every
# node's `rollout serve` (`make cluster ARGS="--config models.toml"`).
NODES ?= 2
CLUSTER_STORE ?= redis://127.0.0.1:6379/0
BALANCER ?= haproxy
cluster: $(STAMP) sysdeps
	$(BIN)/rollout cluster --nodes $(NODES) --host $(HOST) --port $(PORT) --balancer $(BALANCER) \
	  --store $(if $(filter redis://% rediss://%,$(STORE)),$(STORE),$(CLUSTER_STORE)) \
	  $(if $(ARGS),-- $(ARGS))

agent: $(STAMP)
	$(BIN)/rollout agent --url http://$(HOST):$(PORT)/v1

lint: $(DEV_STAMP)
	$(BIN)/ruff check protocol engine clients cli bench tools tests
	$(BIN)/ruff format --check protocol engine clients cli bench tools tests

types: $(DEV_STAMP)
	$(BIN)/mypy

# In parallel (pytest-xdist): PYTEST_WORKERS processes, each test file on one worker, so a
# module's fixtures start once; every test uses ephemeral ports and its own temp dirs and
# services. PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= auto
PYTEST_ARGS ?=
# NeMo Gym 0.7.0 in a venv of its own for tests/upstream/training/test_nemo_gym.py (TOK-65): it
# declares Python >= 3.13.14, and installs and runs on any 3.13 (python3.13 on PATH, else
# pyenv's) with --ignore-requires-python, from PyPI, once (the stamp names the version).
NEMO_GYM ?= 0.7.0
NEMO_PYTHON ?= $(shell for p in $$(command -v python3.13) $(HOME)/.pyenv/versions/3.13*/bin/python3.13; do "$$p" -c '' 2>/dev/null && { echo "$$p"; break; }; done)
NEMO_VENV ?= .tools/nemo-gym-venv
NEMO_STAMP := $(NEMO_VENV)/.installed-$(NEMO_GYM)
$(NEMO_STAMP):
	@[ -n "$(NEMO_PYTHON)" ] || { echo "nemo-gym: no Python 3.13 found (NEMO_PYTHON=...)"; exit 1; }
	rm -rf $(NEMO_VENV)
	$(NEMO_PYTHON) -m venv $(NEMO_VENV)
	$(NEMO_VENV)/bin/python -m pip install --quiet --ignore-requires-python nemo-gym==$(NEMO_GYM)
	touch $@

.PHONY: nemo-gym
nemo-gym: $(NEMO_STAMP)

unit: $(DEV_STAMP) $(NEMO_STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile \
	  --ignore=tests/upstream/tokens/test_real_llama_cpp.py $(PYTEST_ARGS)

# The real llama.cpp tests run last: the first run builds llama-server (see test-real).
test: sysdeps lint types unit test-real

# Benchmarks are not tests: they report figures, they assert nothing about time.
bench: $(DEV_STAMP)
	$(BIN)/rollout bench --json bench.json --png bench.png

bench-all: $(DEV_STAMP)
	$(BIN)/rollout bench --json bench.json --png bench.png
	$(BIN)/rollout bench --turns 100 --json bench100.json --png bench100.png
	$(BIN)/rollout bench --scenario codex --json bench-codex.json --png bench-codex.png
	$(BIN)/rollout bench --stream --memory --json bench-extras.json

# This engine (a responses and a chat route), agentic-api 0.9, smg 1.13 and the LiteLLM proxy
# before one stub upstream, side by side (BENCH-10); the `peers` extra brings them and the SDK.
bench-peers: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[peers]'
	$(BIN)/rollout bench --peers --json bench-peers.json --png bench-peers.png

# 200 WebSocket agents x 20 tool-call turns plus HTTP traffic, every event checked.
load: $(DEV_STAMP)
	$(BIN)/rollout bench --load

# The deep hypothesis profile (>= 10,000 sequences); slow, opt-in. It prints its seed first;
# `make fuzz SEED=<seed>` replays that run's generation (FUZZ-6).
fuzz: $(DEV_STAMP)
	@seed="$(SEED)"; [ -n "$$seed" ] || seed=$$($(BIN)/python -c 'import secrets; print(secrets.randbits(32))'); \
	echo "fuzz seed: $$seed (replay: make fuzz SEED=$$seed)"; \
	HYPOTHESIS_PROFILE=deep $(BIN)/pytest tests/fuzz tests/protocol -q -p no:cacheprovider --timeout 0 --hypothesis-show-statistics --hypothesis-seed=$$seed

# Each named mutation in tools/mutants.toml (the smallest break of a rule), applied one at a
# time to a scratch copy of the tree, must make the tests citing its rule fail; prints killed /
# survived, exits 1 on a survivor. A developer tool, not part of `make test`; slow (the cluster
# tests). `make mutants ONLY="MEM-13 PARK"` runs the mutations whose name or rule starts so.
.PHONY: mutants
mutants: $(DEV_STAMP)
	ROLLOUT_LLAMA_SERVER=$${ROLLOUT_LLAMA_SERVER:-$(abspath $(LLAMA_SERVER))} $(BIN)/python tools/mutants.py $(ONLY)

# End-to-end tests against the real llama.cpp server (part of `make test`, TOK-40): `llama-server`
# is built from the llama.cpp source that the llama-cpp-python sdist vendors (vendor/llama.cpp,
# tools/server), once per machine: into a cache outside the checkout, keyed by the sdist's
# sha256, so every clone on the machine shares it (.ci/llama-server: a cache whose binary does
# not run is rebuilt; a build goes to a temporary directory and is renamed into place). The
# sdist comes from PyPI through pip and is checked against its pinned sha256.
# LLAMA_SERVER=/path/to/llama-server uses a binary built elsewhere instead (the same source).
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_SDIST_SHA256 ?= 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rollout-engine
LLAMA_DIR ?= $(LLAMA_CACHE)/llama-server-$(shell printf %.16s $(LLAMA_SDIST_SHA256))
LLAMA_SERVER ?= $(LLAMA_DIR)/build/bin/llama-server
LLAMA_JOBS ?= 2

llama-server: | $(STAMP)
	bash .ci/llama-server "$(LLAMA_DIR)" $(LLAMA_CPP_PYTHON) $(LLAMA_SDIST_SHA256) $(LLAMA_JOBS) $(BIN)/python

# The cached build is checked (and made when missing) unless LLAMA_SERVER names another binary.
test-real: $(DEV_STAMP) $(if $(filter $(LLAMA_DIR)/build/bin/llama-server,$(LLAMA_SERVER)),llama-server)
	ROLLOUT_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) $(BIN)/pytest tests/upstream/tokens/test_real_llama_cpp.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
