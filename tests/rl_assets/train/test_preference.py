"""preference.py: best-vs-worst pairs and top-k selection from scored groups, then TRL's DPO and SFT trainers on them."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch

from rl_assets.core.config import TrainParams
from rl_assets.train.preference import preference_pairs, top_completions, train_dpo, train_rft
from rl_assets.core.logprobs import completion_logprobs
from rl_assets.core.schemas import rewards_schema
from rl_assets.core.tokenizer import build_tiny_tokenizer

from rl_assets_support import new_tiny_model, rollouts_table

# (prompt_id, sample_idx, completion, reward): p1 has a clear best and worst, p2 a small gap, p3 is flat.
ROWS = [("p1", 0, "7", 1.0), ("p1", 1, "9", 0.0), ("p1", 2, "8", 0.0), ("p1", 3, "77", 0.5),
        ("p2", 0, "3", 0.2), ("p2", 1, "4", 0.0), ("p2", 2, "4", 0.1), ("p2", 3, "5", 0.0),
        ("p3", 0, "1", 1.0), ("p3", 1, "1", 1.0), ("p3", 2, "2", 1.0), ("p3", 3, "1", 1.0)]


def tables(rows=ROWS):
    rollouts = rollouts_table([{"prompt_id": p, "sample_idx": s, "prompt": f"{p}?", "completion": c} for p, s, c, _ in rows])
    n = len(rows)
    rewards = pa.table({"round": [1] * n, "prompt_id": [r[0] for r in rows], "sample_idx": [r[1] for r in rows], "policy_id": ["x"] * n,
                        "reward": [r[3] for r in rows], "reward_config_hash": ["c"] * n, "rollouts_hash": ["h"] * n}, schema=rewards_schema([]))
    return rollouts, rewards


@pytest.mark.parametrize("min_margin,expected", [
    (0.0, [("p1?", "7", "9", 1.0), ("p2?", "3", "4", 0.2)]),  # ties: the lower sample index wins on both ends
    (0.5, [("p1?", "7", "9", 1.0)]),
    (1.5, []),
])
def test_preference_pairs_take_best_and_worst_above_the_margin(min_margin, expected):
    pairs = preference_pairs(*tables(), min_margin)
    assert [(p["prompt"], p["chosen"], p["rejected"], pytest.approx(p["margin"])) for p in pairs] == expected


@pytest.mark.parametrize("top_k,min_reward,expected", [
    (1, 1.0, [("p1?", "7"), ("p3?", "1")]),
    (2, 0.5, [("p1?", "7"), ("p1?", "77"), ("p3?", "1"), ("p3?", "1")]),
    (1, 0.15, [("p1?", "7"), ("p2?", "3"), ("p3?", "1")]),
    (3, 2.0, []),
])
def test_top_completions_keep_the_best_above_the_threshold(top_k, min_reward, expected):
    kept = top_completions(*tables(), top_k, min_reward)
    assert [(k["prompt"], k["completion"]) for k in kept] == expected


def sequence_logprob(model, tokenizer, prompt: str, completion: str) -> float:
    prompt_ids = tokenizer(prompt)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, [prompt_ids], [completion_ids], tokenizer.pad_token_id)
    return (logprobs * mask).sum().item()


DPO = TrainParams(algorithm="dpo", learning_rate=5e-3, epochs=4, dpo={"beta": 0.1, "min_margin": 0.5, "batch_size": 2})


@pytest.mark.parametrize("loss_type", [["sigmoid"], ["sigmoid", "sft"]])
def test_dpo_raises_the_chosen_over_the_rejected(loss_type):
    tokenizer = build_tiny_tokenizer()
    model = new_tiny_model(0)
    gap = lambda m: sequence_logprob(m, tokenizer, "p1?", "7") - sequence_logprob(m, tokenizer, "p1?", "9")  # noqa: E731
    before = gap(model)
    params = DPO.model_copy(update={"dpo": DPO.dpo.model_copy(update={"loss_type": loss_type})})
    trained, metrics = train_dpo(model, tokenizer, *tables(), params, seed=0)
    assert metrics["pairs"] == 1 and metrics["steps"] == 4 and metrics["history"]
    assert gap(trained) > before + 0.1
    assert not trained.training


def test_dpo_without_pairs_returns_the_parent_unchanged():
    tokenizer, model = build_tiny_tokenizer(), new_tiny_model(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flat = [r for r in ROWS if r[0] == "p3"]
    trained, metrics = train_dpo(model, tokenizer, *tables(flat), DPO, seed=0)
    assert metrics["pairs"] == 0 and metrics["steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in trained.state_dict().items())


def test_rft_raises_the_kept_completion():
    tokenizer, model = build_tiny_tokenizer(), new_tiny_model(0)
    before = sequence_logprob(model, tokenizer, "p1?", "7")
    params = TrainParams(algorithm="rft", learning_rate=5e-3, epochs=3, rft={"top_k": 1, "min_reward": 1.0, "batch_size": 2})
    trained, metrics = train_rft(model, tokenizer, *tables(), params, seed=0)
    assert metrics["kept"] == 2 and metrics["steps"] == 3
    assert sequence_logprob(trained, tokenizer, "p1?", "7") > before + 0.5


def test_dpo_with_lora_takes_the_parent_with_its_trained_adapters_as_the_reference(tmp_path):
    """Sigmoid DPO with policy == reference starts at exactly -log sigmoid(0) = log 2, with zero implicit rewards.

    The parent is r00 + adapters trained in earlier rounds; a reference with the adapters disabled
    (the r00 base) would start elsewhere, which the gap check below makes sure of.
    """
    from rl_assets.core.checkpoints import read_lineage, save_checkpoint
    from rl_assets.core.config import LoraParams
    from rl_assets.core.policy import load_trainable_policy

    lora = LoraParams(enabled=True, r=4, alpha=8, dropout=0.0)
    tokenizer, r00, r01 = build_tiny_tokenizer(), tmp_path / "r00", tmp_path / "r01"
    save_checkpoint(new_tiny_model(0), tokenizer, r00, {"round": 0})
    model, _ = load_trainable_policy(r00, lora, r00)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # adapters as after earlier rounds: base + adapters is not the base
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 20)
    save_checkpoint(model, tokenizer, r01, {"round": 1}, lora=lora)
    parent, _ = load_trainable_policy(r01, lora, r00)  # what run_train hands to DPO in round 2

    gap = lambda m: sequence_logprob(m, tokenizer, "p1?", "7") - sequence_logprob(m, tokenizer, "p1?", "9")  # noqa: E731
    with parent.disable_adapter():
        base_gap = gap(parent)
    beta = 1.0
    assert abs(math.log1p(math.exp(-beta * (gap(parent) - base_gap))) - math.log(2)) > 0.05  # what a base reference would give

    params = TrainParams(algorithm="dpo", learning_rate=5e-3, epochs=2, lora=lora, dpo={"beta": beta, "min_margin": 0.5, "batch_size": 2})
    trained, metrics = train_dpo(parent, tokenizer, *tables(), params, seed=0)
    first = metrics["history"][0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["rewards/chosen"] == pytest.approx(0.0, abs=1e-5) and first["rewards/rejected"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["history"][-1]["loss"] < math.log(2)  # and it trains the adapters
    assert list(trained.peft_config) == ["default"]  # no reference adapter left behind to be saved with the checkpoint
    save_checkpoint(trained, tokenizer, tmp_path / "r02", {"round": 2}, lora=lora)
    assert sorted(p.name for p in (tmp_path / "r02").iterdir() if p.is_dir()) == []
    assert read_lineage(tmp_path / "r02")["lora_base"] == {"path": str(r00.resolve()), "checkpoint_id": read_lineage(r00)["checkpoint_id"]}
