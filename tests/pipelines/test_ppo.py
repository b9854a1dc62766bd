"""PPO with a value model through the whole micro pipeline: the rNN/critic assets, their lineage and metadata, the round graph."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dagster import AssetKey, DagsterInstance

from conftest import REPO, copy_project, python, with_params
from rl_assets.core.checkpoints import checkpoint_id, read_lineage
from rl_assets.core.paths import flow_order
from rl_assets.core.schemas import read_table
from rl_assets.core.storage import content_hash

pytestmark = pytest.mark.e2e

PPO = {"algorithm": "ppo", "minibatch_size": 8, "ppo": {"critic_learning_rate": 1.0e-3, "lam": 0.9}}


ROUND_KEYS = [f"r{n:02d}/{name}" for n in (1, 2) for name in ("rollouts", "rewards", "checkpoint", "critic")]


def ppo_project(micro_template, folder, faults: bool = False):
    """The micro project with two PPO rounds (one sample per prompt: a value model needs no group); `faults`: with the fault
    reward of tests/faults.py (weight 0), so a test can stop the run at a chosen reward call."""
    from faults import fault_project

    def change(params):
        params["rounds"] = 2
        params["rollouts"].update(samples_per_prompt=1, prompts_per_round=16, max_new_tokens=6)  # enough digits that rewards differ (the guard)
        params["train"].update(PPO)

    return with_params((fault_project if faults else copy_project)(micro_template, folder / "project"), change)


@pytest.fixture(scope="module")
def ppo_run(micro_template, tmp_path_factory):
    """Two PPO rounds through `rl-assets run`: one resident child writes every round's outputs. (The project, how many reward
    calls the run made): it carries the fault reward (weight 0), so it is also the reference the fault tests resume to."""
    from faults import uninterrupted

    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo"), faults=True)
    _, calls = uninterrupted(project)
    return project, calls


def ids(project) -> dict[str, str]:
    return {key: checkpoint_id(project / "data" / key) if key.endswith(("checkpoint", "critic")) else content_hash(project / "data" / f"{key}.parquet")
            for key in ROUND_KEYS}


def test_one_output_at_a_time_equals_the_resident_run_and_the_resident_run_keeps_the_value_model(ppo_run, micro_template, tmp_path_factory):
    resident, _ = ppo_run
    single = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-single"), faults=True)  # ppo_run's params
    python(["-m", "pipelines", "materialize", "raw_data", "prompts", "r00/checkpoint"], single, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    for key in flow_order(ROUND_KEYS):  # each in its own child: every model from disk
        python(["-m", "pipelines", "materialize", key], single, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    assert ids(resident) == ids(single)
    with DagsterInstance.from_config(str(resident / ".dagster")) as instance:
        loads = {key: instance.get_latest_materialization_event(AssetKey(key.split("/"))).asset_materialization.metadata["models_loaded_from_disk"].value
                 for key in ROUND_KEYS if not key.endswith("rewards")}
    # round 1's policy step starts the value model from r00 (one load); from then on it stays in memory, trained in place.
    # Each policy step also loads r00 for its KL metric: with beta 0 the reference is not kept through the next sampling.
    assert loads == {"r01/rollouts": 0, "r01/checkpoint": 2, "r01/critic": 0, "r02/rollouts": 0, "r02/checkpoint": 1, "r02/critic": 0}


def test_each_round_writes_a_value_model_that_continues_the_last(ppo_run):
    project, _ = ppo_run
    r00, r01, r02 = (project / f"data/r0{n}/checkpoint" for n in range(3))
    critics = [project / f"data/r0{n}/critic" for n in (1, 2)]
    cards = [read_lineage(c) for c in critics]
    assert all(card["kind"] == "critic" for card in cards)
    assert cards[0]["parent"] == checkpoint_id(r00)  # round 1's value model starts from r00's body
    assert cards[1]["parent"] == cards[0]["checkpoint_id"]
    config = json.loads((critics[0] / "config.json").read_text())
    assert config["id2label"] == {"0": "value"} and config["architectures"][0].endswith("ForTokenClassification")
    for card in cards:
        metrics = card["metrics"]
        assert metrics["steps"] >= 1 and math.isfinite(metrics["value_loss"]) and 0 <= metrics["value_clip_fraction"] <= 1
        assert {"explained_variance", "value_mean", "return_mean"} <= set(metrics)
    assert cards[0]["metrics"]["value_mean"] == 0.0  # a zero head: round 1's advantages are the returns
    # each policy round took its advantages from the value model before it: r00's body in round 1, r01/critic in round 2
    assert read_lineage(r01)["trained_on"]["critic"] == checkpoint_id(r00)
    assert read_lineage(r02)["trained_on"]["critic"] == cards[0]["checkpoint_id"]
    assert read_lineage(r02)["metrics"]["steps"] >= 1


def test_a_critic_loads_as_a_transformers_token_classifier(ppo_run):
    import torch
    from transformers import AutoModelForTokenClassification

    project, _ = ppo_run
    model = AutoModelForTokenClassification.from_pretrained(project / "data/r02/critic")
    with torch.no_grad():
        values = model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits
    assert values.shape == (1, 4, 1) and values.abs().sum() > 0  # trained away from the zero head


def test_a_second_run_has_nothing_to_do(ppo_run):
    project, _ = ppo_run
    done = python(["-m", "pipelines", "run"], project, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    assert "nothing to do" in (done.stdout + done.stderr).lower()


def test_generate_prints_each_tokens_probability_and_value_and_the_predicted_reward(ppo_run):
    project, _ = ppo_run
    done = python(["-m", "pipelines", "generate", "--checkpoint", "r02", "--values", "--max-new-tokens", "4", "3+4="], project, timeout=300)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert "r02/critic" in done.stderr  # the round's own value model
    assert len(row["tokens"]) == len(row["token_probabilities"]) == len(row["values"]) >= 1
    assert all(0 < p <= 1 for p in row["token_probabilities"]) and all(math.isfinite(v) for v in row["values"])
    assert row["predicted_reward"] == row["values"][0]
    missing = python(["-m", "pipelines", "generate", "--checkpoint", "r00", "--values", "3+4="], project, timeout=300, check=False)
    assert missing.returncode != 0 and "no value model" in missing.stderr and "r00/critic" in missing.stderr


def test_rescoring_reruns_the_rounds_value_model_and_policy_and_nothing_it_sampled(ppo_run, tmp_path_factory):
    project = copy_project(ppo_run[0], tmp_path_factory.mktemp("ppo-rescored") / "project")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rewards"]["functions"][1]["weight"] = 1.0  # the dense digit-share reward (the micro model never answers right)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    critic_before = checkpoint_id(project / "data/r01/critic")
    done = python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    assert "from r01/rewards" in done.stderr
    with DagsterInstance.from_config(str(project / ".dagster")) as instance:
        last_run = instance.get_runs(limit=1)[0].run_id
        rerun = {key for key in ["prompts", "r00/checkpoint", *ROUND_KEYS]
                 if instance.get_latest_materialization_event(AssetKey(key.split("/"))).run_id == last_run}
    assert {"r01/rewards", "r01/critic", "r01/checkpoint", "r02/critic"} <= rerun
    assert not {"prompts", "r00/checkpoint", "r01/rollouts"} & rerun  # what was sampled stays
    assert checkpoint_id(project / "data/r01/critic") != critic_before  # fitted to the new returns


def test_a_value_model_written_again_is_the_same(ppo_run, tmp_path_factory):
    """A killed critic step is redone from its parent and the stored tables: the same bits as the uninterrupted one."""
    project = copy_project(ppo_run[0], tmp_path_factory.mktemp("ppo-again") / "project")
    before = checkpoint_id(project / "data/r02/critic")
    python(["-m", "pipelines", "materialize", "r02/critic"], project, timeout=600, RL_ASSETS_DVC_COMMIT="0")
    assert checkpoint_id(project / "data/r02/critic") == before


def test_rlhf_a_reward_model_from_preferences_then_ppo_against_it_with_the_value_model_started_from_it(micro_template, tmp_path_factory):
    """examples/rlhf at micro scale: its pairs, its reward functions and its value model start, one round."""
    import sys

    sys.path.insert(0, str(REPO / "examples" / "rlhf"))
    from preferences import pairs

    project = copy_project(micro_template, tmp_path_factory.mktemp("rlhf") / "project")
    (project / "preferences.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs(64, seed=1)))
    example = yaml.safe_load((REPO / "examples/rlhf/params.yaml").read_text())
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["reward_model"] = {**example["reward_model"], "preference_data": "preferences.jsonl", "max_steps": 5, "batch_size": 16,
                              "tiny": params["model"]["tiny"]}
    scored = example["rewards"]["functions"][0]
    params["rewards"]["functions"] = [{**scored, "options": {**scored["options"], "path": "data/reward_model"}}, example["rewards"]["functions"][1]]
    params["evaluation"]["correctness"] = example["evaluation"]["correctness"]
    params["train"].update(PPO, ppo={**PPO["ppo"], **example["train"]["ppo"], "critic_init": "reward_model"})  # OpenRLHF's start
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    critic = read_lineage(project / "data/r01/critic")
    assert critic["parent"] == checkpoint_id(project / "data/reward_model")  # the value model started as the reward model
    rewards = read_table(project / "data/r01/rewards.parquet", "rewards")
    scores, rule = rewards["score_reward_model"].to_pylist(), rewards["score_arithmetic_answer"].to_pylist()
    assert rewards["reward"].to_pylist() == pytest.approx(scores)  # the rule has weight 0: trained on the model's score only
    clip = scored["options"]["clip"]
    assert all(-clip <= s <= clip for s in scores) and len(set(scores)) > 1
    assert set(rule) <= {0.0, 1.0}
    evaluation = read_table(project / "data/evaluation.parquet", "evaluation")
    assert {"r00/checkpoint", "r01/checkpoint"} <= set(evaluation["checkpoint"].to_pylist())


def test_lineage_walks_a_value_model_and_a_ppo_checkpoint_back_to_the_raw_data(ppo_run):
    project, _ = ppo_run
    critic = json.loads(python(["-m", "pipelines", "lineage", "data/r02/critic", "--json"], project, timeout=120).stdout)
    kinds = [step["kind"] for step in critic]
    assert kinds[:3] == ["critic", "critic", "critic_start"] and "prompts" in kinds and kinds[-1] == "raw"
    assert critic[2]["path"].endswith("r00/checkpoint") and all(step.get("status", "ok") == "ok" for step in critic)
    policy = json.loads(python(["-m", "pipelines", "lineage", "data/r02/checkpoint", "--json"], project, timeout=120).stdout)
    assert policy[0]["critic"]["path"].endswith("r01/critic") and policy[0]["critic"]["status"] == "ok"
    text = python(["-m", "pipelines", "lineage", "data/r02/checkpoint"], project, timeout=120).stdout
    assert "advantages from data/r01/critic" in text


def test_a_lora_policy_trains_with_a_full_value_model(micro_template, tmp_path_factory):
    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-lora"))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rounds"] = 1
    params["train"]["lora"] = {"enabled": True, "r": 4, "alpha": 8}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    assert (project / "data/r01/checkpoint/adapter_config.json").is_file()  # the policy: adapters
    assert (project / "data/r01/critic/model.safetensors").is_file()  # the value model: every weight
    assert read_lineage(project / "data/r01/checkpoint")["metrics"]["steps"] >= 1


@pytest.mark.parametrize("stage,output", [("critic", "r01/critic"), ("train", "r01/checkpoint")])
def test_two_processes_train_the_same_value_model_and_policy_as_one(ppo_run, tmp_path_factory, stage, output):
    """torchrun --nproc_per_node=2 (gloo): the same global minibatches, gradients averaged, so the same update up to summation order."""
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp(f"ppo-nproc-{stage}")
    one, two = copy_project(ppo_run[0], root / "one"), copy_project(ppo_run[0], root / "two")
    step = ["-m", "rl_assets.run.step", stage, "--round", "1"]
    python(step, one, timeout=600, OMP_NUM_THREADS="1")
    python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *step], two, timeout=600, OMP_NUM_THREADS="1")
    start = load_file(ppo_run[0] / "data/r00/checkpoint/model.safetensors")
    weights = [load_file(p / "data" / output / "model.safetensors") for p in (one, two)]
    assert weights[0].keys() == weights[1].keys()
    difference = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    # the value model starts from r00's body and a zero head: a round of one step moves only the head (the body's gradient
    # through a zero head is zero), so the head counts from zero
    moved = max((w - start[k] if k in start and start[k].shape == w.shape else w).abs().max().item() for k, w in weights[0].items())
    assert difference <= 0.05 * moved, f"max |w1 - w2| = {difference:.3g} vs the update {moved:.3g}"
    assert read_lineage(two / "data" / output)["checkpoint_id"] != read_lineage(ppo_run[0] / "data/r00/checkpoint")["checkpoint_id"]


def test_warm_up_rounds_train_only_the_value_model(micro_template, tmp_path_factory):
    from safetensors.torch import load_file

    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-warmup"))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["ppo"]["critic_warmup_rounds"] = 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    r00, r01, r02 = (load_file(project / f"data/r0{n}/checkpoint/model.safetensors") for n in range(3))
    assert all(r00[k].equal(r01[k]) for k in r00)  # round 1: the policy stays r00
    assert read_lineage(project / "data/r01/checkpoint")["metrics"]["critic_warmup"] is True
    assert read_lineage(project / "data/r01/critic")["metrics"]["steps"] >= 1  # while its value model trains
    assert any(not r01[k].equal(r02[k]) for k in r01)  # round 2 moves the policy, with advantages from r01/critic
    assert read_lineage(project / "data/r02/checkpoint")["trained_on"]["critic"] == read_lineage(project / "data/r01/critic")["checkpoint_id"]


@pytest.fixture(scope="module")
def ppo_fault_reference(ppo_run) -> dict:
    """The uninterrupted PPO run with the fault reward: its outputs' ids and how many reward calls it makes."""
    project, calls = ppo_run
    return {"ids": ids(project), "calls": calls}


def test_killed_after_the_last_policy_was_saved_and_before_its_value_model_the_rerun_ends_with_the_same_models(
        micro_template, tmp_path_factory, ppo_fault_reference):
    """SIGKILL of the run group during r02/checkpoint's held-out evaluation (its last reward calls): the policy is on disk and
    unreported, the round's value model not trained yet. The rerun ends with the uninterrupted run's outputs, bit for bit."""
    from faults import interrupted, resumed

    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-killed"), faults=True)
    code, log = interrupted(project, f"hold:{ppo_fault_reference['calls'] - 1}", "kill-group")
    assert code != 0 and (project / "data/r02/checkpoint/lineage.json").is_file(), log[-3000:]
    assert not (project / "data/r02/critic").exists() and "materialized r02/checkpoint" not in log, log[-3000:]
    resumed(project)
    assert ids(project) == ppo_fault_reference["ids"]


def test_a_ppo_run_crashed_at_a_random_reward_call_resumes_to_the_same_models(micro_template, tmp_path_factory, ppo_fault_reference):
    import random

    from faults import SIGNALS, interrupted, resumed

    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-crashed"), faults=True)
    call, how = random.randint(1, ppo_fault_reference["calls"]), random.choice(list(SIGNALS))
    interrupted(project, f"reward:{call}", how)
    resumed(project)
    assert ids(project) == ppo_fault_reference["ids"], f"stopped by {how} at reward call {call} of {ppo_fault_reference['calls']}"


def test_serve_returns_each_tokens_logprob_and_value_on_request(ppo_run):
    """POST /v1/completions with `values`: the generate --values columns, in OpenAI's logprobs shape plus the value model's."""
    from fastapi.testclient import TestClient

    from rl_assets.core.params_file import load_params
    from rl_assets.serve.app import create_app

    project, _ = ppo_run
    app = create_app(project, load_params(project / "params.yaml"), preload=None, status_command=None)
    with TestClient(app) as client:
        asked = {"model": "r02", "prompt": "3+4=", "max_tokens": 4}
        plain = client.post("/v1/completions", json=asked).json()
        assert plain["choices"][0]["logprobs"] is None and "values" not in plain["choices"][0]
        scored = client.post("/v1/completions", json={**asked, "values": True}).json()
        choice = scored["choices"][0]
        assert choice["text"] == plain["choices"][0]["text"]  # scoring does not change what is generated
        tokens, logprobs = choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]
        assert "".join(tokens).startswith(choice["text"]) and len(tokens) == len(logprobs) == len(choice["values"]) >= 1
        assert all(lp <= 0 for lp in logprobs) and choice["predicted_reward"] == choice["values"][0]
        generated = json.loads(python(["-m", "pipelines", "generate", "--checkpoint", "r02", "--values", "--max-new-tokens", "4", "3+4="],
                                      project, timeout=300).stdout.strip().splitlines()[-1])
        assert choice["values"] == pytest.approx(generated["values"], abs=1e-4)  # the same value model as generate's
        chat = client.post("/v1/chat/completions", json={"model": "r02", "messages": [{"role": "user", "content": "3+4="}], "max_tokens": 4,
                                                         "logprobs": True}).json()
        assert [t["logprob"] for t in chat["choices"][0]["logprobs"]["content"]] and "values" not in chat["choices"][0]
        refused = client.post("/v1/completions", json={**asked, "model": "r00", "values": True})
        assert refused.status_code == 400 and "r00/critic" in refused.json()["error"]["message"]


def test_a_lora_value_model_trains_as_adapters_continues_them_and_is_rewritten_the_same(micro_template, tmp_path_factory):
    from rl_assets.train.critic import load_critic

    project = ppo_project(micro_template, tmp_path_factory.mktemp("ppo-lora-critic"))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["ppo"]["critic_lora"] = True
    params["train"]["lora"] = {"enabled": False, "r": 4, "alpha": 8}  # a full policy; the value model takes lora's shape
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    python(["-m", "pipelines", "run"], project, timeout=1200, RL_ASSETS_DVC_COMMIT="0")
    r01, r02 = (project / f"data/r0{n}/critic" for n in (1, 2))
    for critic in (r01, r02):
        assert (critic / "adapter_config.json").is_file() and not (critic / "model.safetensors").exists()
        card = read_lineage(critic)
        assert card["lora"] is True and card["start"] == "policy" and card["lora_base"]["checkpoint_id"] == checkpoint_id(project / "data/r00/checkpoint")
    assert read_lineage(r02)["parent"] == read_lineage(r01)["checkpoint_id"]  # round 2 continued round 1's adapters
    assert read_lineage(project / "data/r02/checkpoint")["trained_on"]["critic"] == read_lineage(r01)["checkpoint_id"]
    import torch

    with torch.no_grad():
        values = load_critic(r02)(input_ids=torch.tensor([[1, 5, 6, 7]])).logits
    assert values.shape == (1, 4, 1) and values.abs().sum() > 0  # the head trained away from zero, restored with the adapters
    before = read_lineage(r02)["checkpoint_id"]
    python(["-m", "pipelines", "materialize", "r02/critic"], project, timeout=600, RL_ASSETS_DVC_COMMIT="0")  # from disk, alone
    assert read_lineage(r02)["checkpoint_id"] == before
    row = json.loads(python(["-m", "pipelines", "generate", "--checkpoint", "r02", "--values", "--max-new-tokens", "3", "3+4="], project,
                            timeout=300).stdout.strip().splitlines()[-1])
    assert len(row["values"]) == len(row["tokens"]) >= 1


def test_a_value_model_step_killed_mid_round_resumes_from_its_last_saved_state(ppo_run, tmp_path_factory):
    """train.save_steps applies to the value model's step too: SIGKILL after a random save point, rerun, the same weights."""
    import random
    import signal
    import subprocess

    from conftest import PYTHON, project_env
    from faults import kill_group_when

    settings = ["--set", "train.minibatch_size=2", "--set", "train.ppo.critic_epochs=16", "--set", "train.save_steps=4",
                "--set", "train.keep_last=2"]
    step = ["-m", "rl_assets.run.step", "critic", "--round", "1", *settings]
    root = tmp_path_factory.mktemp("ppo-critic-resume")
    whole, killed = copy_project(ppo_run[0], root / "whole"), copy_project(ppo_run[0], root / "killed")
    python(step, whole, timeout=600)
    states = killed / "data/r01/critic_state"

    def newest() -> int:
        saved = sorted(states.glob("step-*/trainer_state.json"))
        return json.loads(saved[-1].read_text())["step"] if saved else 0

    kill_after = random.Random().choice(range(4, 56, 4))
    process = subprocess.Popen([PYTHON, *step], cwd=killed, env=project_env(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    kill_group_when(process, lambda: newest() >= kill_after)
    assert process.wait(timeout=60) == -signal.SIGKILL, f"the step ended before the kill: {process.stderr.read().decode()[-2000:]}"
    saved = newest()
    python(step, killed, timeout=600)
    card = read_lineage(killed / "data/r01/critic")
    assert card["metrics"]["resumed_from_step"] == saved >= kill_after
    assert card["checkpoint_id"] == read_lineage(whole / "data/r01/critic")["checkpoint_id"]  # bit for bit
    assert card["history"] == read_lineage(whole / "data/r01/critic")["history"]
    assert not states.exists(), "a saved value model keeps no resume points"
