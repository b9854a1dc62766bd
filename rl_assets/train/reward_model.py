"""reward_model: a one-label sequence classifier trained on preference pairs with TRL's RewardTrainer.

The preference file is JSONL, one pair a line: `{"chosen": str, "rejected": str}` plus an optional
`"prompt"` that both responses continue. The output is a `save_pretrained` folder (with lineage.json)
that `AutoModelForSequenceClassification` loads, and that the `reward_model` reward function scores with.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rl_assets.core.config import ModelParams, RewardModelParams


def read_preferences(path: str | Path) -> list[dict]:
    """The pairs of a JSONL preference file; a bad line stops with the file and line number."""
    pairs = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from None
        fields = {"chosen", "rejected"} | ({"prompt"} if isinstance(row, dict) and "prompt" in row else set())
        if not isinstance(row, dict) or set(row) != fields or not all(isinstance(row[f], str) for f in fields):
            raise ValueError(f"{path}:{number}: a pair is {{'chosen': str, 'rejected': str}} with an optional 'prompt': str")
        pairs.append(row)
    if not pairs:
        raise ValueError(f"{path}: no preference pairs")
    return pairs


def build_base(params: RewardModelParams, seed: int):
    """(model, tokenizer): the base with a freshly initialised one-label score head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaForSequenceClassification

    if params.name_or_path == "tiny":
        from rl_assets.core.policy import build_tiny_model
        from rl_assets.core.tokenizer import build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        config = build_tiny_model(ModelParams(tiny=params.tiny), tokenizer, seed).config  # the embedded shape, as a classifier
        config.num_labels = 1
        return LlamaForSequenceClassification(config), tokenizer
    tokenizer = AutoTokenizer.from_pretrained(params.name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(params.name_or_path, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def reward_config(params: RewardModelParams, output_dir: str, seed: int, use_cpu: bool):
    """Our `reward_model` section mapped onto TRL's RewardConfig (the only place the two meet)."""
    from trl import RewardConfig

    from rl_assets.core.precision import trainer_precision
    from rl_assets.train.sft import checkpointing_arg

    return RewardConfig(
        output_dir=output_dir,
        max_steps=params.max_steps,
        per_device_train_batch_size=params.batch_size,
        learning_rate=params.learning_rate,
        max_length=params.max_length,
        seed=seed,
        data_seed=seed,
        **trainer_precision("auto", use_cpu),  # TRL's bf16 default fails on CPU: fp32 there, bf16/fp16 on GPUs
        logging_steps=max(1, params.max_steps // 10),
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        **checkpointing_arg(True),  # TRL's default for reward models, under the name that does not warn
        disable_tqdm=not sys.stderr.isatty(),  # a progress bar on a terminal, not a line per redraw in a log
    )


def pair_accuracy(model, tokenizer, pairs: list[dict]) -> float:
    """Share of pairs whose chosen response the model scores above the rejected one."""
    import torch

    from rl_assets.rewards.reward_model import scoring_text

    def scores(key: str) -> torch.Tensor:
        texts = [scoring_text(p.get("prompt", ""), p[key], tokenizer) for p in pairs]
        batch = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
        return model(**batch).logits[:, 0]

    model.eval()
    with torch.inference_mode():
        return (scores("chosen") > scores("rejected")).float().mean().item()


def train_reward_model(params: RewardModelParams, seed: int, output: Path, use_cpu: bool = True) -> dict:
    """Train on `params.preference_data`, save the model folder to `output` atomically; returns metrics."""
    from datasets import Dataset
    from trl import RewardTrainer

    from rl_assets.core.checkpoints import save_checkpoint
    from rl_assets.core.storage import file_hash

    pairs = read_preferences(params.preference_data)
    model, tokenizer = build_base(params, seed)
    before = pair_accuracy(model, tokenizer, pairs)
    model.train()
    columns = ["prompt", "chosen", "rejected"] if "prompt" in pairs[0] else ["chosen", "rejected"]
    dataset = Dataset.from_dict({c: [p.get(c, "") for p in pairs] for c in columns})
    with tempfile.TemporaryDirectory(prefix="rl-assets-reward-model-") as scratch:
        trainer = RewardTrainer(model=model, args=reward_config(params, scratch, seed, use_cpu), train_dataset=dataset,
                                processing_class=tokenizer)
        result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    metrics = {"pairs": len(pairs), "steps": result.global_step, "loss_first": losses[0] if losses else None,
               "loss_last": losses[-1] if losses else None, "pair_accuracy_before": before,
               "pair_accuracy": pair_accuracy(model, tokenizer, pairs)}
    lineage = {"parent": params.name_or_path, "trained_on": {"preference_data": file_hash(params.preference_data)},
               "algorithm": "reward_model", "reward_model": params.model_dump(mode="json"), "metrics": metrics}
    save_checkpoint(model.cpu(), tokenizer, output, lineage)
    return {k: v for k, v in metrics.items() if v is not None}


def run_reward_model(params, round_number: int | None, root: Path, device: str, loaded=None) -> tuple[dict, Path]:
    """The reward_model stage: `train_reward_model` with the run's params, into the experiment's data folder."""
    from rl_assets.core.paths import data_dir, output_path

    if params.reward_model is None:
        raise ValueError("the reward_model stage needs a reward_model section in params")
    path = output_path("reward_model", data_dir(params.experiment, root))
    return train_reward_model(params.reward_model, params.seed, path, use_cpu=not device.startswith("cuda")), path
