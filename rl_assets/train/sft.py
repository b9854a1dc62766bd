"""r00/checkpoint: the base model, warm-started with TRL's SFTTrainer on the reference answers."""

from __future__ import annotations

import sys
import tempfile

import pyarrow as pa

from rl_assets.core.config import SFTParams
from rl_assets.core.precision import trainer_precision
from rl_assets.data.prompts import encode_prompts


def checkpointing_arg(enabled: bool) -> dict:
    """The trainer argument that turns activation checkpointing on or off, under the installed transformers' name.

    transformers renamed `gradient_checkpointing` to `activation_checkpointing` (the old name warns, and
    TRL's configs set it by default); older versions know only the old name.
    """
    from dataclasses import fields

    from transformers import TrainingArguments

    renamed = any(field.name == "activation_checkpointing" for field in fields(TrainingArguments))
    return {"activation_checkpointing" if renamed else "gradient_checkpointing": enabled}


def sft_config(params: SFTParams, output_dir: str, seed: int, use_cpu: bool):
    """Our `sft` section mapped onto TRL's SFTConfig (the only place the two meet)."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir,
        max_steps=params.max_steps,
        per_device_train_batch_size=params.batch_size,
        learning_rate=params.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, params.max_steps // 20),
        weight_decay=0.0,
        seed=seed,
        data_seed=seed,
        **checkpointing_arg(False),  # TRL turns it on by default: slower, and a warm start needs no memory saving
        **trainer_precision("auto", use_cpu),  # TRL's bf16 default fails on CPU: fp32 there, bf16/fp16 on GPUs
        logging_steps=max(1, params.max_steps // 10),
        save_strategy="no",
        report_to=[],
        disable_tqdm=not sys.stderr.isatty(),  # a progress bar on a terminal, not a line per redraw in a log
        dataloader_num_workers=0,
        completion_only_loss=True,
    )


def sft_examples(tokenizer, prompts: list[str], answers: list[str]) -> dict[str, list]:
    """Tokenized (prompt, answer + EOS) pairs: `input_ids` and TRL's `completion_mask` (1 on the answer).

    Tokenized here, not by TRL, so the warm start sees exactly the prompt ids generation feeds
    (`encode_prompts`: one BOS) and the completion as generated tokens after them.
    """
    prompt_ids = encode_prompts(tokenizer, prompts)
    answer_ids = [ids + [tokenizer.eos_token_id] for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]]
    return {"input_ids": [p + a for p, a in zip(prompt_ids, answer_ids)],
            "completion_mask": [[0] * len(p) + [1] * len(a) for p, a in zip(prompt_ids, answer_ids)]}


def demonstration_examples(tokenizer, rows: list[dict], turns: list[str], make_environment, name: str) -> dict[str, list]:
    """Demonstration episodes: each of `turns` (filled from the row) is the policy's, and the environment's real answers come between.

    The same token layout as a sampled episode (rl_assets.rollout.episodes), with the environment's tokens out of the loss.
    """
    from rl_assets.rollout.episodes import observation_ids

    examples = {"input_ids": [], "completion_mask": []}
    eos = tokenizer.eos_token_id
    for row in rows:
        environment = make_environment()
        prompt = encode_prompts(tokenizer, [environment.reset(dict(row))])[0]
        ids, mask = list(prompt), [0] * len(prompt)
        for index, template in enumerate(turns):
            try:
                text = template.format(**row)
            except (KeyError, IndexError) as error:
                raise ValueError(f"sft.demonstration[{index}]: {template!r} names {error}, which prompts rows lack; they have {sorted(row)}") from None
            turn = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if index == len(turns) - 1 else [])
            ids, mask = ids + turn, mask + [1] * len(turn)
            if index < len(turns) - 1:
                observation, _, done = environment.step(text)
                if done or observation is None:
                    raise ValueError(f"sft.demonstration: environment {name!r} ended the episode after turn {index + 1} of {len(turns)} "
                                     f"for prompt_id={row.get('prompt_id')!r} ({text!r})")
                seen = observation_ids(tokenizer, observation, False, None)
                ids, mask = ids + seen, mask + [0] * len(seen)
        examples["input_ids"].append(ids)
        examples["completion_mask"].append(mask)
    return examples


def warm_start(model, tokenizer, prompts: pa.Table, params: SFTParams, seed: int, use_cpu: bool = True,
               episodes: tuple[str, dict] | None = None) -> dict:
    """Fine-tune `model` in place on the `sft` split: (prompt, answer) pairs, or demonstration episodes in `episodes`' environment."""
    from datasets import Dataset
    from trl import SFTTrainer

    train = prompts.filter(pa.compute.equal(prompts["split"], "sft"))
    if train.num_rows == 0:
        raise ValueError("prompts table has no 'sft' split rows; raise prompts.sft_fraction or set sft.enabled: false")
    if params.demonstration:
        from rl_assets.rollout.environments import load_environment

        if episodes is None:
            raise ValueError("sft.demonstration needs rollouts.tools or rollouts.environment: the environment answers between its turns")
        shown = round(params.demonstration_share * train.num_rows)
        examples = demonstration_examples(tokenizer, train.slice(0, shown).to_pylist(), params.demonstration, load_environment(*episodes), episodes[0])
        if shown < train.num_rows:  # the rest answer in one go
            plain = sft_examples(tokenizer, train["prompt"].to_pylist()[shown:], train["answer"].to_pylist()[shown:])
            examples = {key: examples[key] + plain[key] for key in examples}
    else:
        examples = sft_examples(tokenizer, train["prompt"].to_pylist(), train["answer"].to_pylist())
    dataset = Dataset.from_dict(examples)
    with tempfile.TemporaryDirectory(prefix="rl-assets-sft-") as scratch:
        trainer = SFTTrainer(model=model, args=sft_config(params, scratch, seed, use_cpu), train_dataset=dataset, processing_class=tokenizer)
        result = trainer.train()
    model.eval()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {"sft_examples": len(dataset), "sft_steps": result.global_step, "sft_loss_first": losses[0] if losses else None,
            "sft_loss_last": losses[-1] if losses else None, "sft_runtime_s": result.metrics.get("train_runtime")}


def warm_start_with_images(model, tokenizer, processor, prompts: pa.Table, params: SFTParams, seed: int, images_dir) -> dict:
    """Fine-tune a vision-language `model` in place on the `sft` split: each prompt with its images, then its answer.

    TRL's SFTTrainer takes a VLM through a chat-format collator of its own; here the prompts are the exact token ids
    sampling feeds (placeholders expanded by `processor`, `encode_with_images`) with their pixels, and the loss is
    the mean negative log-likelihood of the answer tokens after them, as the text warm start's completion-only loss,
    with its schedule: AdamW, cosine with 5% warm-up, gradients clipped at 1 (TRL's default), `max_steps` batches.
    """
    import time

    import torch
    from transformers import get_scheduler

    from rl_assets.core.logprobs import completion_logprobs
    from rl_assets.core.vision import encode_with_images
    from rl_assets.data.images import open_images

    train = prompts.filter(pa.compute.equal(prompts["split"], "sft"))
    if train.num_rows == 0:
        raise ValueError("prompts table has no 'sft' split rows; raise prompts.sft_fraction or set sft.enabled: false")
    if params.demonstration:
        raise ValueError("sft.demonstration: demonstration episodes with images are not supported yet; leave it empty")
    shown = open_images([ids or [] for ids in train["image_ids"].to_pylist()], images_dir)
    prompt_ids, vision = encode_with_images(processor, train["prompt"].to_pylist(), shown)
    answer_ids = [ids + [tokenizer.eos_token_id] for ids in tokenizer(train["answer"].to_pylist(), add_special_tokens=False)["input_ids"]]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=params.learning_rate, weight_decay=0.0)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=max(1, params.max_steps // 20), num_training_steps=params.max_steps)
    generator, order, losses = torch.Generator().manual_seed(seed), [], []
    started = time.perf_counter()
    model.train()
    for _ in range(params.max_steps):
        while len(order) < params.batch_size:  # epoch after epoch, each in a seeded order
            order += torch.randperm(train.num_rows, generator=generator).tolist()
        rows, order = order[: params.batch_size], order[params.batch_size :]
        logprobs, mask = completion_logprobs(model, [prompt_ids[i] for i in rows], [answer_ids[i] for i in rows], tokenizer.pad_token_id,
                                             vision=[vision[i] for i in rows])
        loss = -(logprobs * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return {"sft_examples": train.num_rows, "sft_steps": params.max_steps, "sft_loss_first": losses[0], "sft_loss_last": losses[-1],
            "sft_runtime_s": round(time.perf_counter() - started, 2)}
