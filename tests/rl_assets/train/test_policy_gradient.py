"""train.py: matching rewards to rollouts, and a GRPO step that moves log-probs the right way."""

from __future__ import annotations

import copy
import math
import warnings

import pyarrow as pa
import pytest
import torch

from rl_assets.core.config import RolloutsParams, TrainParams
from rl_assets.core.logprobs import completion_logprobs
from rl_assets.rollout.sampling import sample_rollouts
from rl_assets.core.schemas import rewards_schema
from rl_assets.core.tokenizer import build_tiny_tokenizer
from rl_assets.train.policy_gradient import join_rewards, train_on_rollouts

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


def max_difference(a: dict, b: dict) -> float:
    """The largest change between two state dicts, to compare updates with a margin far above float rounding."""
    return max((a[k] - b[k]).abs().max().item() for k in a)


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


def test_rows_an_older_checkpoint_sampled_train_against_the_parents_log_probs_weighted_by_the_samplers(rollouts):
    """rollouts.staleness: the decoupled objective. Rows whose policy_id is not the parent's get the parent's own log-probs
    (the ratio's denominator) and keep what sampled them as sampler_logprobs (the truncated importance weight's)."""
    from rl_assets.train.staleness import with_proximal_logprobs

    parent = new_tiny_model(1)  # trained since the rollouts' sampler (new_tiny_model(0), "p0")
    table, stale = with_proximal_logprobs(parent, rollouts, "p1", pad_id=0, temperature=TEMPERATURE, batch_size=3)
    assert stale == 4 and table["sampler_logprobs"].to_pylist() == rollouts["logprobs"].to_pylist()
    for row in range(4):
        expected = sequence_logprob(parent, rollouts, row)
        assert sum(table["logprobs"][row].as_py()) == pytest.approx(expected, abs=1e-4)
        assert abs(sum(rollouts["logprobs"][row].as_py()) - expected) > 1e-3  # the two policies do differ
    same, none = with_proximal_logprobs(parent, rollouts, "p0", pad_id=0, temperature=TEMPERATURE, batch_size=3)
    assert none == 0 and same is rollouts
    # Rows training leaves out (groups of equal rewards) keep what they had: no pass is spent on them.
    part, counted = with_proximal_logprobs(parent, rollouts, "p1", pad_id=0, temperature=TEMPERATURE, batch_size=3,
                                           trained=torch.tensor([True, False, True, False]))
    assert counted == 4 and part["logprobs"].to_pylist()[1::2] == rollouts["logprobs"].to_pylist()[1::2]
    assert part["logprobs"].to_pylist()[0::2] == table["logprobs"].to_pylist()[0::2]
    cap = TRAIN.model_copy(update={"sampler_correction_cap": 1.0})  # every weight above 1 is capped: a share of the tokens
    _, _, metrics = train(table, [1.0, 0.0, 0.5, 0.0], cap)
    assert 0 < metrics["sampler_capped"] <= 1
    _, _, on_policy = train(rollouts, [1.0, 0.0, 0.5, 0.0], cap)
    assert on_policy["sampler_capped"] == 0


def test_micro_batches_group_rows_of_similar_length_where_the_loss_allows(rollouts, monkeypatch):
    """grpo's micro-batches are the step's rows by length (bnpo's stay as drawn: micro_batches' doctest); the update is the
    one big step's (test_gradient_accumulation_matches_one_big_step)."""
    import rl_assets.train.policy_gradient as policy_gradient

    seen = []
    step = policy_gradient.train_step
    monkeypatch.setattr(policy_gradient, "train_step", lambda model, batch, micro, *a, **k: seen.append([m.tolist() for m in micro]) or
                        step(model, batch, micro, *a, **k))
    train(rollouts, [1.0, 0.0, 0.5, 0.0], TRAIN.model_copy(update={"loss_type": "grpo", "gradient_accumulation_steps": 4}))
    lengths = [len(p) + len(c) for p, c in zip(rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist())]
    ordered = [lengths[row] for micro in seen[0] for row in micro]
    assert len(set(lengths)) > 1 and ordered == sorted(ordered)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_a_micro_batch_past_the_logits_bound_trains_in_chunks_to_the_same_update(rollouts, loss_type, monkeypatch):
    """On a CPU a micro-batch whose logits pass PLAIN_LOGITS_MAX goes through two rows at a time, each chunk's loss
    weighted by its share of what the loss type averages over: the update and the loss of the whole micro-batch."""
    import rl_assets.core.logprobs as logprobs
    import rl_assets.train.policy_gradient as policy_gradient

    params = TRAIN.model_copy(update={"loss_type": loss_type, "learning_rate": 1e-3})
    whole, _, whole_metrics = train(rollouts, [1.0, 0.0, 0.5, 0.0], params)
    prompts, completions = rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist()
    assert len(set(map(len, completions))) > 1  # unequal lengths: bnpo's token shares differ from the row shares
    keep = max(len(p) + len(c) for p, c in zip(prompts, completions)) - min(map(len, prompts)) + 1
    monkeypatch.setattr(logprobs, "PLAIN_LOGITS_MAX", 2 * keep * new_tiny_model(0).config.vocab_size)
    calls = []
    forward = policy_gradient.completion_logprobs
    monkeypatch.setattr(policy_gradient, "completion_logprobs", lambda model, p, *args, **kwargs: calls.append(len(p)) or forward(model, p, *args, **kwargs))
    chunked, _, chunked_metrics = train(rollouts, [1.0, 0.0, 0.5, 0.0], params)
    assert calls == [2, 2]
    first, second = whole.state_dict(), chunked.state_dict()
    assert all(torch.allclose(first[k], second[k], atol=1e-6) for k in first)
    assert chunked_metrics["loss"] == pytest.approx(whole_metrics["loss"], abs=1e-6)


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


# --- dropping groups whose rewards are all equal ---------------------------------------------------


DROP = TRAIN.model_copy(update={"drop_equal_reward_groups": True})


@pytest.fixture(scope="module")
def four_groups():
    """Four prompts x two samples from a fresh tiny policy (seed 0)."""
    prompts = prompts_table([("1+2=", "3"), ("4+4=", "8"), ("7*3=", "21"), ("9-5=", "4")])
    params = RolloutsParams(prompts_per_round=4, samples_per_prompt=2, max_new_tokens=4, temperature=TEMPERATURE)
    return sample_rollouts(new_tiny_model(0), build_tiny_tokenizer(), prompts, params, round_number=1, seed=0, policy_id="p0",
                           prompts_hash="h", progress=False)


def same_weights(a, b) -> bool:
    first, second = a.state_dict(), b.state_dict()
    return all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_dropping_changes_nothing_when_every_group_has_signal(rollouts, beta):
    params = TRAIN.model_copy(update={"beta": beta, "epochs": 2, "minibatch_size": 2})
    reference = new_tiny_model(0) if beta else None
    off, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0], params, ref_model=reference)
    on, _, metrics = train(rollouts, [1.0, 0.0, 0.5, 0.0], params.model_copy(update={"drop_equal_reward_groups": True}), ref_model=reference)
    assert same_weights(off, on)
    assert metrics["dropped_rows"] == 0 and metrics["trained_rows"] == 4 and metrics["minibatch_size"] == 2


@pytest.mark.parametrize("algorithm,loss_type", [("grpo", "grpo"), ("grpo", "dapo"), ("reinforce_pp", "bnpo")])
def test_dropping_trains_exactly_as_a_table_of_the_informative_groups(four_groups, algorithm, loss_type):
    """Groups 1 and 3 are all equal: the update is that of a table without them, KL penalty and normalisation included,
    in minibatches halved with the table, so the round keeps its optimizer steps."""
    totals = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    params = TRAIN.model_copy(update={"algorithm": algorithm, "loss_type": loss_type, "beta": 0.1, "epochs": 2, "minibatch_size": 4})
    run = lambda table, scores, p: train_on_rollouts(new_tiny_model(0), table, rewards_for(table, scores), p, group_size=2,  # noqa: E731
                                                     temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4, ref_model=new_tiny_model(0),
                                                     progress=False)
    dropped, metrics, history, _ = run(four_groups, totals, params.model_copy(update={"drop_equal_reward_groups": True}))
    informative, _, expected_history, _ = run(four_groups.take([0, 1, 4, 5]), [1.0, 0.0, 0.0, 1.0], params.model_copy(update={"minibatch_size": 2}))
    everything, all_metrics, _, _ = run(four_groups, totals, params)
    assert same_weights(dropped, informative)
    assert [h["loss"] for h in history] == [h["loss"] for h in expected_history]
    assert not same_weights(dropped, everything)  # the KL term and the normalisation of the all-equal rows are gone
    assert metrics["steps"] == all_metrics["steps"] == 4 and metrics["minibatch_size"] == 2 and metrics["trained_rows"] == 4
    assert metrics["dropped_rows"] == 4 and metrics["dropped_groups"] == 2
    assert metrics["equal_reward_group_share"] == 0.5 and metrics["reward_mean"] == pytest.approx(4 / 8)  # the whole round's rewards


def test_every_informative_row_is_trained_on_in_as_many_steps_as_the_whole_table_takes(four_groups):
    """6 informative rows of 8, minibatch_size 4: 2 steps of 3 rows (not 3 steps of 2), micro-batches of 2 and 1 rows
    weighted by their rows, so accumulating gives the update of one 3-row micro-batch."""
    totals = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0]  # one group of four all equal
    run = lambda accum: train_on_rollouts(new_tiny_model(0), four_groups, rewards_for(four_groups, totals),  # noqa: E731
                                          DROP.model_copy(update={"minibatch_size": 4, "gradient_accumulation_steps": accum}), group_size=2,
                                          temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4, progress=False)
    model, metrics, history, _ = run(2)
    whole, _, whole_history, _ = run(1)
    assert metrics["minibatch_size"] == 3 and metrics["steps"] == 2 and metrics["trained_rows"] == 6 and metrics["dropped_groups"] == 1
    assert not same_weights(model, new_tiny_model(0))
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in whole_history], rel=1e-5)
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value)


def test_a_round_with_every_group_dropped_keeps_the_weights_and_the_optimizer_state(rollouts):
    from rl_assets.eval.guards import entropy_not_collapsed

    params = DROP.model_copy(update={"lr_scheduler": "linear", "warmup_ratio": 0.5, "carry_optimizer_state": True, "learning_rate": 1e-3})
    run = lambda model, totals, state=None: train_on_rollouts(model, rollouts, rewards_for(rollouts, totals), params, group_size=2,  # noqa: E731
                                                              temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4,
                                                              optimizer_state=state, progress=False)
    flat = [1.0, 1.0, 0.0, 0.0]
    model, metrics, history, nothing = run(new_tiny_model(0), flat)
    assert same_weights(model, new_tiny_model(0)) and history == [] and nothing is None  # no moments to carry: the next round starts fresh
    assert metrics["steps"] == 0 and metrics["trained_rows"] == 0 and metrics["dropped_groups"] == 2 and metrics["equal_reward_group_share"] == 1.0
    assert "entropy" not in metrics and entropy_not_collapsed(metrics, 0.01)[2] == {"skipped": True}  # not failed on a mean of no tokens
    # After a round that trains, a flat round hands the moments on untouched.
    trained, _, _, moments = run(model, [1.0, 0.0, 0.5, 0.0])
    weights = {k: v.clone() for k, v in trained.state_dict().items()}
    kept, _, _, carried = run(trained, flat, moments)
    assert all(torch.equal(weights[k], v) for k, v in kept.state_dict().items())
    assert all(torch.equal(carried["state"][k]["exp_avg"], moments["state"][k]["exp_avg"]) and carried["state"][k]["step"] == 1
               for k in moments["state"])


# --- resume ----------------------------------------------------------------------------------------


RESUMABLE = TRAIN.model_copy(update={"minibatch_size": 2, "epochs": 3, "save_steps": 2, "keep_last": 2})
FINGERPRINT = {"train": {"learning_rate": 1e-2}, "inputs": {"rollouts": "r", "rewards": "w"}, "parent": "p0", "world_size": 1, "seed": 0}


def run_resumable(rollouts, state_dir, params=RESUMABLE, fingerprint=FINGERPRINT):
    model, metrics, history, _ = train_on_rollouts(new_tiny_model(0), rollouts, rewards_for(rollouts, [1.0, 0.0, 0.3, 0.9]), params,
                                                group_size=2, temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4,
                                                state_dir=state_dir, fingerprint=fingerprint, progress=False)
    return model.state_dict(), metrics, history


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(rollouts, tmp_path):
    from rl_assets.train.train_state import saved_states

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
    from rl_assets.train.train_state import saved_states

    params = RESUMABLE.model_copy(update={"epochs": 5, "save_steps": 1, "keep_last": 3})
    run_resumable(rollouts, tmp_path / "state", params)
    assert [p.name for p in saved_states(tmp_path / "state")] == ["step-000007", "step-000008", "step-000009"]


def test_resume_refuses_a_state_from_another_configuration(rollouts, tmp_path):
    from rl_assets.train.train_state import TrainStateMismatch

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


def _next_token_distributions(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """(len(completion), V) float64 log-distributions predicting each completion token, one unpadded sequence."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].double() / TEMPERATURE
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(completion)]


@pytest.mark.parametrize("max_logits", [2**25, 1])  # one chunk per prompt length, and one row per forward
def test_reference_kl_is_zero_against_itself_and_the_exact_kl_otherwise(rollouts, max_logits, monkeypatch):
    import rl_assets.core.logprobs
    from rl_assets.train.policy_gradient import reference_kl

    chunked = rl_assets.core.logprobs.completion_kl
    monkeypatch.setattr("rl_assets.train.policy_gradient.completion_kl", lambda *a, **k: chunked(*a, **k, max_logits=max_logits))
    policy, reference = new_tiny_model(0), new_tiny_model(1)
    assert reference_kl(policy, new_tiny_model(0), rollouts, pad_id=0, temperature=TEMPERATURE) == 0.0
    total = tokens = 0.0
    for row in range(rollouts.num_rows):
        prompt, completion = rollouts["prompt_ids"][row].as_py(), rollouts["completion_ids"][row].as_py()
        p, q = _next_token_distributions(policy, prompt, completion), _next_token_distributions(reference, prompt, completion)
        total += (p.exp() * (p - q)).sum().item()
        tokens += len(completion)
    measured = reference_kl(policy, reference, rollouts, pad_id=0, temperature=TEMPERATURE)
    assert measured > 0 and measured == pytest.approx(total / tokens, rel=1e-4)  # float32 logits, padded batches


def test_reference_kl_on_a_few_rows_is_the_exact_kl_of_one_sample_of_each_prompt(four_groups):
    """guards.kl_rows: the first sample of every prompt before any second one; the KL exact over those rows alone."""
    from rl_assets.train.policy_gradient import kl_rows, reference_kl

    assert kl_rows(four_groups, 5) == [0, 2, 4, 6, 1]  # four prompts x two samples: each prompt once, then a second sample
    assert kl_rows(four_groups, 100) == sorted(kl_rows(four_groups, 100), key=lambda r: (r % 2, r)) and len(kl_rows(four_groups, 100)) == 8
    policy, reference = new_tiny_model(0), new_tiny_model(1)
    total = tokens = 0.0
    for row in (0, 2, 4):
        prompt, completion = four_groups["prompt_ids"][row].as_py(), four_groups["completion_ids"][row].as_py()
        p, q = _next_token_distributions(policy, prompt, completion), _next_token_distributions(reference, prompt, completion)
        total += (p.exp() * (p - q)).sum().item()
        tokens += len(completion)
    measured = reference_kl(policy, reference, four_groups, pad_id=0, temperature=TEMPERATURE, rows=3)
    assert measured == pytest.approx(total / tokens, rel=1e-4)
    assert measured != pytest.approx(reference_kl(policy, reference, four_groups, pad_id=0, temperature=TEMPERATURE, rows=8), rel=1e-3)


def test_gradient_checkpointing_gives_the_same_update(rollouts):
    plain, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the current names: no "`gradient_checkpointing_enable` is deprecated"
        checkpointed, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0], TRAIN.model_copy(update={"gradient_checkpointing": True}))
        assert not checkpointed.is_activation_checkpointing  # switched off again for sampling and saving
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
    assert max_difference(a, b) < 1e-6
    assert max_difference(a, c) > 100 * 1e-6  # moments carried vs fresh: a different step, not rounding


def test_carried_moments_are_loaded_without_a_step_of_zeros(rollouts):
    """torch's set_optimizer_state_dict first steps the optimizer on zero gradients to allocate its state: moments and
    gradients as large as the weights again, at the moment the carried ones are in memory too (1.5 GB more at the peak
    for a 135M model). One process, no FSDP: the carried tensors are taken as they are, and only training steps run."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    params = TRAIN.model_copy(update={"learning_rate": 1e-3, "carry_optimizer_state": True})
    rewards = rewards_for(rollouts, [1.0, 0.0, 0.5, 0.0])
    run = lambda model, state=None: train_on_rollouts(model, rollouts, rewards, params, group_size=2, temperature=TEMPERATURE,  # noqa: E731
                                                      pad_id=0, seed=0, max_new_tokens=4, optimizer_state=state, progress=False)
    model, _, _, state = run(new_tiny_model(0))
    steps = []
    handle = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: steps.append(optimizer))
    try:
        _, metrics, _, carried = run(model, state)
    finally:
        handle.remove()
    assert len(steps) == metrics["steps"] == 1
    assert all(carried["state"][k]["exp_avg"] is state["state"][k]["exp_avg"] for k in state["state"])  # the same memory, continued


def _with_sampler_logprobs(rollouts, shift):
    """The table as vLLM would have stored it: its own log-probs, `shift(row, token)` below the trainer's recomputed ones."""
    column = pa.array([[v - shift(r, t) for t, v in enumerate(row)] for r, row in enumerate(rollouts["logprobs"].to_pylist())],
                      type=pa.list_(pa.float32()))
    return rollouts.set_column(rollouts.schema.get_field_index("sampler_logprobs"), "sampler_logprobs", column)


def test_sampler_logprobs_reweight_the_update_unless_the_correction_is_off(rollouts):
    """Weights that differ between tokens and rows turn the gradient, so the update differs by far more than rounding.

    One constant weight on every token would only scale the gradient, which AdamW's m / sqrt(v) all but cancels: whether
    such updates differ by 1e-7 depends on the CPU's arithmetic. Here some of AdamW's first-step signs flip, and a flip
    moves a weight by 2 x learning_rate.
    """
    totals = [1.0, 0.0, 0.5, 0.0]
    varying = lambda row, token: 1.0 if (row + token) % 2 else 0.0  # noqa: E731  weights e and 1, alternating
    plain, _, _ = train(rollouts, totals)
    corrected, _, _ = train(_with_sampler_logprobs(rollouts, varying), totals)
    off, _, _ = train(_with_sampler_logprobs(rollouts, varying), totals, TRAIN.model_copy(update={"sampler_correction_cap": None}))
    same, _, _ = train(_with_sampler_logprobs(rollouts, lambda row, token: 0.0), totals)  # a sampler that agrees: weight 1
    a, b, c, d = plain.state_dict(), corrected.state_dict(), off.state_dict(), same.state_dict()
    assert max_difference(a, b) > TRAIN.learning_rate  # a sign flip, 2 x lr; rounding is ~1e-9 here
    assert max_difference(a, c) == 0.0 and max_difference(a, d) < 1e-6


def test_group_size_comes_from_the_table_and_a_mismatch_names_both(rollouts):
    from rl_assets.train.policy_gradient import table_group_size

    assert table_group_size(rollouts, 2) == 2
    with pytest.raises(ValueError, match="rollouts table has 2 samples per prompt but rollouts.samples_per_prompt is 4"):
        table_group_size(rollouts, 4)
    with pytest.raises(ValueError, match=r"same number of consecutive samples; found group sizes \[1, 3\]"):
        table_group_size(rollouts.take([0, 1, 2, 0]).set_column(1, "prompt_id", pa.array(["a", "b", "b", "b"])), 2)


@pytest.fixture()
def fresh_accelerator_state():
    """Accelerate keeps one process-wide state; a test with other precision settings needs its own."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def test_bf16_stores_logprobs_in_the_trainers_precision_and_keeps_fp32_master_weights(fresh_accelerator_state):
    """Under bf16 autocast (CPU here, CUDA on GPUs) the first ratio is 1 when the rollouts used the same autocast."""
    from rl_assets.core.precision import compute_autocast

    tokenizer = build_tiny_tokenizer()
    prompts = prompts_table([("1+2=", "3"), ("4+4=", "8"), ("7*3=", "21"), ("9-5=", "4")])
    params = RolloutsParams(prompts_per_round=4, samples_per_prompt=2, max_new_tokens=4, temperature=TEMPERATURE)
    bf16 = TRAIN.model_copy(update={"mixed_precision": "bf16", "minibatch_size": 8})

    def first_step_kl_old(autocast):
        table = sample_rollouts(new_tiny_model(0), tokenizer, prompts, params, round_number=1, seed=0, policy_id="p", prompts_hash="h",
                                progress=False, autocast=autocast)
        model, _, history, _ = train_on_rollouts(new_tiny_model(0), table, rewards_for(table, [1.0, 0.0] * 4), bf16, group_size=2,
                                                 temperature=TEMPERATURE, pad_id=0, seed=0, max_new_tokens=4, progress=False)
        assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights under bf16 compute
        return abs(history[0]["kl_old"])

    matched, mismatched = first_step_kl_old(compute_autocast("bf16", "cpu")), first_step_kl_old(None)
    assert matched < 1e-6 < mismatched


def test_whole_copy_rebuilds_a_plain_model_from_gathered_weights():
    """What rank 0 does under FSDP: the gathered full state dict into an unsharded model of the same architecture."""
    from rl_assets.train.policy_gradient import _whole_copy

    model = new_tiny_model(3)
    copy = _whole_copy(model, {k: v.clone() for k, v in model.state_dict().items()})
    assert type(copy) is type(model) and copy is not model
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(copy(input_ids=ids).logits, model(input_ids=ids).logits)


def test_a_mixed_precision_round_leaves_the_fused_head_for_the_next_rounds_log_probs(rollouts, fresh_accelerator_state, monkeypatch):
    """A resident run samples round N+1 with the model round N trained: after a bf16 round Accelerate's autocast wrapper is
    undone, which took TRL's fused head with it; the next log-prob pass failed ('CausalLMOutputWithPast' has no log_probs)."""
    monkeypatch.setattr("rl_assets.core.logprobs.PLAIN_LOGITS_MAX", 0)  # the fused head, as a GPU or a large vocabulary uses it
    model, _, _ = train(rollouts, [1.0, 0.0, 0.5, 0.0], TRAIN.model_copy(update={"mixed_precision": "bf16"}))
    prompt_ids, completion_ids = rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist()
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, prompt_ids, completion_ids, 0, TEMPERATURE)
    assert logprobs.shape == mask.shape and torch.isfinite(logprobs).all()
