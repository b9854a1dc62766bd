"""evaluation.py: held-out prompts, the greedy and sampled rows, and the text report."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rl_assets.config import EvaluationParams
from rl_assets.evaluation import eval_prompts, evaluate_checkpoint, summary_text
from rl_assets.models import build_tiny_tokenizer
from rl_assets.paths import output_path
from rl_assets.schemas import EVALUATION, write_table

from rl_assets_support import prompts_table, shared_tiny_model

PROBLEMS = [(f"{a}+1=", str(a + 1)) for a in range(6)]
SPLITS = ["eval", "rl", "eval", "eval", "sft", "eval"]


def test_eval_prompts_takes_eval_rows_up_to_the_limit():
    held_out = eval_prompts(prompts_table(PROBLEMS, SPLITS), EvaluationParams(max_prompts=3))
    assert held_out["problem"].to_pylist() == ["0+1=", "2+1=", "3+1="]


def test_eval_prompts_without_eval_rows():
    with pytest.raises(ValueError, match="no eval split rows"):
        eval_prompts(prompts_table(PROBLEMS, ["rl", "sft"] * 3), EvaluationParams())


def test_evaluate_checkpoint_rows():
    tiny_model, tokenizer = shared_tiny_model(), build_tiny_tokenizer()
    held_out = eval_prompts(prompts_table(PROBLEMS, SPLITS), EvaluationParams(max_prompts=4))
    params = EvaluationParams(samples_per_prompt=2, max_new_tokens=3, temperature=0.8)
    greedy, sampled = evaluate_checkpoint(tiny_model, tokenizer, held_out, params, seed=0)
    assert (greedy["mode"], greedy["n_samples"], greedy["temperature"]) == ("greedy", 1, 0.0)
    assert (sampled["mode"], sampled["n_samples"], sampled["temperature"]) == ("sampled", 2, 0.8)
    for row in (greedy, sampled):
        assert row["n_prompts"] == 4 and 0.0 <= row["accuracy"] <= 1.0
        assert 1 <= row["mean_completion_tokens"] <= 3
        assert [e[0] for e in row["examples"]] == held_out["prompt"].to_pylist()


def test_summary_text(tmp_path):
    rows = [{"checkpoint": c, "checkpoint_id": i, "mode": m, "accuracy": a, "n_prompts": 8, "n_samples": n,
             "mean_completion_tokens": 2.0, "temperature": t, "seed": 0}
            for c, i, base in [("r00/checkpoint", "aaaaaaaaaaaaaaaa", 0.25), ("r01/checkpoint", "bbbbbbbbbbbbbbbb", 0.5)]
            for m, a, n, t in [("greedy", base, 1, 0.0), ("sampled", base / 2, 4, 1.0)]]
    write_table(pa.Table.from_pylist(rows, schema=EVALUATION), output_path("evaluation", tmp_path), EVALUATION, "evaluation")
    lines = summary_text(tmp_path).splitlines()
    assert lines[0] == "held-out accuracy (greedy; sampled at T=1.0, 4 samples/prompt, 8 prompts)"
    assert lines[2].split() == ["r00/checkpoint", "aaaaaaaaaaaa", "0.250", "0.125", "+0.0p"]
    assert lines[3].split() == ["r01/checkpoint", "bbbbbbbbbbbb", "0.500", "0.250", "+12.5p"]
