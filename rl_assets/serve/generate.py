"""Sample from any checkpoint: by round, folder, id (or its prefix), or `promoted`.

    rl-assets generate --checkpoint promoted "7*8="
    rl-assets generate --checkpoint r03 --samples 4 "sum of 4 and 5?"
    rl-assets generate --checkpoint r03 --values "sum of 4 and 5?"   (ppo: each token's probability and value)
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rl_assets.core.checkpoints import LINEAGE_FILE
from rl_assets.core.config import PromptsParams
from rl_assets.core.run_params import PromotionParams
from rl_assets.core.paths import DATA, checkpoint_key, output_path
from rl_assets.eval.promotion import models_dir, promoted_path


def resolve_checkpoint(name: str, promotion: PromotionParams, root: Path = Path("."), data: Path | None = None) -> Path:
    """A checkpoint folder from `promoted`, `r03`, `r03/checkpoint`, a folder path, or a checkpoint id (prefix).

    Rounds and ids are looked up in the experiment's data folder `data` (paths.data_dir; default ROOT/data)."""
    data = root / DATA if data is None else data
    if name == "promoted":
        path = promoted_path(promotion, root)
        if not (path / LINEAGE_FILE).is_file():
            raise FileNotFoundError(f"{path}: no promoted model yet (the promoted_model asset writes it)")
        return path
    match = re.fullmatch(r"r(\d{1,2})(/checkpoint)?", name)
    path = output_path(checkpoint_key(int(match.group(1))), data) if match else root / name
    if (path / LINEAGE_FILE).is_file():
        return path
    if match:
        raise FileNotFoundError(f"{path}: no checkpoint there")
    cards = [*data.glob(f"r*/checkpoint/{LINEAGE_FILE}"), *(models_dir(promotion, root) / "versions").glob(f"*/{LINEAGE_FILE}")]
    found = {json.loads(card.read_text())["checkpoint_id"]: card.parent for card in cards}
    found = {checkpoint_id: folder for checkpoint_id, folder in found.items() if checkpoint_id.startswith(name)}
    if len(found) == 1:
        return next(iter(found.values()))
    raise FileNotFoundError(f"{name!r}: " + (f"{len(found)} checkpoint ids start with it" if found else "no checkpoint folder or id"))


def critic_of(checkpoint: Path, data: Path) -> Path:
    """The value model trained in the round that made `checkpoint` (rNN/critic; a promoted model's by its round)."""
    card = json.loads((checkpoint / LINEAGE_FILE).read_text())
    round_number = card.get("round", 0)
    # r00 (SFT) trains no value model, so no stage writes r00/critic: name the folder it would be
    path = output_path(f"r{round_number:02d}/critic", data) if round_number >= 1 else data / "r00" / "critic"
    if round_number < 1 or not (path / LINEAGE_FILE).is_file():
        raise FileNotFoundError(f"{path}: no value model for {checkpoint} (round {round_number}); train.algorithm ppo writes one each "
                                "round, or name one with --critic")
    return path


def sample(path: Path, prompts: list[str], samples: int, temperature: float, max_new_tokens: int, seed: int,
           rendering: PromptsParams | None = None, critic: Path | None = None, images: list[Path] = ()) -> list[dict]:
    """`samples` completions per prompt (greedy when temperature is 0), each prompt rendered as training rendered problems
    (`rendering`: the params' prompts section, its template and chat template) unless it is None (the text as given).
    `images`: image files every prompt shows, to a vision-language policy (a placeholder each, before the text).

    With a value model (`critic`, PPO's rNN/critic) each row also has its tokens, each token's probability under the policy
    (at the sampling temperature) and the value model's estimate before it; `predicted_reward` is the estimate at the
    prompt, before any completion token: what the value model expects this policy to score."""
    from rl_assets.core.policy import load_policy, pick_device
    from rl_assets.data.prompts import render
    from rl_assets.rollout.generation import generate

    device = pick_device("auto")
    model, tokenizer = load_policy(path, device)
    shown, processor = None, None
    if images:
        shown, processor = policy_images(path, model, tokenizer, images)
    if rendering is not None:
        texts = [render(prompt, rendering, tokenizer, len(images)) for prompt in prompts]
    else:  # as given; a VLM still needs a placeholder per image
        texts = [prompt if not images or tokenizer.image_token in prompt else tokenizer.image_token * len(images) + prompt for prompt in prompts]
    out = generate(model, tokenizer, texts, samples, greedy=temperature == 0, temperature=temperature or 1.0,
                   max_new_tokens=max_new_tokens, seed=seed, images=[shown] * len(texts) if shown else None, processor=processor)
    expanded = [p for p in prompts for _ in range(samples)]
    rows = [{"prompt": p, "completion": t, "truncated": tr} for p, t, tr in zip(expanded, out.texts, out.truncated)]
    if critic is None:
        return rows
    from rl_assets.train.critic import load_critic

    if out.vision is not None:
        raise ValueError("--values with images: a value model reads text only")
    scored = token_scores(model, tokenizer, out.prompt_ids, out.completion_ids, temperature or 1.0, load_critic(critic, device))
    for row, scores in zip(rows, scored):
        row.update(tokens=scores["tokens"], token_probabilities=[round(math.exp(lp), 4) for lp in scores["token_logprobs"]],
                   values=[round(v, 4) for v in scores["values"]], predicted_reward=_rounded(scores["predicted_reward"]))
    return rows


def policy_images(path: Path, model, tokenizer, files: list[Path]) -> tuple[list, object]:
    """(PIL images, processor) for a vision-language checkpoint; ValueError for a text one or an unreadable file."""
    from rl_assets.core.vision import is_vision_model, load_processor
    from rl_assets.data.images import decoded_image

    if not is_vision_model(model.config):
        raise ValueError(f"{path}: a text policy ({type(model).__name__}) cannot read images; --image needs a vision-language checkpoint")
    shown = []
    for file in files:
        try:
            shown.append(decoded_image(Path(file).read_bytes(), str(file)))
        except FileNotFoundError:
            raise ValueError(f"image file not found: {file}") from None
    return shown, load_processor(path, tokenizer, model.config)


def token_scores(model, tokenizer, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float,
                 critic=None, vision: list | None = None) -> list[dict]:
    """Per completion: its tokens (decoded one by one), each token's log-prob under `model` at `temperature`, and with a value
    model (`critic`) its estimate before each token and `predicted_reward`, the estimate before the first (what it expects
    this policy to score from the prompt alone; None for an empty completion)."""
    import torch

    from rl_assets.core.logprobs import completion_logprobs, completion_values

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        logprobs, _ = completion_logprobs(model, prompt_ids, completion_ids, pad_id, temperature, vision=vision)
        values = completion_values(critic, prompt_ids, completion_ids, pad_id, vision=vision)[0] if critic is not None else None
    out = []
    for i, ids in enumerate(completion_ids):
        n = len(ids)
        row = {"tokens": [tokenizer.decode([t]) for t in ids], "token_logprobs": logprobs[i, :n].tolist()}
        if values is not None:
            row.update(values=values[i, :n].tolist(), predicted_reward=values[i, 0].item() if n else None)
        out.append(row)
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
