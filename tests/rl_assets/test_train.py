"""train.py: matching rewards to rollouts, and a GRPO step that moves log-probs the right way."""

from __future__ import annotations

import copy
import math

import pyarrow as pa
import pytest
import torch

from rl_assets.config import RolloutsParams, TrainParams
from rl_assets.models import build_tiny_tokenizer
from rl_assets.rollouts import completion_logprobs, sample_rollouts
from rl_assets.schemas import rewards_schema
from rl_assets.train import join_rewards, train_on_rollouts

from rl_assets_support import new_tiny_model, prompts_table, rollouts_table


def rewards_for(rollouts: pa.Table, totals: list[float]) -> pa.Table:
    n = rollouts.num_rows
    return pa.table({"round": rollouts["round"], "prompt_id": rollouts["prompt_id"], "sample_idx": rollouts["sample_idx"],
                     "policy_id": rollouts["policy_id"], "reward": totals, "reward_config_hash": ["c"] * n, "rollouts_hash": ["h"] * n},
                    schema=rewards_schema([]))


# --- join_rewards --------------------------------------------------------------------------------


KEYS = [("p1", 0), ("p1", 1), ("p2", 0), ("p2", 1)]


def test_join_rewards_matches_keys_regardless_of_order():
    rollouts = rollouts_table([{"prompt_id": p, "sample_idx": s} for p, s in KEYS])
    rewards = rewards_for(rollouts, [1.0, 2.0, 3.0, 4.0]).take([3, 0, 2, 1])  # shuffled
    assert join_rewards(rollouts, rewards).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert join_rewards(rollouts.take([2, 0, 3, 1]), rewards).tolist() == [3.0, 1.0, 4.0, 2.0]


def test_join_rewards_names_a_missing_key():
    rollouts = rollouts_table([{"prompt_id": p, "sample_idx": s} for p, s in KEYS])
    rewards = rewards_for(rollouts, [1.0, 2.0, 3.0, 4.0]).take([0, 1, 2])
    with pytest.raises(ValueError, match=r"no score for 1 rollouts, e\.g\. prompt_id=p2 sample_idx=1$"):
        join_rewards(rollouts, rewards)


# --- train_on_rollouts ---------------------------------------------------------------------------


TEMPERATURE = 1.0
TRAIN = TrainParams(learning_rate=1e-2, epochs=1, minibatch_size=4, epsilon=0.2, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def rollouts():
    """Two prompts x two samples from a fresh tiny policy (seed 0)."""
    tokenizer = build_tiny_tokenizer()
    prompts = prompts_table([("1+2=", "3"), ("4+4=", "8")])
    params = RolloutsParams(prompts_per_round=2, samples_per_prompt=2, max_new_tokens=4, temperature=TEMPERATURE)
    table = sample_rollouts(new_tiny_model(0), tokenizer, prompts, params, round_number=1, seed=0, policy_id="p0",
                            prompts_hash="h", progress=False)
    assert table.num_rows == 4
    return table


def sequence_logprob(model, rollouts: pa.Table, row: int) -> float:
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, [rollouts["prompt_ids"][row].as_py()], [rollouts["completion_ids"][row].as_py()],
                                             pad_id=0, temperature=TEMPERATURE)
    return (logprobs * mask).sum().item()


def train(rollouts, totals, params=TRAIN, ref_model=None):
    model = new_tiny_model(0)  # the policy that sampled the rollouts
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model, metrics, _ = train_on_rollouts(model, rollouts, rewards_for(rollouts, totals), params, group_size=2, temperature=TEMPERATURE,
                                          pad_id=0, seed=0, max_new_tokens=4, ref_model=ref_model, progress=False)
    return model, before, metrics


def test_training_changes_the_weights_and_reports_metrics(rollouts):
    model, before, metrics = train(rollouts, [1.0, 0.0, 0.0, 0.0])
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training
    assert metrics["steps"] == 1
    # One step on freshly sampled rollouts: the ratio is 1 up to float noise, so nothing is clipped.
    assert metrics["clip_fraction"] == 0.0 and abs(metrics["kl_old"]) < 1e-5
    assert metrics["reward_mean"] == pytest.approx(0.25)
    assert metrics["equal_reward_group_share"] == pytest.approx(0.5)
    assert all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm", "tokens_per_second"))


@pytest.mark.parametrize("rewarded,other", [(0, 1), (1, 0)])
def test_positive_advantage_raises_that_completions_logprob(rollouts, rewarded, other):
    totals = [0.0] * 4
    totals[rewarded] = 1.0  # group 0: one completion rewarded, one not; group 1: all equal
    before_model = new_tiny_model(0)
    up_before, down_before = sequence_logprob(before_model, rollouts, rewarded), sequence_logprob(before_model, rollouts, other)
    model, _, _ = train(rollouts, totals)
    assert sequence_logprob(model, rollouts, rewarded) > up_before
    assert sequence_logprob(model, rollouts, other) < down_before


def test_zero_advantages_leave_the_weights_alone(rollouts):
    model, before, metrics = train(rollouts, [1.0, 1.0, 0.0, 0.0])  # both groups all-equal: no signal
    assert metrics["equal_reward_group_share"] == 1.0
    assert all(torch.allclose(before[k], v) for k, v in model.state_dict().items())


def test_kl_penalty_uses_the_reference_model(rollouts):
    params = TRAIN.model_copy(update={"beta": 0.1, "epochs": 2})
    reference = new_tiny_model(0)
    _, _, with_ref = train(rollouts, [1.0, 0.0, 0.0, 0.0], params, ref_model=copy.deepcopy(reference))
    assert with_ref["steps"] == 2
    assert with_ref["kl_ref"] > 0  # the second step starts from a policy that already moved away
    with pytest.raises(ValueError, match="beta > 0 needs ref_logprobs"):
        train(rollouts, [1.0, 0.0, 0.0, 0.0], params, ref_model=None)
