"""examples/gsm8k/params.yaml, one round on CPU: the real GSM8K rows, a chat template, 256-token completions.

The example's own params, changed only where a CPU test must: a locally built Qwen2-architecture
model with a byte-level BPE tokenizer (tests/real_models.py) instead of the hub model, a handful of
prompts, one round, and guards loosened for a random model. Everything else (sources and column
mapping, template, chat template, rewards, correctness, completion length, gradient checkpointing,
micro-batches) runs as a GPU user would run it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import MICRO_OUTPUTS, REPO, python
from real_models import GSM8K, LENGTH_REWARD, save_real_model
from rl_assets.core.schemas import read_table

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"{GSM8K} not present (shared datasets are not in this checkout)")
def test_gsm8k_example_runs_one_round_on_cpu(micro_copy):
    project = micro_copy
    save_real_model(project / "models_base" / "qwen2", "qwen2", seed=0)
    params = yaml.safe_load((REPO / "examples" / "gsm8k" / "params.yaml").read_text())
    params.update(rounds=1, compute={"nproc": 1, "device": "cpu"})
    params["model"]["name_or_path"] = "models_base/qwen2"
    params["raw_data"].update(max_rows=40)
    params["raw_data"]["sources"][0]["path"] = str(GSM8K)
    params["prompts"]["eval_fraction"] = 0.2
    params["rollouts"].update(prompts_per_round=4, samples_per_prompt=2, batch_size=8, logprob_batch_size=4)
    params["train"].update(minibatch_size=8, gradient_accumulation_steps=2, learning_rate=1e-3)
    params["evaluation"].update(max_prompts=3, samples_per_prompt=2)
    params["guards"] = {"kl_max": 100.0, "entropy_min": 0.0}
    with (project / "micro_rewards.py").open("a") as module:
        module.write(LENGTH_REWARD)
    params["rewards"]["functions"].append({"name": "micro_rewards:text_length", "weight": 0.5})
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")

    prompts = read_table(project / MICRO_OUTPUTS["prompts"], "prompts")
    assert prompts.num_rows == 40 and all(p.startswith("<|im_start|>") for p in prompts["prompt"].to_pylist())
    assert all("#### " in a for a in prompts["answer"].to_pylist())  # the worked solution is the reference; math_answer reads it
    rollouts = read_table(project / MICRO_OUTPUTS["r01/rollouts"], "rollouts")
    assert rollouts.num_rows == 8 and max(len(c) for c in rollouts["completion_ids"].to_pylist()) <= 256
    rewards = read_table(project / MICRO_OUTPUTS["r01/rewards"], "rewards")
    assert {"score_math_answer", "score_format_regex", "score_text_length"} <= set(rewards.column_names)
    evaluation = read_table(project / MICRO_OUTPUTS["evaluation"], "evaluation").to_pylist()
    assert {r["correctness"] for r in evaluation} == {"math_answer"} and all(0 <= r["pass_at_k"] <= 1 for r in evaluation)
    assert (Path(project) / "data" / "r01" / "checkpoint" / "lineage.json").is_file()
