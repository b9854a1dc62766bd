"""bench/train_memory.py runs end to end on a tiny random Llama folder: each configuration reports a peak, a time and the ratios.

No assertion on the ratios: it is a benchmark, not a test.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PYTHON, REPO
from real_models import save_real_model

pytestmark = pytest.mark.e2e  # runs a benchmark or a pipeline end to end: not in `make test-fast`

SMALL = ["--set", "rollouts.prompts_per_round=2", "--set", "rollouts.samples_per_prompt=2", "--set", "train.minibatch_size=4",
         "--set", "train.gradient_accumulation_steps=2", "--set", "train.drop_equal_reward_groups=false"]


def test_train_memory_bench_reports_each_configuration(tmp_path):
    model = save_real_model(tmp_path / "model", "llama", hidden_size=32, generation_defaults={})
    configs = ["full", "full_checkpointed_freed", "lora_checkpointed"]
    done = subprocess.run([PYTHON, str(REPO / "bench" / "train_memory.py"), "--model", str(model), *SMALL, "--configs", ",".join(configs)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(summary) == configs
    for name in configs:
        assert summary[name]["peak_gb"] > 0 and summary[name]["seconds"] >= 0 and summary[name]["steps"] == 1
        assert summary[name]["peak_ratio"] > 0 and (summary[name]["time_ratio"] is None or summary[name]["time_ratio"] > 0)  # None: 0 s first
    assert summary["full"]["peak_ratio"] == 1.0


def test_train_memory_bench_names_an_unknown_configuration():
    done = subprocess.run([PYTHON, str(REPO / "bench" / "train_memory.py"), "--configs", "full,quantum"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "quantum" in done.stderr
