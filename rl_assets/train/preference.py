"""checkpoint (rounds >= 1), from scored groups without policy gradient: iterative DPO and rejection-sampling fine-tuning.

Both read the same stored rollouts and rewards as GRPO. DPO turns each prompt's group into one
preference pair (its best vs its worst completion, when they differ by at least `min_margin`) and
trains with TRL's DPOTrainer against the parent checkpoint as reference. RFT (expert iteration)
keeps each prompt's top-k completions above `min_reward` and trains with TRL's SFTTrainer.

A vision-language policy trains the same way with each row's images (TRL's vision collators): its processor
expands the prompt's placeholders and gives the pixels to both the policy and DPO's reference.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from collections import defaultdict

import pyarrow as pa
import torch

from rl_assets.core.config import TrainParams
from rl_assets.core.precision import trainer_precision
from rl_assets.train.sft import checkpointing_arg
from rl_assets.train.policy_gradient import join_rewards


def _groups(rollouts: pa.Table, rewards: pa.Table) -> dict[str, list[tuple[float, int, str, str, int]]]:
    """prompt_id -> [(reward, sample_idx, prompt, completion, row)] in table order."""
    totals = join_rewards(rollouts, rewards).tolist()
    groups = defaultdict(list)
    for row, (pid, idx, prompt, completion) in enumerate(zip(rollouts["prompt_id"].to_pylist(), rollouts["sample_idx"].to_pylist(),
                                                            rollouts["prompt"].to_pylist(), rollouts["completion"].to_pylist())):
        groups[pid].append((totals[row], idx, prompt, completion, row))
    return groups


def preference_pairs(rollouts: pa.Table, rewards: pa.Table, min_margin: float) -> list[dict]:
    """One {prompt, chosen, rejected, margin, row, rejected_row} per prompt whose best and worst rewards differ by
    >= min_margin (> 0); `row` and `rejected_row`: the table rows of the two completions.

    Ties are broken by the lower sample index, so the pairs are a pure function of the tables.
    """
    pairs = []
    for group in _groups(rollouts, rewards).values():
        best = max(group, key=lambda g: (g[0], -g[1]))
        worst = min(group, key=lambda g: (g[0], g[1]))
        margin = best[0] - worst[0]
        if margin > 0 and margin >= min_margin:
            pairs.append({"prompt": best[2], "chosen": best[3], "rejected": worst[3], "margin": margin, "row": best[4], "rejected_row": worst[4]})
    return pairs


def top_completions(rollouts: pa.Table, rewards: pa.Table, top_k: int, min_reward: float) -> list[dict]:
    """Each prompt's best `top_k` completions with reward >= min_reward, as {prompt, completion, reward, row}."""
    kept = []
    for group in _groups(rollouts, rewards).values():
        ranked = sorted(group, key=lambda g: (-g[0], g[1]))
        kept += [{"prompt": g[2], "completion": g[3], "reward": g[0], "row": g[4]} for g in ranked[:top_k] if g[0] >= min_reward]
    return kept


def with_images(examples: list[dict], rollouts: pa.Table, tokenizer, images: list[list]) -> list[dict]:
    """DPO's or RFT's examples for TRL's vision collators: each with its row's PIL `images`, the prompt starting with the BOS
    its sampled ids start with, each completion ending with the end token it was sampled with (those collators tokenize
    the text without special tokens, and `completion` is decoded without them)."""
    prompt_ids, completion_ids, truncated = (rollouts[name].to_pylist() for name in ("prompt_ids", "completion_ids", "truncated"))
    bos = tokenizer.bos_token

    def ending(row: int) -> str:
        ids = completion_ids[row]
        return tokenizer.convert_ids_to_tokens(ids[-1]) if ids and not truncated[row] else ""

    out = []
    for example in examples:
        row, prompt = example["row"], example["prompt"]
        if bos is not None and prompt_ids[row][:1] == [tokenizer.bos_token_id] and not prompt.startswith(bos):
            prompt = bos + prompt
        rows = {"chosen": row, "rejected": example.get("rejected_row"), "completion": row}
        texts = {key: example[key] + ending(rows[key]) for key in ("chosen", "rejected", "completion") if key in example}
        out.append({"prompt": prompt, **texts, "images": images[row]})
    return out


def _reward_stats(rewards: pa.Table) -> dict:
    """Mean and std of the round's rewards (the pair or top-k selection already matched them to the rollouts)."""
    reward = torch.tensor(rewards["reward"].to_pylist(), dtype=torch.float64)
    return {"reward_mean": reward.mean().item(), "reward_std": reward.std().item() if len(reward) > 1 else 0.0}


def _common(params: TrainParams, output_dir: str, seed: int, use_cpu: bool, batch_size: int) -> dict:
    """Trainer arguments DPO and RFT share, mapped from our `train` section."""
    return dict(output_dir=output_dir, num_train_epochs=params.epochs, per_device_train_batch_size=batch_size,
                gradient_accumulation_steps=params.gradient_accumulation_steps, learning_rate=params.learning_rate,
                lr_scheduler_type=params.lr_scheduler, warmup_steps=params.warmup_ratio,  # < 1: a ratio
                weight_decay=params.weight_decay,
                max_grad_norm=params.max_grad_norm, **checkpointing_arg(params.gradient_checkpointing), seed=seed, data_seed=seed,
                logging_steps=1, save_strategy="no", report_to=[], dataloader_num_workers=0, disable_tqdm=not sys.stderr.isatty(),
                **trainer_precision(params.mixed_precision, use_cpu))


def dpo_config(params: TrainParams, output_dir: str, seed: int, use_cpu: bool):
    """Our `train` section (algorithm: dpo) mapped onto TRL's DPOConfig."""
    from trl import DPOConfig

    return DPOConfig(**_common(params, output_dir, seed, use_cpu, params.dpo.batch_size), beta=params.dpo.beta,
                     loss_type=list(params.dpo.loss_type), loss_weights=params.dpo.loss_weights)


def rft_config(params: TrainParams, output_dir: str, seed: int, use_cpu: bool):
    """Our `train` section (algorithm: rft) mapped onto TRL's SFTConfig."""
    from trl import SFTConfig

    return SFTConfig(**_common(params, output_dir, seed, use_cpu, params.rft.batch_size), completion_only_loss=True)


def _run(trainer, model, extra: dict) -> tuple:
    result = trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.eval()
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    losses = [entry["loss"] for entry in history]
    return model, {**extra, "steps": result.global_step, "loss_first": losses[0] if losses else None,
                   "loss": losses[-1] if losses else None, "train_runtime_s": result.metrics.get("train_runtime"), "history": history}


def train_dpo(model, tokenizer, rollouts: pa.Table, rewards: pa.Table, params: TrainParams, *, seed: int, use_cpu: bool = True,
              images: list[list] | None = None, processor=None):
    """DPO on best-vs-worst pairs of this round's groups; the parent (the model as given) is the reference.
    `images`, `processor`: a vision-language policy's PIL images per row of the table, and its processor."""
    from datasets import Dataset
    from trl import DPOTrainer

    pairs = preference_pairs(rollouts, rewards, params.dpo.min_margin)
    extra = {**_reward_stats(rewards), "pairs": len(pairs), "prompts": len(set(rollouts["prompt_id"].to_pylist())),
             "mean_margin": sum(p["margin"] for p in pairs) / len(pairs) if pairs else 0.0}
    if not pairs:  # every group is flat or too close: nothing to prefer, the parent goes on unchanged
        return model, {**extra, "steps": 0, "loss": None, "history": []}
    examples = with_images(pairs, rollouts, tokenizer, images) if processor is not None else pairs
    dataset = Dataset.from_list([{k: p[k] for k in ("prompt", "chosen", "rejected", "images") if k in p} for p in examples])
    peft = hasattr(model, "peft_config")
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    with tempfile.TemporaryDirectory(prefix="rl-assets-dpo-") as scratch:
        # The parent as it is now is the reference, frozen. With LoRA the parent is base + the adapters trained so far:
        # a merged copy of it (disabling the adapters, TRL's fallback with ref_model=None, would give the r00 base).
        # A 4-bit base cannot be copied and merged exactly, so there TRL copies the adapters into a frozen "ref" adapter.
        reference = None if peft and quantized else copy.deepcopy(model).merge_and_unload() if peft else copy.deepcopy(model)
        if reference is not None:
            reference.eval().requires_grad_(False)
        trainer = DPOTrainer(model=model, ref_model=reference, args=dpo_config(params, scratch, seed, use_cpu), train_dataset=dataset,
                             processing_class=tokenizer if processor is None else processor)
        if peft and reference is None and "ref" not in model.peft_config:
            raise RuntimeError("this TRL/PEFT would take the DPO reference of a 4-bit LoRA parent from the base with adapters disabled "
                               "(r00), not the parent; upgrade trl and peft (peft >= 0.20)")
        trained, metrics = _run(trainer, model, extra)
    if peft and "ref" in trained.peft_config:  # TRL's frozen copy of the parent's adapters: not part of the checkpoint
        trained.delete_adapter("ref")
    return trained, metrics


def train_rft(model, tokenizer, rollouts: pa.Table, rewards: pa.Table, params: TrainParams, *, seed: int, use_cpu: bool = True,
              images: list[list] | None = None, processor=None):
    """Supervised fine-tuning on each prompt's top-k completions above the reward threshold (`images`, `processor`: as
    `train_dpo`'s)."""
    from datasets import Dataset
    from trl import SFTTrainer

    kept = top_completions(rollouts, rewards, params.rft.top_k, params.rft.min_reward)
    extra = {**_reward_stats(rewards), "kept": len(kept), "kept_share": len(kept) / max(rollouts.num_rows, 1),
             "kept_reward_mean": sum(k["reward"] for k in kept) / len(kept) if kept else 0.0}
    if not kept:  # nothing reached the threshold: the parent goes on unchanged
        return model, {**extra, "steps": 0, "loss": None, "history": []}
    examples = with_images(kept, rollouts, tokenizer, images) if processor is not None else kept
    dataset = Dataset.from_list([{k: e[k] for k in ("prompt", "completion", "images") if k in e} for e in examples])
    with tempfile.TemporaryDirectory(prefix="rl-assets-rft-") as scratch:
        trainer = SFTTrainer(model=model, args=rft_config(params, scratch, seed, use_cpu), train_dataset=dataset,
                             processing_class=tokenizer if processor is None else processor)
        return _run(trainer, model, extra)
