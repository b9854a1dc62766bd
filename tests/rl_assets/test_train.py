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
    model, metrics, _, _ = train_on_rollouts(model, rollouts, rewards_for(rollouts, totals), params, group_size=2, temperature=TEMPERATURE,
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


# --- algorithms, accumulation, masking ------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["rloo", "reinforce_pp"])
def test_other_advantage_estimators_push_the_rewarded_completion_up(rollouts, algorithm):
    params = TRAIN.model_copy(update={"algorithm": algorithm})
    before = sequence_logprob(new_tiny_model(0), rollouts, 0)
    model, _, metrics = train(rollouts, [1.0, 0.0, 0.0, 0.0], params)
    assert sequence_logprob(model, rollouts, 0) > before
    assert metrics["steps"] == 1


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_gradient_accumulation_matches_one_big_step(rollouts, loss_type):
    """Two micro-batches of 2 give the update of one batch of 4 (equal completion lengths are not needed for these types)."""
    whole = TRAIN.model_copy(update={"loss_type": loss_type, "learning_rate": 1e-3})
    split = whole.model_copy(update={"gradient_accumulation_steps": 2})
    one, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0], whole)
    two, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0], split)
    first, second = one.state_dict(), two.state_dict()
    assert all(torch.allclose(first[k], second[k], atol=1e-6) for k in first)


def test_masking_truncated_completions_leaves_them_out_of_the_loss(rollouts):
    truncated = rollouts.set_column(rollouts.schema.get_field_index("truncated"), "truncated", pa.array([True, True, False, False]))
    # group 0 (rows 0, 1) carries the only signal and both of its completions are truncated
    masked, before, metrics = train(truncated, [1.0, 0.0, 0.0, 0.0], TRAIN.model_copy(update={"mask_truncated_completions": True}))
    assert metrics["truncated_share"] == 0.5
    assert all(torch.equal(before[k], v) for k, v in masked.state_dict().items())
    unmasked, before, _ = train(truncated, [1.0, 0.0, 0.0, 0.0])
    assert any(not torch.equal(before[k], v) for k, v in unmasked.state_dict().items())


def test_warmup_and_schedule_shape_the_learning_rate(rollouts):
    params = TRAIN.model_copy(update={"minibatch_size": 2, "epochs": 4, "warmup_ratio": 0.25, "lr_scheduler": "linear"})
    model = new_tiny_model(0)
    _, _, history, _ = train_on_rollouts(model, rollouts, rewards_for(rollouts, [1.0, 0.0, 0.0, 1.0]), params, group_size=2,
                                      temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4, progress=False)
    rates = [h["learning_rate"] for h in history]
    assert len(rates) == 8 and rates[1] == pytest.approx(1e-2)  # 2 warmup steps reach the peak ...
    assert rates[-1] == 0.0 and all(a >= b for a, b in zip(rates[1:], rates[2:]))  # ... then decay linearly to 0


# --- resume ----------------------------------------------------------------------------------------


RESUMABLE = TRAIN.model_copy(update={"minibatch_size": 2, "epochs": 3, "save_steps": 2, "keep_last": 2})
FINGERPRINT = {"train": {"learning_rate": 1e-2}, "inputs": {"rollouts": "r", "rewards": "w"}, "parent": "p0", "world_size": 1, "seed": 0}


def run_resumable(rollouts, state_dir, params=RESUMABLE, fingerprint=FINGERPRINT):
    model, metrics, history, _ = train_on_rollouts(new_tiny_model(0), rollouts, rewards_for(rollouts, [1.0, 0.0, 0.3, 0.9]), params,
                                                group_size=2, temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4,
                                                state_dir=state_dir, fingerprint=fingerprint, progress=False)
    return model.state_dict(), metrics, history


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(rollouts, tmp_path):
    from rl_assets.train_state import saved_states

    uninterrupted, metrics, history = run_resumable(rollouts, None)
    assert metrics["steps"] == 6 and metrics["resumed_from_step"] == 0
    # A first run leaves states at steps 2 and 4 (a crash after step 5 would leave the same) ...
    run_resumable(rollouts, tmp_path / "state")
    assert [p.name for p in saved_states(tmp_path / "state")] == ["step-000002", "step-000004"]
    # ... and a rerun picks up at step 4 and ends where the uninterrupted run ended.
    resumed, resumed_metrics, resumed_history = run_resumable(rollouts, tmp_path / "state")
    assert resumed_metrics["resumed_from_step"] == 4
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)
    assert resumed_history == history
    assert resumed_metrics["loss"] == pytest.approx(metrics["loss"]) and resumed_metrics["kl_old"] == pytest.approx(metrics["kl_old"])


def test_keep_last_prunes_older_states(rollouts, tmp_path):
    from rl_assets.train_state import saved_states

    params = RESUMABLE.model_copy(update={"epochs": 5, "save_steps": 1, "keep_last": 3})
    run_resumable(rollouts, tmp_path / "state", params)
    assert [p.name for p in saved_states(tmp_path / "state")] == ["step-000007", "step-000008", "step-000009"]


def test_resume_refuses_a_state_from_another_configuration(rollouts, tmp_path):
    from rl_assets.train_state import TrainStateMismatch

    run_resumable(rollouts, tmp_path / "state")
    other = {**FINGERPRINT, "train": {"learning_rate": 2e-2}, "inputs": {"rollouts": "r2", "rewards": "w"}}
    with pytest.raises(TrainStateMismatch) as error:
        run_resumable(rollouts, tmp_path / "state", fingerprint=other)
    message = str(error.value)
    assert "refusing to continue it" in message
    assert "inputs.rollouts: saved 'r', now 'r2'" in message and "train.learning_rate: saved 0.01, now 0.02" in message
    assert "train.resume=false" in message
    # resume: false discards the old states and starts over
    _, metrics, _ = run_resumable(rollouts, tmp_path / "state", RESUMABLE.model_copy(update={"resume": False}), fingerprint=other)
    assert metrics["resumed_from_step"] == 0


def test_reference_kl_is_zero_against_itself_and_the_exact_kl_otherwise(rollouts):
    from rl_assets.rollouts import completion_distributions
    from rl_assets.train import reference_kl

    policy, reference = new_tiny_model(0), new_tiny_model(1)
    assert reference_kl(policy, new_tiny_model(0), rollouts, pad_id=0, temperature=TEMPERATURE) == 0.0
    total = tokens = 0.0
    for row in range(rollouts.num_rows):
        args = ([rollouts["prompt_ids"][row].as_py()], [rollouts["completion_ids"][row].as_py()])
        with torch.no_grad():
            p, mask = completion_distributions(policy, *args, pad_id=0, temperature=TEMPERATURE)
            q, _ = completion_distributions(reference, *args, pad_id=0, temperature=TEMPERATURE)
        for t in range(int(mask.sum())):
            total += sum(math.exp(a) * (a - b) for a, b in zip(p[0, t].tolist(), q[0, t].tolist()))
            tokens += 1
    measured = reference_kl(policy, reference, rollouts, pad_id=0, temperature=TEMPERATURE, batch_size=3)
    assert measured > 0 and measured == pytest.approx(total / tokens, rel=1e-5)


def test_gradient_checkpointing_gives_the_same_update(rollouts):
    plain, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0])
    checkpointed, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0], TRAIN.model_copy(update={"gradient_checkpointing": True}))
    assert not checkpointed.is_gradient_checkpointing  # switched off again for sampling and saving
    first, second = plain.state_dict(), checkpointed.state_dict()
    assert all(torch.allclose(first[k], second[k], atol=1e-6) for k in first)


def test_carried_optimizer_state_continues_adam_instead_of_starting_fresh(rollouts):
    """Two rounds with the moments carried equal one optimizer over both; a fresh AdamW per round differs."""
    params = TRAIN.model_copy(update={"learning_rate": 1e-3, "carry_optimizer_state": True})
    rewards = rewards_for(rollouts, [1.0, 0.0, 0.5, 0.0])
    run = lambda model, state=None: train_on_rollouts(model, rollouts, rewards, params, group_size=2, temperature=TEMPERATURE,  # noqa: E731
                                                      pad_id=0, seed=0, max_new_tokens=4, optimizer_state=state, progress=False)
    model, _, _, state = run(new_tiny_model(0))
    assert state["state"] and all(s["step"] == 1 for s in state["state"].values())
    carried, metrics, _, carried_state = run(model, state)
    assert metrics["carried_optimizer_state"] and all(s["step"] == 2 for s in carried_state["state"].values())
    both = new_tiny_model(0)  # the same two steps with one optimizer
    two_epochs = params.model_copy(update={"epochs": 2})
    one_run, _, _, _ = train_on_rollouts(both, rollouts, rewards, two_epochs, group_size=2, temperature=TEMPERATURE, pad_id=0, seed=0,
                                         max_new_tokens=4, progress=False)
    fresh, _, _, _ = run(run(new_tiny_model(0))[0])
    a, b, c = carried.state_dict(), one_run.state_dict(), fresh.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(not torch.allclose(a[k], c[k], atol=1e-6) for k in a)
