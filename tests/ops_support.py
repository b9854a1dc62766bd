"""A fake project on disk for the guard, check and promotion tests: consistent tables and checkpoint
folders (lineage cards, weight files of random bytes) without training anything.

Everything links up the way the real pipeline writes it: rollouts name the checkpoint that sampled
them and the prompts file's hash, rewards name the rollouts file's hash, each checkpoint card names
its parent and the hashes of the tables it trained on, so every lineage guard passes until a test
breaks something on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import yaml

from rl_assets.core.checkpoints import LINEAGE_FILE, weights_hash
from rl_assets.core.paths import data_dir
from rl_assets.core.schemas import EVALUATION, PROMPTS, RAW_DATA, ROLLOUTS, rewards_schema, write_table
from rl_assets.core.storage import file_hash

RAW = "data/raw/extra.jsonl"
PARAMS = {"seed": 0, "rounds": 2,
          "raw_data": {"sources": [{"kind": "jsonl", "path": RAW, "columns": {"prompt": "question", "answer": "solution"}}]},
          "rewards": {"functions": [{"name": "arithmetic_answer", "weight": 1.0}]},
          "evaluation": {"max_prompts": 4, "samples_per_prompt": 2}}
GOOD_METRICS = {"loss": 0.1, "kl": 0.01, "entropy": 0.8, "reward_mean": 0.5}


def write_checkpoint(path: Path, round_number: int, parent: str, metrics: dict, trained_on: dict, seed: int) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.safetensors").write_bytes(f"weights {round_number} {seed}".encode())
    card = {"checkpoint_id": weights_hash(path), "round": round_number, "parent": parent, "algorithm": "grpo" if round_number else "sft",
            "params_hash": "p", "code_version": "test", "trained_on": trained_on, "metrics": metrics}
    (path / LINEAGE_FILE).write_text(json.dumps(card))
    return card["checkpoint_id"]


def _rewards(n: int, rollouts: pa.Table, rollouts_path: Path, values: list[float]) -> pa.Table:
    rows = [{"round": n, "prompt_id": p, "sample_idx": s, "policy_id": "x", "reward": r, "reward_config_hash": "c",
             "rollouts_hash": file_hash(rollouts_path), "score_arithmetic_answer": r}
            for p, s, r in zip(rollouts["prompt_id"].to_pylist(), rollouts["sample_idx"].to_pylist(), values)]
    return pa.Table.from_pylist(rows, schema=rewards_schema(["arithmetic_answer"]))


def make_fake_project(root: Path, metrics: dict[int, dict] | None = None, sampled: dict[int, float] | None = None,
                      rewards: dict[int, list[float]] | None = None, rounds: int = 2, seed: int = 0, experiment: str | None = None,
                      images: dict[int, bytes] | None = None) -> Path:
    """Outputs of a `rounds`-round pipeline under `root`; `metrics`/`sampled`/`rewards` override rounds' values.
    With `experiment`, params.yaml names it and the outputs are in its data folder. `images` {prompt index: file bytes}
    gives prompts p0..p3 an image each, stored in <data>/images as raw_data stores them."""
    metrics, sampled, rewards = metrics or {}, sampled or {}, rewards or {}
    (root / "data/raw").mkdir(parents=True, exist_ok=True)
    (root / RAW).write_text('{"question": "1+1=", "solution": "2"}\n')
    (root / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "rounds": rounds, **({"experiment": experiment} if experiment else {})}))
    data = data_dir(experiment or "default", root)
    source = {"source": RAW, "source_hash": file_hash(root / RAW)}
    write_table(pa.Table.from_pylist([{**source, "source_row": 0, "prompt": "1+1=", "answer": "2"}], schema=RAW_DATA),
                data / "raw_data.parquet", RAW_DATA, "raw_data")
    from rl_assets.data.images import image_id, store_images

    images = {i: (image_id(data), data) for i, data in (images or {}).items()}
    store_images({identifier: (data, "png") for identifier, data in images.values()}, data / "images")
    prompts = [{"prompt_id": f"p{i}", "prompt": f"{i}+1=", "problem": f"{i}+1=", "answer": str(i + 1), "split": "rl" if i < 2 else "eval",
                "n_tokens": 5, **source, "source_row": 0, "image_ids": [images[i][0]] if i in images else []} for i in range(4)]
    prompts_path = write_table(pa.Table.from_pylist(prompts, schema=PROMPTS), data / "prompts.parquet", PROMPTS, "prompts")
    parent = write_checkpoint(data / "r00/checkpoint", 0, "tiny", metrics.get(0, {"loss": 1.0}), {"prompts": file_hash(prompts_path)}, seed)
    for n in range(1, rounds + 1):
        prefix = data / f"r{n:02d}"
        rows = [{"round": n, "prompt_id": f"p{i}", "sample_idx": s, "prompt": f"{i}+1=", "answer": str(i + 1), "completion": "2",
                 "prompt_ids": [1], "completion_ids": [2], "logprobs": [-1.0], "truncated": False, "policy_id": parent, "temperature": 1.0,
                 "top_p": 1.0, "max_new_tokens": 4, "seed": 0, "prompts_hash": file_hash(prompts_path)} for i in range(2) for s in range(2)]
        rollouts_path = write_table(pa.Table.from_pylist(rows, schema=ROLLOUTS), prefix / "rollouts.parquet", ROLLOUTS, "rollouts")
        table = _rewards(n, pa.Table.from_pylist(rows, schema=ROLLOUTS), rollouts_path, rewards.get(n, [1.0, 0.0, 0.0, 1.0]))
        rewards_path = write_table(table, prefix / "rewards.parquet", table.schema, "rewards")
        parent = write_checkpoint(prefix / "checkpoint", n, parent, metrics.get(n, GOOD_METRICS),
                                  {"rollouts": file_hash(rollouts_path), "rewards": file_hash(rewards_path)}, seed)
    write_evaluation(root, {n: sampled.get(n, 0.3 + 0.1 * n) for n in range(rounds + 1)}, data)
    return root


def write_evaluation(root: Path, sampled: dict[int, float], data: Path | None = None) -> None:
    """The evaluation table for the checkpoints now on disk (in the data folder `data`, default ROOT/data), with the given sampled accuracies."""
    data = root / "data" if data is None else data
    rows = []
    for n, accuracy in sampled.items():
        checkpoint_id = json.loads((data / f"r{n:02d}/checkpoint" / LINEAGE_FILE).read_text())["checkpoint_id"]
        for mode, value in (("greedy", accuracy + 0.05), ("sampled", accuracy)):
            rows.append({"checkpoint": f"r{n:02d}/checkpoint", "checkpoint_id": checkpoint_id, "mode": mode, "accuracy": value,
                         "reward_mean": value, "pass_at_k": value, "correctness": "arithmetic_answer", "n_prompts": 2, "n_samples": 1 if mode == "greedy" else 2, "mean_completion_tokens": 1.0,
                         "temperature": 0.0 if mode == "greedy" else 1.0, "seed": 0})
    write_table(pa.Table.from_pylist(rows, schema=EVALUATION), data / "evaluation.parquet", EVALUATION, "evaluation")
