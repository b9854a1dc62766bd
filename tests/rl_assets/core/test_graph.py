"""graph.py: the unrolled stage graph is complete, ordered, and the one place dependencies come from; the algorithm registry."""

from typing import get_args

import pytest
import torch

from rl_assets.core.algorithms import ALGORITHMS, algorithm
from rl_assets.core.config import TrainParams
from rl_assets.core.graph import critic_parent, unroll
from rl_assets.core.params_file import load_params
from rl_assets.core.paths import DATA, flow_order, output_path, writer_of
from rl_assets.core.stage_table import STAGE_TABLE

PPO_WITH_REWARD_MODEL = ["rounds=3", "train.algorithm=ppo", "train.drop_equal_reward_groups=false", "train.beta=0.05",
                         "train.ppo.critic_init=reward_model"]


def ppo_params(tmp_path, extra=()):
    """The default params with PPO whose critic starts from a reward model that also scores the rollouts."""
    (tmp_path / "prefs.jsonl").write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n')
    source = load_params("params.yaml")
    functions = [f.model_dump() for f in source.rewards.functions] + [{"name": "reward_model", "weight": 0.5}]
    import yaml

    raw = yaml.safe_load(open("params.yaml"))
    raw["reward_model"] = {"preference_data": str(tmp_path / "prefs.jsonl")}
    raw["rewards"]["functions"] = functions
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    return load_params(tmp_path / "params.yaml", [*PPO_WITH_REWARD_MODEL, *extra])


def test_every_output_comes_after_what_it_reads_and_keys_are_unique():
    for overrides in ([], ["rounds=4", "train.beta=0.0"], ["rounds=1"]):
        outputs = unroll(load_params("params.yaml", overrides))
        keys = [o.key for o in outputs]
        assert len(keys) == len(set(keys))
        for position, output in enumerate(outputs):
            assert set(output.inputs) <= set(keys[:position]), f"{output.key} reads something made after it: {output.inputs}"
        assert keys[-2:] == ["evaluation", "promoted_model"]


def test_ppo_and_the_reward_model_unroll_with_their_parents(tmp_path):
    params = ppo_params(tmp_path)
    by_key = {o.key: o for o in unroll(params)}
    assert by_key["r01/critic"].inputs == ("r01/rewards", "r01/rollouts", "reward_model")
    assert by_key["r02/critic"].inputs == ("r02/rewards", "r02/rollouts", "r01/critic", "r00/checkpoint")  # r00: the KL reference
    assert by_key["r03/checkpoint"].inputs == ("r03/rewards", "r03/rollouts", "r02/checkpoint", "r00/checkpoint", "r02/critic")
    assert by_key["r02/rewards"].inputs == ("r02/rollouts", "reward_model")
    assert [critic_parent(params, n) for n in (1, 2, 3)] == ["reward_model", "r01/critic", "r02/critic"]
    without = load_params("params.yaml", ["rounds=2", "train.beta=0.0"])
    assert not any(o.stage == "critic" for o in unroll(without)) and "reward_model" not in {o.key for o in unroll(without)}


def test_with_staleness_a_round_samples_from_the_checkpoint_k_rounds_before_its_parent():
    """rollouts.staleness k: round N's rollouts read checkpoint N-1-k (r00 at the least), so they do not wait for round
    N-1's training; its training still starts from N-1."""
    by_key = {o.key: o for o in unroll(load_params("params.yaml", ["rounds=4", "rollouts.staleness=1", "train.beta=0.0"]))}
    assert [by_key[f"r0{n}/rollouts"].inputs[0] for n in (1, 2, 3, 4)] == ["r00/checkpoint", "r00/checkpoint", "r01/checkpoint", "r02/checkpoint"]
    assert by_key["r03/checkpoint"].inputs == ("r03/rewards", "r03/rollouts", "r02/checkpoint")
    on_policy = {o.key: o for o in unroll(load_params("params.yaml", ["rounds=4", "train.beta=0.0"]))}
    assert on_policy["r03/rollouts"].inputs == ("r02/checkpoint", "prompts")


def test_the_order_a_run_writes_outputs_in_is_the_graphs(tmp_path):
    """flow_order (what a resident child writes first) keeps the graph's order, PPO's critic after the round's checkpoint."""
    for params in (ppo_params(tmp_path), load_params("params.yaml")):
        compute = [o.key for o in unroll(params) if STAGE_TABLE[o.stage].compute]
        assert flow_order(list(reversed(compute))) == compute


def test_output_kinds_come_from_the_stage_table(tmp_path):
    for output in unroll(ppo_params(tmp_path)):
        if output.stage == "promote":
            continue  # written under promotion.directory, not the data folder
        path = output_path(output.key, DATA)
        assert (path.suffix == ".parquet") == (output.kind == "table"), output.key
        assert writer_of(output.key)[0] == output.stage
    with pytest.raises(ValueError, match="no stage writes 'r01/nothing'"):
        output_path("r01/nothing", DATA)


def test_every_algorithm_params_accept_is_in_the_registry_and_trains():
    """A name params accept without a registry row, or a policy-gradient row without an advantage estimator, fails here."""
    from rl_assets.train.policy_gradient import advantages_for

    accepted = set(get_args(TrainParams.model_fields["algorithm"].annotation))
    assert accepted == set(ALGORITHMS)
    reward = torch.tensor([1.0, 0.0, 0.5, 0.5])
    for name, entry in ALGORITHMS.items():
        assert entry.trainer in ("policy_gradient", "dpo", "rft"), name
        if entry.trainer == "policy_gradient" and entry.advantages != "gae":
            assert advantages_for(TrainParams(algorithm=name), reward, 2).shape == (4,)
        if entry.advantages == "gae":
            assert entry.value_model and entry.group is None
    with pytest.raises(ValueError, match="takes its advantages from gae"):
        advantages_for(TrainParams(algorithm="ppo"), reward, 2)
    with pytest.raises(ValueError, match="unknown algorithm 'a2c'"):
        algorithm("a2c")
