"""guards.py: each guard passes on a healthy value, fails past its threshold, and skips a missing metric."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from ops_support import make_fake_project
from rl_assets.eval import guards
from rl_assets.core.config import GuardsParams
from rl_assets.core.schemas import read_table


def test_kl_passes_at_the_limit_and_fails_above_it():
    assert guards.kl_within_limit(0.03, 0.03)[0]
    passed, description, metadata = guards.kl_within_limit(0.031, 0.03)
    assert not passed and "kl_max=0.03" in description and metadata["kl"] == 0.031
    assert not guards.kl_within_limit(math.nan, 0.03)[0]


def test_reference_kl_is_kl_or_a_measured_kl_ref():
    assert guards.reference_kl({"metrics": {"kl": 0.2, "kl_ref": 0.1}, "train": {"beta": 0.04}}) == 0.2
    assert guards.reference_kl({"metrics": {"kl_ref": 0.1}, "train": {"beta": 0.04}}) == 0.1
    assert guards.reference_kl({"metrics": {"kl_ref": 0.0}, "train": {"beta": 0.0}}) is None  # penalty off: not measured


@pytest.mark.parametrize("guard", [lambda m: guards.kl_within_limit(guards.reference_kl({"metrics": m}), 0.03),
                                   lambda m: guards.entropy_not_collapsed(m, 0.01)])
def test_a_missing_metric_is_a_skip_that_says_so(guard):
    passed, description, metadata = guard({"loss": 1.0})
    assert passed and description.startswith(guards.SKIPPED) and metadata == {"skipped": True}


def test_any_nan_or_inf_metric_fails_naming_it():
    assert guards.metrics_finite({"loss": 0.1, "steps": 4, "name": "x"})[0]
    passed, description, metadata = guards.metrics_finite({"loss": math.inf, "nested": {"kl": math.nan}, "ok": 1.0})
    assert not passed and metadata["not_finite"] == ["loss", "nested.kl"]


def test_collapsed_entropy_fails():
    assert guards.entropy_not_collapsed({"entropy": 0.5}, 0.01)[0]
    assert not guards.entropy_not_collapsed({"entropy": 0.001}, 0.01)[0]


def test_rewards_with_every_group_equal_have_no_signal():
    table = lambda rewards: pa.table({"prompt_id": ["a", "a", "b", "b"], "reward": rewards})  # noqa: E731
    assert guards.rewards_have_signal(table([1.0, 0.0, 0.0, 0.0]))[0]
    passed, description, metadata = guards.rewards_have_signal(table([1.0, 1.0, 0.0, 0.0]))
    assert not passed and metadata == {"groups": 2, "equal_reward_groups": 2} and "is a reward function constant?" in description
    passed, description, _ = guards.rewards_have_signal(table([0.0] * 4), truncated_share=0.875, max_new_tokens=128)
    assert not passed and "87.5% of the completions were cut off at rollouts.max_new_tokens=128 before they answered: raise it" in description


def test_reward_and_accuracy_regressions_beyond_tolerance_fail():
    assert guards.reward_not_regressed(0.45, 0.5, 0.1)[0]
    assert not guards.reward_not_regressed(0.35, 0.5, 0.1)[0]
    assert guards.reward_not_regressed(0.1, None, 0.1)[1].startswith(guards.SKIPPED)
    rows = lambda accs: pa.Table.from_pylist([{"checkpoint": f"r{i:02d}/checkpoint", "mode": "sampled", "accuracy": a} for i, a in enumerate(accs)])  # noqa: E731
    assert guards.accuracy_not_regressed(rows([0.4, 0.38, 0.5]), 0.05)[0]
    passed, description, _ = guards.accuracy_not_regressed(rows([0.4, 0.5, 0.3]), 0.05)
    assert not passed and description.startswith("r02/checkpoint")


def test_checkpoint_guards_skip_kl_and_entropy_for_r00():
    limits = GuardsParams()
    assert set(guards.checkpoint_guards({"round": 0, "metrics": {"loss": 1.0}}, limits)) == {"metrics_finite"}
    checks = guards.checkpoint_guards({"round": 2, "metrics": {"kl": 0.5, "entropy": 1.0}}, limits)
    assert {name for name, (passed, _, _) in checks.items() if not passed} == {"kl_within_limit"}


def test_lineage_guards_pass_on_a_consistent_project_and_catch_each_break(tmp_path):
    root = make_fake_project(tmp_path)
    data = root / "data"
    rollouts = read_table(data / "r01/rollouts.parquet", "rollouts")
    assert guards.table_schema(data / "r01/rollouts.parquet", "rollouts")[0]
    assert not guards.table_schema(data / "r01/rollouts.parquet", "rewards")[0]
    assert guards.sources_match_files(read_table(data / "prompts.parquet", "prompts"), root)[0]
    assert guards.rollouts_lineage(rollouts, data / "r00/checkpoint", data / "prompts.parquet")[0]
    assert not guards.rollouts_lineage(rollouts, data / "r01/checkpoint", data / "prompts.parquet")[0]  # sampled by r00, not r01
    assert guards.rewards_lineage(read_table(data / "r01/rewards.parquet", "rewards"), data / "r01/rollouts.parquet")[0]
    assert not guards.rewards_lineage(read_table(data / "r02/rewards.parquet", "rewards"), data / "r01/rollouts.parquet")[0]
    tables = {"rollouts": data / "r02/rollouts.parquet", "rewards": data / "r02/rewards.parquet"}
    assert guards.checkpoint_lineage(data / "r02/checkpoint", data / "r01/checkpoint", tables)[0]
    (data / "r02/checkpoint/model.safetensors").write_bytes(b"other weights")
    passed, description, _ = guards.checkpoint_lineage(data / "r02/checkpoint", data / "r01/checkpoint", tables)
    assert not passed and "hash of the weights" in description
    (root / "data/raw/extra.jsonl").write_text("changed\n")
    assert not guards.sources_match_files(read_table(data / "prompts.parquet", "prompts"), root)[0]


def _sampled(*counts: list[int], samples: int = 2) -> dict[int, dict]:
    return {k: {"accuracy": sum(c) / (len(c) * samples), "correct_per_prompt": c, "n_samples": samples, "correctness": "check"}
            for k, c in enumerate(counts)}


def test_reward_hacking_fires_only_on_a_fall_beyond_noise_while_the_reward_rises():
    from rl_assets.core.config import GuardsParams
    from rl_assets.eval.guards import reward_not_hacked

    guards = GuardsParams(hacking_window=1)
    falling = _sampled([2, 2, 2, 2, 1, 1, 2, 2], [0, 1, 0, 1, 0, 0, 1, 0])
    passed, why, meta = reward_not_hacked({0: 0.2, 1: 0.4}, falling, {}, guards)
    assert not passed and why.startswith("reward hacking at r01") and meta["round"] == 1
    assert meta["training_reward"]["raw_value"] == {"r00": 0.2, "r01": 0.4}
    assert reward_not_hacked({0: 0.4, 1: 0.3}, falling, {}, guards)[0]  # the reward fell too: a worse policy, not a hacked one
    noisy = _sampled([2, 0, 2, 0, 1, 1, 2, 0], [0, 2, 1, 1, 0, 2, 1, 0])  # accuracy down 1/16 with a wide spread
    assert reward_not_hacked({0: 0.2, 1: 0.4}, noisy, {}, guards)[0]
    assert reward_not_hacked({0: 0.2, 1: 0.4}, falling, {}, GuardsParams(hacking_window=1, hacking_accuracy_fall_min=0.9))[0]
    skipped = reward_not_hacked({0: 0.2}, falling, {}, GuardsParams(hacking_window=2))
    assert skipped[0] and skipped[1].startswith("skipped:")


def test_a_growing_disagreement_between_reward_and_check_fires_too():
    from rl_assets.core.config import GuardsParams
    from rl_assets.eval.guards import reward_not_hacked

    flat = _sampled([1, 1, 1, 1], [1, 1, 1, 1])
    guards = GuardsParams(hacking_window=1)
    assert not reward_not_hacked({0: 0.2, 1: 0.4}, flat, {0: 0.1, 1: 0.5}, guards)[0]
    assert reward_not_hacked({0: 0.2, 1: 0.4}, flat, {0: 0.1, 1: 0.25}, guards)[0]
    assert reward_not_hacked({0: 0.2, 1: 0.4}, flat, {0: None, 1: 0.9}, guards)[0]  # no rewarded rollout to judge in r00


def test_rewarded_but_wrong_is_the_share_of_above_group_mean_rollouts_the_check_rejects():
    import pyarrow as pa

    from rl_assets.eval.guards import rewarded_but_wrong

    rewards = pa.table({"prompt_id": ["a", "a", "b", "b", "c"], "reward": [1.0, 0.0, 0.5, 0.5, 0.7],
                        "score_check": [0.0, 1.0, 1.0, 0.0, 1.0]})
    # a: the first is rewarded and wrong; b: equal rewards, none rewarded; c: one sample, above the table mean (0.54) and right
    assert rewarded_but_wrong(rewards, "check") == 0.5
    assert rewarded_but_wrong(rewards, "missing") is None
