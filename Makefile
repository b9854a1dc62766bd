# rl-assets: `make run` sets up and runs the default pipeline; `make test` sets up and runs the tests.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
DVC := .venv-dvc/bin/dvc
export DAGSTER_HOME := $(CURDIR)/.dagster

.PHONY: setup run test ui repro dvc-sync bench tensorboard clean

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

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	ln -sf $(CURDIR)/dagster.yaml $@

run: setup
	$(PY) -m pipelines run

test: setup
	$(PY) -m pytest -q

ui: setup
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

repro: setup
	PATH=$(CURDIR)/.venv-dvc/bin:$$PATH $(DVC) repro

dvc-sync: setup
	$(PY) -m pipelines dvc-sync

bench: setup
	$(PY) bench/import_time.py
	$(PY) bench/orchestration_overhead.py

clean:
	rm -rf data/raw_data.parquet data/prompts.parquet data/r[0-9]* data/evaluation* $(DAGSTER_HOME)
