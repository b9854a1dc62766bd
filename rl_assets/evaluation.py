"""evaluation: accuracy of a checkpoint on the held-out prompts, greedy and sampled."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rl_assets.config import EvaluationParams
from rl_assets.rewards import arithmetic_answer
from rl_assets.rollouts import generate


def eval_prompts(prompts: pa.Table, params: EvaluationParams) -> pa.Table:
    held_out = prompts.filter(pa.compute.equal(prompts["split"], "eval"))
    if held_out.num_rows == 0:
        raise ValueError("prompts table has no eval split rows; raise prompts.eval_fraction or add data")
    return held_out.slice(0, params.max_prompts)


def evaluate_checkpoint(model, tokenizer, held_out: pa.Table, params: EvaluationParams, seed: int) -> list[dict]:
    """Two rows, greedy and sampled: accuracy of the first number in each completion against the answer."""
    prompts, answers = held_out["prompt"].to_pylist(), held_out["answer"].to_pylist()
    rows = []
    for mode, samples in (("greedy", 1), ("sampled", params.samples_per_prompt)):
        out = generate(model, tokenizer, prompts, samples, greedy=mode == "greedy", temperature=params.temperature,
                       max_new_tokens=params.max_new_tokens, seed=seed)
        scores = arithmetic_answer(out.texts, answer=[a for a in answers for _ in range(samples)])
        rows.append({
            "mode": mode,
            "accuracy": sum(scores) / len(scores),
            "n_prompts": len(prompts),
            "n_samples": samples,
            "mean_completion_tokens": sum(map(len, out.completion_ids)) / len(out.completion_ids),
            "temperature": 0.0 if mode == "greedy" else params.temperature,
            "seed": seed,
            "examples": list(zip(prompts[:5], out.texts[: 5 * samples : samples], answers[:5])),
        })
    return rows


def summary_text(root: Path = Path(".")) -> str:
    """The evaluation report as a plain-text table: accuracy per checkpoint, greedy and sampled."""
    from rl_assets.paths import output_path
    from rl_assets.schemas import read_table

    rows = read_table(output_path("evaluation", root), "evaluation").to_pylist()
    by_checkpoint: dict[str, dict] = {}
    for row in rows:
        by_checkpoint.setdefault(row["checkpoint"], {"id": row["checkpoint_id"]})[row["mode"]] = row
    first = next(iter(by_checkpoint.values()))
    lines = ["held-out accuracy (greedy; sampled at T={:.1f}, {} samples/prompt, {} prompts)".format(
        first["sampled"]["temperature"], first["sampled"]["n_samples"], first["sampled"]["n_prompts"]),
        f"{'checkpoint':<16}{'id':<14}{'greedy':>8}{'sampled':>9}{'Δ sampled':>11}"]
    for name, entry in by_checkpoint.items():
        delta = (entry["sampled"]["accuracy"] - first["sampled"]["accuracy"]) * 100
        lines.append(f"{name:<16}{entry['id'][:12]:<14}{entry['greedy']['accuracy']:>8.3f}{entry['sampled']['accuracy']:>9.3f}{delta:>+10.1f}p")
    return "\n".join(lines)
