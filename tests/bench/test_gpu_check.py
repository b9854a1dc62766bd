"""bench/gpu_check.sh's CPU dry run (DEVICE=cpu SHAPE=small): the script a GPU session runs first, as one prepared
command with little device time, must not be the first to find that the library's API moved under it (it had, once).

No assertion on a speed: only that every step ran and each number of the summary is there, positive and finite.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from conftest import PYTHON, REPO

pytestmark = pytest.mark.e2e  # runs a benchmark or a pipeline end to end: not in `make test-fast`


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_gpu_check_dry_runs_every_step_on_cpu(tmp_path):
    env = {**os.environ, "DEVICE": "cpu", "SHAPE": "small", "LIMIT_S": "400", "PYTHON": str(PYTHON), "LOG_DIR": str(tmp_path), "PROFILE": "1"}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh")], cwd=REPO, env=env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for step in ("data", "sft", "rollouts", "rewards", "train", "plain"):
        assert any(line.startswith(f"{step}: ") for line in done.stdout.splitlines()), done.stdout
        assert (tmp_path / f"{step}.log").is_file()
    assert "run_train" in (tmp_path / "train.prof.txt").read_text()  # the step's own profile, for a GPU run's time outside its loop
    summary = json.loads(done.stdout[done.stdout.index("\n{") + 1 :])
    assert summary["parameters"] > 0 and summary["rollouts"]["completions"] == 16 * 4
    assert positive(summary["rollouts"]["completion_tokens_per_s"]) and positive(summary["train"]["tokens_per_s"])
    card = summary["train"]["card"]  # what the pipeline itself measured (no peak on a CPU: no MFU)
    assert positive(card["sequence_tokens_per_second"]) and 0 < card["loop_busy_share"] <= 1 and card["mfu"] is None
    assert 0 < summary["round"]["outside_loops_share"] < 1 and summary["round"]["round_seconds"] > 0  # the step-time breakdown
    plain = summary["plain_loop"]["fp32"]
    assert plain["steps"] == summary["train"]["steps"] and positive(plain["tokens_per_s"]) and positive(plain["trainer_vs_plain"])
