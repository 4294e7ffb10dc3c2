# Two commands on a fresh machine: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
STAMP  := $(VENV)/.installed

.PHONY: run test lint types unit install sysdeps clean agent bench bench-all fuzz load test-real llama-server cluster

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
	$(BIN)/rollout serve --host $(HOST) --port $(PORT) --store $(STORE) $(ARGS)

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
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/pytest --ignore=tests/upstream/test_real_llama_cpp.py

# The real llama.cpp tests run last: the first run builds llama-server (see test-real).
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

# End-to-end tests against the real llama.cpp server (part of `make test`, TOK-40): `llama-server`
# is built once from the llama.cpp source that the llama-cpp-python sdist vendors
# (vendor/llama.cpp, tools/server), into $(LLAMA_DIR) (ignored by git). The sdist comes from PyPI
# through pip and is checked against its pinned sha256. LLAMA_SERVER=/path/to/llama-server uses a
# binary built elsewhere instead (the same source, e.g. a shared build cache).
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_SDIST_SHA256 ?= 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_DIR ?= .llama-server
LLAMA_SERVER ?= $(LLAMA_DIR)/build/bin/llama-server
LLAMA_SDIST := $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz
LLAMA_JOBS ?= 2

$(LLAMA_DIR)/build/bin/llama-server: | $(STAMP)
	mkdir -p $(LLAMA_DIR)
	[ -f $(LLAMA_SDIST) ] || $(BIN)/python -m pip download --quiet --no-binary :all: --no-deps \
	  --dest $(LLAMA_DIR) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	echo "$(LLAMA_SDIST_SHA256)  $(LLAMA_SDIST)" | sha256sum --check --quiet -
	rm -rf $(LLAMA_DIR)/src && mkdir -p $(LLAMA_DIR)/src
	tar -xzf $(LLAMA_SDIST) -C $(LLAMA_DIR)/src --strip-components=1
	cmake -S $(LLAMA_DIR)/src/vendor/llama.cpp -B $(LLAMA_DIR)/build -DCMAKE_BUILD_TYPE=Release \
	  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF \
	  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	  -DGGML_NATIVE=OFF > $(LLAMA_DIR)/cmake.log
	cmake --build $(LLAMA_DIR)/build --target llama-server -j$(LLAMA_JOBS) >> $(LLAMA_DIR)/cmake.log
	test -x $@

llama-server: $(LLAMA_SERVER)

test-real: $(STAMP) $(LLAMA_SERVER)
	ROLLOUT_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) $(BIN)/pytest tests/upstream/test_real_llama_cpp.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
