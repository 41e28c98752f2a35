# Two commands matter: `make demo` and `make test`. Both bootstrap .venv from nothing.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
RUNTIME_STAMP := $(VENV)/.runtime-stamp
DEV_STAMP := $(VENV)/.dev-stamp
SAMPLE := sample/corpus.jsonl
TOKENIZER := packcli/assets/demo_tokenizer.json
# The CPU build of torch (test-only); an unpinned torch would pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test test-frameworks lint format clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(RUNTIME_STAMP)

$(SAMPLE): scripts/make_sample_corpus.py | $(RUNTIME_STAMP)
	$(BIN)/python scripts/make_sample_corpus.py --out $(SAMPLE)

demo: $(RUNTIME_STAMP) $(SAMPLE)
	$(BIN)/packcli pack $(SAMPLE) --tokenizer $(TOKENIZER) --config configs/pretrain.yaml --out out/demo
	$(BIN)/packcli verify out/demo

test: $(DEV_STAMP)
	$(BIN)/ruff check packcli tests scripts
	$(BIN)/ruff format --check packcli tests scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

# The training frameworks' own readers on `packcli export` output, and torchtitan on packs, in a
# venv of their own (ai2-olmo-core's and torchtitan's dependencies stay out of .venv); runs only
# the tests marked `frameworks`.
FW_VENV := .venv-frameworks
FW_STAMP := $(FW_VENV)/.stamp

$(FW_STAMP): pyproject.toml
	$(PY) -m venv $(FW_VENV)
	$(FW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FW_VENV)/bin/python -m pip install --quiet $(TORCH)
	$(FW_VENV)/bin/python -m pip install --quiet -e '.[dev,frameworks]'
	touch $@

test-frameworks: $(FW_STAMP)
	$(FW_VENV)/bin/python -m pytest -q -m frameworks

lint: $(DEV_STAMP)
	$(BIN)/ruff check packcli tests scripts
	$(BIN)/ruff format --check packcli tests scripts
	$(BIN)/mypy

format: $(DEV_STAMP)
	$(BIN)/ruff format packcli tests scripts
	$(BIN)/ruff check --fix packcli tests scripts

clean:
	rm -rf out sample .pytest_cache .mypy_cache $(FW_VENV)
