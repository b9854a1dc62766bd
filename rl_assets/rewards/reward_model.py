"""A learned reward: the score of any Hugging Face sequence-classification model folder.

The `reward_model` asset trains one (rl_assets/train/reward_model.py); any other folder with a one-label
`AutoModelForSequenceClassification` head and its tokenizer works the same. torch and transformers
are imported on first use, so loading params or the Dagster code location never pays for them.
"""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=4)
def _load(path: str, device: str, weights_mtime: int):
    """(model, tokenizer), cached per folder and weights' modification time, so a retrained model is reloaded."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_scorer(path: str | Path, device: str = "cpu"):
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no reward model folder (config.json); materialize reward_model or point `path` at an HF folder")
    mtime = max(p.stat().st_mtime_ns for p in folder.iterdir())
    return _load(str(folder.resolve()), device, mtime)


def scoring_text(prompt: str, completion: str, tokenizer) -> str:
    """What the model scores: prompt + completion + EOS, as TRL's RewardTrainer saw each pair in training."""
    text = prompt + completion
    return text if tokenizer.eos_token is None or text.endswith(tokenizer.eos_token) else text + tokenizer.eos_token


def reward_model(completions: list[str], prompt: list[str] | None = None, *, path: str, temperature: float = 1.0, batch_size: int = 32,
                 clip: float | None = None, device: str = "cpu", **kwargs) -> list[float]:
    """The model's score of prompt + completion, divided by `temperature`, computed `batch_size` rows at a time.

    The text is scored as the model was trained on it: the prompt followed directly by the
    completion, then EOS. A lower temperature spreads the scores, a higher one flattens them.
    `clip` bounds each score to [-clip, clip] (after the temperature), as PPO setups clip a reward model's
    score so that a few texts unlike its training pairs cannot dominate a batch.
    """
    import torch

    if temperature <= 0:
        raise ValueError(f"reward_model: temperature must be > 0, got {temperature}")
    if clip is not None and clip <= 0:
        raise ValueError(f"reward_model: clip must be > 0, got {clip}")
    model, tokenizer = load_scorer(path, device)
    prompt = prompt if prompt is not None else kwargs.get("prompts")  # our tables say `prompt`, TRL's trainers `prompts`
    texts = [scoring_text(p, c, tokenizer) for p, c in zip(prompt or [""] * len(completions), completions)]
    scores = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True, truncation=True).to(device)
            scores += (model(**batch).logits[:, 0].float() / temperature).tolist()
    return scores if clip is None else [min(max(score, -clip), clip) for score in scores]
