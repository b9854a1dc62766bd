"""The compute stages: each reads its inputs from the experiment's data folder (paths.data_dir), writes its output atomically and returns the metadata a user looks at.

`run_stage` runs one; `rl_assets.run.resident` runs several in one process with the same `Loaded`
models; `rl_assets.run.step` is the command line. Every stage seeds torch from params before it
starts, so what it computes depends on its inputs, never on what the process ran before.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import torch
import torch.distributed as dist

from rl_assets.core.checkpoints import checkpoint_id, read_lineage, save_checkpoint, save_master_weights
from rl_assets.core.algorithms import algorithm
from rl_assets.core.config import Params
from rl_assets.core.graph import critic_parent, sampling_checkpoint
from rl_assets.core.paths import EVALUATION_METRICS, EVALUATION_PLOT, IMAGES, checkpoint_key, data_dir, output_path, round_prefix, train_state_dir
from rl_assets.core.precision import compute_autocast, resolve_mixed_precision, weights_dtype
from rl_assets.eval.reports import accuracy_plot, episodes_markdown, gain_text, markdown_table
from rl_assets.core.schemas import EVALUATION, ROLLOUTS, read_table, table_lineage, write_table
from rl_assets.core.stage_table import COMPUTE_STAGES, ROUND_STAGES, STAGE_TABLE, runner, stage_lineage
from rl_assets.core.storage import file_hash

if TYPE_CHECKING:  # loaded.py is declared code of every compute stage (rl_assets.core.stage_table)
    from rl_assets.run.loaded import Loaded



def run_sft(params: Params, round_number: int | None, root: Path, device: str, loaded: Loaded) -> tuple[dict, Path]:
    """r00/checkpoint: build or load the base model, warm-start it with SFT when enabled, save it."""
    data = data_dir(params.experiment, root)
    from rl_assets.core.policy import load_base_model, load_policy
    from rl_assets.core.tokenizer import saved_processor
    from rl_assets.core.vision import folder_is_vision_model
    from rl_assets.data.prompts import require_text_prompts
    from rl_assets.eval.promotion import warm_start_path
    from rl_assets.train.sft import warm_start

    prompts_path = output_path("prompts", data)
    prompts = read_table(prompts_path, "prompts")
    reads_images = params.model.vision is not None or folder_is_vision_model(params.model.name_or_path)
    require_text_prompts(prompts, params.model.name_or_path, reads_images)
    promoted = warm_start_path(params.promotion, root)
    if promoted is not None:  # the promoted model already went through SFT and RL: continue from it as is
        model, tokenizer = load_policy(promoted)
        metrics, parent, trained_on, algorithm = {}, checkpoint_id(promoted), {}, "promoted"
    else:
        model, tokenizer = load_base_model(params.model, params.seed)
        if params.sft.enabled and reads_images and "image_ids" in prompts.column_names and any(prompts["image_ids"].to_pylist()):
            from rl_assets.core.vision import load_processor
            from rl_assets.train.sft import warm_start_with_images

            folder = Path(params.model.name_or_path)
            processor = load_processor(folder if folder.is_dir() else None, tokenizer, model.config)
            metrics = warm_start_with_images(model.to(device), tokenizer, processor, prompts, params.sft, params.seed, data / IMAGES)
        else:
            metrics = (warm_start(model, tokenizer, prompts, params.sft, params.seed, use_cpu=device == "cpu", episodes=params.rollouts.episodes)
                       if params.sft.enabled else {})
        parent, trained_on = params.model.name_or_path, {"prompts": file_hash(prompts_path)} if params.sft.enabled else {}
        algorithm = "sft" if params.sft.enabled else "none"
    from rl_assets.core.import_model import base_model_id

    lineage = {"round": 0, "parent": parent, "base_model_id": base_model_id(params.model.name_or_path), "trained_on": trained_on,
               "algorithm": algorithm,
               "params_hash": params.section_hash("seed", "model", "sft"), **stage_lineage("sft", params),
               "metrics": metrics, "num_parameters": sum(p.numel() for p in model.parameters())}
    path = output_path(checkpoint_key(0), data)
    if dist.is_initialized() and dist.get_rank() != 0:  # rank 0 saves and reports
        return {}, path
    save_checkpoint(model, tokenizer, path, lineage, processor=saved_processor(promoted or params.model.name_or_path))
    return {"parameters": lineage["num_parameters"], **{k: v for k, v in metrics.items() if v is not None}}, output_path(checkpoint_key(0), data)


def precision(params: Params, device: str) -> str:
    """The one precision mode of every policy forward pass: the trainer's (see precision.py)."""
    return resolve_mixed_precision(params.train.mixed_precision, device)


def selection_history(params: Params, round_number: int, root: Path) -> tuple[dict, dict[str, str]] | None:
    """The pass counts that `rollouts.selection` chooses round `round_number`'s prompts by, and the rewards tables they
    come from with their hashes: this experiment's rounds before it, and every round of `selection.experiments`.
    None for a uniform selection, which reads no history."""
    selection = params.rollouts.selection
    if selection.kind == "uniform":
        return None
    from rl_assets.rollout.selection import pass_counts

    data = data_dir(params.experiment, root)
    paths = [output_path(f"{round_prefix(n)}/rewards", data) for n in range(1, round_number)]
    for name in selection.experiments:
        found = sorted(data_dir(name, root).glob("r[0-9][0-9]/rewards.parquet"))
        if not found:
            raise FileNotFoundError(f"rollouts.selection.experiments: experiment {name!r} has no rewards tables under {data_dir(name, root)}")
        paths += found
    correctness = params.evaluation.correctness or params.rewards.functions[0].score_name
    counts = pass_counts([read_table(path, "rewards") for path in paths], correctness)
    return counts, {path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix(): file_hash(path) for path in paths}


def run_rollouts(params: Params, round_number: int | None, root: Path, device: str, loaded: Loaded) -> tuple[dict, Path]:
    """rNN/rollouts: G samples for each of B train prompts from the previous round's checkpoint (graph.sampling_checkpoint:
    an older one with rollouts.staleness)."""
    data = data_dir(params.experiment, root)
    from rl_assets.core.vision import folder_is_vision_model, is_vision_model, load_processor
    from rl_assets.data.prompts import require_text_prompts
    from rl_assets.rollout.sampling import sample_rollouts
    from rl_assets.rollout.selection import selection_metadata

    policy_path = output_path(sampling_checkpoint(params, round_number), data)
    prompts_path = output_path("prompts", data)
    prompts = read_table(prompts_path, "prompts")
    require_text_prompts(prompts, params.model.name_or_path, reads_images=folder_is_vision_model(policy_path))
    mode = precision(params, device)
    model, tokenizer = loaded.policy(policy_path, device, weights_dtype(mode), chain=True)
    started = time.perf_counter()
    processor = load_processor(policy_path, tokenizer, model.config) if is_vision_model(model.config) else None
    history = selection_history(params, round_number, root)
    table = sample_rollouts(model, tokenizer, prompts, params.rollouts, round_number=round_number,
                            seed=params.seed, policy_id=checkpoint_id(policy_path), prompts_hash=file_hash(prompts_path),
                            model_path=str(policy_path), autocast=compute_autocast(mode, device), loaded=loaded,
                            images_dir=data / IMAGES, processor=processor, pass_counts=history[0] if history else None)
    elapsed = time.perf_counter() - started
    lineage = stage_lineage("rollouts", params)
    if history:  # the rewards tables whose pass rates chose the prompts, as they were
        lineage["selection_history"] = history[1]
    write_table(table, output_path(f"{round_prefix(round_number)}/rollouts", data), ROLLOUTS, "rollouts", lineage=lineage)
    lengths = [len(ids) for ids in table["completion_ids"].to_pylist()]
    group = params.rollouts.samples_per_prompt  # two samples each of the first four prompts: several pictures, and how samples differ
    shown_rows = [row for row in (p * group + s for p in range(8) for s in range(min(group, 2))) if row < table.num_rows][:8]
    picked = table.take(shown_rows)
    samples = [[p, c, a] for p, c, a in zip(picked["prompt"].to_pylist(), picked["completion"].to_pylist(), picked["answer"].to_pylist())]
    metadata = {"rows": table.num_rows, "prompts": table.num_rows // params.rollouts.samples_per_prompt,
                "mean_completion_tokens": sum(lengths) / len(lengths), "truncated_share": sum(table["truncated"].to_pylist()) / table.num_rows,
                "completion_tokens_per_second": sum(lengths) / elapsed if elapsed else 0.0,  # sampling plus the log-prob pass
                **({"selection": params.rollouts.selection.kind, **{k: v for k, v in selection_metadata(table, params.rollouts.samples_per_prompt).items()
                                                                     if v is not None}} if history else {}),
                "samples": {"type": "md", "raw_value": markdown_table(["prompt", "completion", "answer"], samples)}}
    shown = picked["image_ids"].to_pylist()
    if any(shown):  # what the policy saw beside what it wrote: each sample's pictures, as `rl-assets serve` answers for them
        from rl_assets.data.images import IMAGES_URL, image_markdown

        base = os.environ.get("RL_ASSETS_IMAGES_URL", IMAGES_URL)
        rows = [[" ".join(image_markdown(data / IMAGES, i, base) for i in ids), prompt.replace("<", "&lt;"), completion, answer]  # a placeholder is no HTML tag
                for ids, (prompt, completion, answer) in zip(shown, samples)]
        metadata["samples"]["raw_value"] = markdown_table(["image", "prompt", "completion", "answer"], rows)
    if params.rollouts.episodes is not None:
        calls = table["tool_calls"].to_pylist()
        made = [call for episode in calls for call in episode]
        metadata.update(mean_turns=sum(table["num_turns"].to_pylist()) / table.num_rows, tool_call_rate=sum(map(bool, calls)) / table.num_rows,
                        tool_calls=len(made), tool_error_share=sum(c["error"] is not None for c in made) / len(made) if made else 0.0,
                        policy_token_share=sum(map(sum, table["completion_mask"].to_pylist())) / max(sum(lengths), 1),
                        episodes={"type": "md", "raw_value": episodes_markdown(table.to_pylist())})
    return metadata, output_path(f"{round_prefix(round_number)}/rollouts", data)


def run_rewards(params: Params, round_number: int | None, root: Path, device: str, loaded: Loaded) -> tuple[dict, Path]:
    """rNN/rewards: every rollout of the round scored by the configured reward functions (rescoring never resamples)."""
    data = data_dir(params.experiment, root)
    from rl_assets.rewards import score_rollouts, summarize_rewards

    source = output_path(f"{round_prefix(round_number)}/rollouts", data)
    table = score_rollouts(read_table(source, "rollouts"), params.rewards, file_hash(source))
    path = write_table(table, output_path(f"{round_prefix(round_number)}/rewards", data), table.schema, "rewards",  # keeps each score's weight
                       lineage=stage_lineage("rewards", params))
    return {"path": str(path), **summarize_rewards(table, params.rollouts.samples_per_prompt)}, path


def round_images(config, tokenizer, saved_processor, table: pa.Table, data: Path) -> tuple[list[list] | None, object, list | None]:
    """(each row's PIL images, read from <data>/images; the policy's processor: `saved_processor`, the one saved with it, else
    the embedded VLM's; each row's pixel inputs) for a vision-language policy whose table shows images; else (None, None, None).
    The caller loads the saved processor, as run_train passes it on to the checkpoint too."""
    from rl_assets.core.vision import is_vision_model, pixel_inputs, tiny_processor

    if not is_vision_model(config) or "image_ids" not in table.column_names or not any(table["image_ids"].to_pylist()):
        return None, None, None
    from rl_assets.data.images import open_images

    images = open_images(table["image_ids"].to_pylist(), data / IMAGES)
    processor = saved_processor or tiny_processor(tokenizer, config)
    return images, processor, pixel_inputs(processor, images)


def run_train(params: Params, round_number: int | None, root: Path, device: str, loaded: Loaded) -> tuple[dict, Path]:
    """rNN/checkpoint: the configured algorithm on the round's stored rollouts and rewards, starting from rNN-1."""
    data = data_dir(params.experiment, root)
    from rl_assets.core.policy import load_trainable_policy
    from rl_assets.core.tokenizer import saved_processor
    from rl_assets.core.vision import freeze_vision
    from rl_assets.train.train_state import fingerprint, save_carried_optimizer

    prefix = round_prefix(round_number)
    parent, base = output_path(checkpoint_key(round_number - 1), data), output_path(checkpoint_key(0), data)
    rollouts_path, rewards_path = output_path(f"{prefix}/rollouts", data), output_path(f"{prefix}/rewards", data)
    rollouts, rewards = read_table(rollouts_path, "rollouts"), read_table(rewards_path, "rewards")
    trained_on = {"rollouts": file_hash(rollouts_path), "rewards": file_hash(rewards_path)}
    world = dist.get_world_size() if dist.is_initialized() else 1
    train, dtype = params.train, weights_dtype(precision(params, device))
    # Kept in memory after the round only when it equals what loading the saved folder gives (see loaded.py).
    keep = world == 1 and not train.lora.enabled and train.algorithm not in ("dpo", "rft")
    model, tokenizer = (loaded.take_policy(parent, device, dtype) if keep else
                        load_trainable_policy(parent, train.lora, base, device, dtype=dtype, freeze_vision=train.freeze_vision))
    if keep and train.freeze_vision:
        freeze_vision(model)
    seed = params.seed * 1000 + round_number
    ref_model = optimizer_state = None
    kept_processor = saved_processor(parent)  # a hub VLM's, passed on to the checkpoint
    images, processor, vision = round_images(model.config, tokenizer, kept_processor, rollouts, data)
    trainer = algorithm(train.algorithm)
    if trainer.trainer != "policy_gradient":
        from rl_assets.train.preference import train_dpo, train_rft

        run = {"dpo": train_dpo, "rft": train_rft}[trainer.trainer]
        model, metrics = run(model, tokenizer, rollouts, rewards, train, seed=seed, use_cpu=not device.startswith("cuda"), images=images,
                             processor=processor)
        history = metrics.pop("history")
    else:
        from rl_assets.train.policy_gradient import join_rewards, loss_beta, rows_trained_on, table_group_size, train_on_rollouts
        from rl_assets.train.staleness import with_proximal_logprobs

        token_advantages = None
        if trainer.value_model:  # GAE's advantages from the parent value model (the critic stage trains the next one)
            targets, critic, critic_path, _ = ppo_round_targets(params, round_number, data, device, loaded, rollouts, rewards, tokenizer.pad_token_id,
                                                                vision=vision)
            token_advantages, trained_on["critic"] = targets.advantages, checkpoint_id(critic_path)
            del critic, targets
        ref_model = loaded.reference(base, device) if loss_beta(train) > 0 else None
        # rollouts.staleness: rows an older checkpoint sampled are trained against the parent's own log-probs, weighted
        group_size = table_group_size(rollouts, params.rollouts.samples_per_prompt)
        trained = rows_trained_on(join_rewards(rollouts, rewards), train, group_size, token_advantages)
        rollouts, stale_rows = with_proximal_logprobs(model, rollouts, checkpoint_id(parent), tokenizer.pad_token_id, params.rollouts.temperature,
                                                      params.rollouts.logprob_batch_size, compute_autocast(precision(params, device), device), vision,
                                                      trained)
        state = fingerprint(train.model_dump(mode="json"), inputs=trained_on, parent=checkpoint_id(parent), world_size=world, seed=seed,
                            sharding=params.compute.sharding)
        carried = parent_moments(parent, data, device) if train.carry_optimizer_state else None
        if trainer.value_model and round_number <= train.ppo.critic_warmup_rounds:  # only the value model learns this round
            scores = join_rewards(rollouts, rewards)  # the round's reward curve goes on through the warm-up
            metrics = {"steps": 0, "critic_warmup": True, "reward_mean": scores.mean().item(),
                       "reward_std": scores.std().item() if scores.numel() > 1 else 0.0}
            history, optimizer_state = [], carried
        else:
            from rl_assets.run.hardware import BusyShare, training_utilisation

            with BusyShare(device) as busy:  # the training loop's own, apart from loading and saving
                model, metrics, history, optimizer_state = train_on_rollouts(
                    model, rollouts, rewards, train, group_size=group_size,
                    temperature=params.rollouts.temperature,
                    pad_id=tokenizer.pad_token_id, seed=seed, max_new_tokens=params.rollouts.max_new_tokens, device=device, ref_model=ref_model,
                    state_dir=train_state_dir(round_number, data), fingerprint=state,
                    optimizer_state=carried, token_advantages=token_advantages, shard=params.compute.sharding == "fsdp", vision=vision)
            metrics["stale_rows"] = stale_rows
            if model is not None:  # rank 0 (the others hold shards only)
                metrics.update(training_utilisation(model, metrics.get("sequence_tokens_per_second", 0.0), world, device, params.compute.peak_tflops))
                if "busy_share" in busy.result():  # the loop's own: the step's busy_share (run_stage) also counts loading and saving
                    metrics["loop_busy_share"] = busy.result()["busy_share"]
    if dist.is_initialized() and dist.get_rank() != 0:  # rank 0 saves and reports
        return {}, output_path(checkpoint_key(round_number), data)
    from rl_assets.train.policy_gradient import reference_kl

    metrics["kl"] = reference_kl(model.to(device), loaded.reference(base, device), rollouts, pad_id=tokenizer.pad_token_id,
                                 temperature=params.rollouts.temperature, rows=params.guards.kl_rows, vision=vision)
    metrics["kl_rows"] = min(params.guards.kl_rows, rollouts.num_rows)
    if not train.beta > 0 and not loaded.reference_fits(device):  # only this metric needs it: kept where memory is plenty
        loaded.drop_reference()
    carries = optimizer_state is not None and train.carry_optimizer_state
    lineage = {"round": round_number, "parent": checkpoint_id(parent), "parent_path": str(parent.relative_to(root)),
               "carries_optimizer_state": carries,  # its moments are in <data>/run_state: the next round must continue them
               "trained_on": trained_on, "sampled_by": sorted(set(rollouts["policy_id"].to_pylist())),  # the rollouts' samplers
               "algorithm": train.algorithm, "train": train.model_dump(mode="json"),
               "params_hash": params.section_hash("seed", "train"), "world_size": world, "metrics": metrics, "history": history,
               **stage_lineage("train", params)}
    for table_path in (rollouts_path, rewards_path):  # the code that sampled and scored what this round trained on
        lineage["code"].update(table_lineage(table_path).get("code", {}))
    if train.lora.enabled and train.lora.merge and hasattr(model, "peft_config"):
        model = model.merge_and_unload()  # the full weights are saved, and a compact checkpoint's float32 copy is of them
    compact = _compact_dtype(train, model)
    if compact is not None:  # the folder is rounded; the float32 weights the next round continues from are run state
        lineage.update(checkpoint_dtype=train.checkpoint_dtype, master_weights="float32")
    saved_id = save_checkpoint(model, tokenizer, output_path(checkpoint_key(round_number), data), lineage, lora=train.lora, dtype=compact,
                               processor=kept_processor)
    if compact is not None:  # this round's and its parent's (a rerun of this round continues from the parent's)
        save_master_weights(model, saved_id, data, keep=frozenset({checkpoint_id(parent)}))
    if carries:  # a later process (or a rerun after a crash) reads it; the moments of checkpoints no longer on disk go
        save_carried_optimizer(optimizer_state, saved_id, round_number, data, keep=current_checkpoint_ids(params.rounds, data))
    del optimizer_state  # twice the weights' size: read back from disk by the next round, not held through its sampling
    if keep:
        loaded.keep_policy(model, tokenizer, saved_id, device, dtype, compact=compact is not None)
    shutil.rmtree(train_state_dir(round_number, data), ignore_errors=True)  # the round is done; its resume points are not needed
    return metrics, output_path(checkpoint_key(round_number), data)


def _compact_dtype(train, model) -> torch.dtype | None:
    """The dtype a round's full weights are saved rounded to (train.checkpoint_dtype), None when saved as they are: float32
    asked, LoRA adapters saved alone, or weights already in that dtype (pure_bf16)."""
    if train.checkpoint_dtype == "float32" or (train.lora.enabled and not train.lora.merge):
        return None
    wanted = getattr(torch, train.checkpoint_dtype)
    return wanted if any(p.dtype != wanted for p in model.parameters() if p.is_floating_point()) else None


def critic_parent_folder(params: Params, round_number: int, data: Path) -> tuple[Path, str | None]:
    """(folder, how to start from it) of the value model that round `round_number`'s PPO outputs read (graph.critic_parent): a
    critic as saved, r00's body with a zero head ("policy"), or the reward model, head included ("reward_model")."""
    key = critic_parent(params, round_number)
    start = None if key.endswith("/critic") else "policy" if key == checkpoint_key(0) else "reward_model"
    return output_path(key, data), start


def ppo_round_targets(params: Params, round_number: int, data: Path, device: str, loaded: Loaded, rollouts: pa.Table, rewards: pa.Table,
                      pad_id: int, take: bool = False, vision: list | None = None):
    """(targets, parent critic, its folder, how it starts): the parent value model's view of the round's table, as both PPO
    outputs read it (how it starts: `critic_parent_folder`'s, None from a saved value model).

    `take`: the critic stage trains the parent in place (the train stage, which runs first in a round, only reads it).
    `vision`: each row's pixel inputs (a vision-language policy; its value model reads them too).
    """
    from rl_assets.train.critic import ppo_targets
    from rl_assets.train.policy_gradient import join_rewards, kept_rows, policy_masks

    path, start = critic_parent_folder(params, round_number, data)
    if vision is not None and start == "reward_model":
        raise ValueError("train.ppo.critic_init: reward_model reads text only, and the policy reads images; use critic_init: policy")
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: the value model round {round_number} starts from is missing; run its round (or the reward model) first")
    lora = params.train.lora if params.train.ppo.critic_lora else None  # trainable adapters in both stages: the one loaded is trained
    critic = (loaded.take_critic if take else loaded.critic)(path, device, start, lora)
    mask = [[float(m) * k for m in row] for row, k in zip(policy_masks(rollouts), kept_rows(rollouts, params.train).tolist())]
    kl_in_reward = params.train.ppo.kl_in_reward and params.train.beta > 0
    targets = ppo_targets(critic, rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist(), mask, join_rewards(rollouts, rewards),
                          params.train, pad_id=pad_id, batch_size=params.rollouts.logprob_batch_size,
                          stored_logprobs=rollouts["logprobs"].to_pylist() if kl_in_reward else None,
                          ref_model=loaded.reference(output_path(checkpoint_key(0), data), device) if kl_in_reward else None,
                          temperature=params.rollouts.temperature, vision=vision)
    return targets, critic, path, start


def run_critic(params: Params, round_number: int | None, root: Path, device: str, loaded: Loaded) -> tuple[dict, Path]:
    """rNN/critic: the value model of PPO, its parent fitted to this round's returns (rl_assets.train.critic)."""
    from transformers import AutoConfig, AutoTokenizer

    from rl_assets.core.tokenizer import saved_processor
    from rl_assets.train.critic import CRITIC_KIND, train_critic

    data, prefix = data_dir(params.experiment, root), round_prefix(round_number)
    rollouts_path, rewards_path = output_path(f"{prefix}/rollouts", data), output_path(f"{prefix}/rewards", data)
    rollouts, rewards = read_table(rollouts_path, "rollouts"), read_table(rewards_path, "rewards")
    base = output_path(checkpoint_key(0), data)
    tokenizer = AutoTokenizer.from_pretrained(base)
    _, _, vision = round_images(AutoConfig.from_pretrained(base), tokenizer, saved_processor(base), rollouts, data)  # the pixels the policy saw
    targets, critic, parent, start = ppo_round_targets(params, round_number, data, device, loaded, rollouts, rewards, tokenizer.pad_token_id,
                                                       take=True, vision=vision)
    from rl_assets.train.train_state import fingerprint

    seed, world = params.seed * 1000 + round_number, dist.get_world_size() if dist.is_initialized() else 1
    inputs = {"rollouts": file_hash(rollouts_path), "rewards": file_hash(rewards_path)}
    state = fingerprint(params.train.model_dump(mode="json"), inputs=inputs, parent=checkpoint_id(parent), world_size=world, seed=seed)
    critic, metrics, history = train_critic(critic, rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist(), targets,
                                            params.train, pad_id=tokenizer.pad_token_id, seed=seed, device=device,
                                            state_dir=train_state_dir(round_number, data, "critic"), fingerprint=state, vision=vision)
    if dist.is_initialized() and dist.get_rank() != 0:  # rank 0 saves and reports
        return {}, output_path(f"{round_prefix(round_number)}/critic", data)
    start = start or read_lineage(parent).get("start", "policy")  # how the chain began
    lineage = {"round": round_number, "kind": CRITIC_KIND, "parent": checkpoint_id(parent), "parent_path": str(parent.relative_to(root)),
               "start": start, "lora": params.train.ppo.critic_lora,
               "trained_on": inputs, "train": params.train.model_dump(mode="json"),
               "params_hash": params.section_hash("seed", "train"), "metrics": metrics, "history": history, **stage_lineage("critic", params)}
    for table_path in (rollouts_path, rewards_path):
        lineage["code"].update(table_lineage(table_path).get("code", {}))
    saved_id = save_checkpoint(critic, tokenizer, output_path(f"{prefix}/critic", data), lineage)
    if not (dist.is_initialized() and dist.get_world_size() > 1):  # under torchrun rank 0's copy would be the only one kept
        loaded.keep_critic(critic, saved_id, device)
    shutil.rmtree(train_state_dir(round_number, data, "critic"), ignore_errors=True)  # saved: its resume points are not needed
    return metrics, output_path(f"{prefix}/critic", data)


def parent_moments(parent: Path, data: Path, device: str) -> dict | None:
    """The AdamW moments `parent` was saved with (None when it carried none: r00, DPO/RFT, carry off);
    raises MissingRunState when it did and they are gone: training on without them would make another model."""
    from rl_assets.train.train_state import MissingRunState, carried_optimizer_path, load_carried_optimizer

    card = read_lineage(parent)
    moments = load_carried_optimizer(card["checkpoint_id"], data, device)
    if moments is None and card.get("carries_optimizer_state"):
        raise MissingRunState(
            f"{parent} was trained with train.carry_optimizer_state and its AdamW moments are gone "
            f"({carried_optimizer_path(card['checkpoint_id'], data)}): the next round would train without them and make another "
            f"model. `rl-assets run` trains that round again to recreate them; "
            f"--set train.carry_optimizer_state=false starts every round from a fresh optimizer instead.")
    return moments


def current_checkpoint_ids(rounds: int, data: Path) -> frozenset[str]:
    """The ids of the checkpoints r00..rR on disk now (whose carried moments a later round may need)."""
    paths = (output_path(checkpoint_key(n), data) for n in range(rounds + 1))
    return frozenset(checkpoint_id(p) for p in paths if (p / "lineage.json").is_file())


def with_heldout(metadata: dict, checkpoint: Path, params: Params, root: Path, device: str, loaded: Loaded) -> dict:
    """The checkpoint's held-out accuracy added to its own materialization (the evaluation asset reuses the result).

    Called here, not by run_sft/run_train: the checkpoint does not depend on the evaluation code or the rewards
    (their declared code in rl_assets.core.stage_table), so editing a reward module does not make the checkpoints stale.
    """
    from rl_assets.eval.evaluation import evaluated, heldout_metadata

    if dist.is_initialized() and dist.get_rank() != 0:
        return metadata
    mode = precision(params, device)
    started = time.perf_counter()
    try:
        rows, reused = evaluated(checkpoint, params, data_dir(params.experiment, root), device, mode, load=lambda: loaded.policy(checkpoint, device, weights_dtype(mode)))
    except Exception as error:  # e.g. a reward that raises: its own asset fails with it; the checkpoint is fine
        print(f"warning: held-out evaluation of {checkpoint} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return {**metadata, "heldout_error": f"{type(error).__name__}: {error}"[:500]}
    # what the evaluation added to this step's time (0 when an earlier evaluation of the same checkpoint was reused)
    return {**metadata, **heldout_metadata(rows), "heldout_seconds": 0.0 if reused else round(time.perf_counter() - started, 2)}


def run_evaluation(params: Params, round_number: int | None, root: Path, device: str, loaded: Loaded) -> tuple[dict, Path]:
    """evaluation: every checkpoint r00..rR on the held-out prompts, greedy and sampled."""
    data = data_dir(params.experiment, root)
    from rl_assets.eval.evaluation import evaluated
    from rl_assets.eval.stats import paired_difference
    from rl_assets.eval.curves import write_round_plots

    report, examples, reused = [], [], 0
    for round_number in range(params.rounds + 1):
        path = output_path(checkpoint_key(round_number), data)
        rows, was_done = evaluated(path, params, data, device, precision(params, device))  # usually done by the step that made it
        reused += was_done
        for row in rows:
            examples += [[checkpoint_key(round_number), row["mode"], *e] for e in row.pop("examples")[:3]]
            report.append({"checkpoint": checkpoint_key(round_number), "checkpoint_id": checkpoint_id(path), **row})
    first = {r["mode"]: r for r in report if r["checkpoint"] == checkpoint_key(0)}
    for row in report:
        base = first.get(row["mode"])
        row["gain"] = row["accuracy"] - base["accuracy"] if base else None
        if base and row is not base and base.get("correct_per_prompt") and row.get("correct_per_prompt"):
            row["gain_se"] = paired_difference(base["correct_per_prompt"], row["correct_per_prompt"], row["n_samples"])[1]
    table = pa.Table.from_pylist(report, schema=EVALUATION)
    write_table(table, output_path("evaluation", data), EVALUATION, "evaluation",
                lineage=stage_lineage("evaluation", params))
    summary = {f"{r['checkpoint'].split('/')[0]}_{r['mode']}_{metric}": round(r[metric], 4)
               for r in report for metric in ("accuracy", "reward_mean", "pass_at_k", "gain", "gain_se") if r.get(metric) is not None}
    import json

    (data / EVALUATION_METRICS).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    write_round_plots(data)
    reward_means = {n: read_lineage(output_path(checkpoint_key(n), data))["metrics"]["reward_mean"] for n in range(1, params.rounds + 1)}
    plot = accuracy_plot(report, reward_means, data / EVALUATION_PLOT)
    accuracy_rows = [[r["checkpoint"], r["mode"], f"{r['accuracy']:.3f}", gain_text(r), f"{r['pass_at_k']:.3f}", f"{r['reward_mean']:.3f}",
                      r["n_prompts"] * r["n_samples"]] for r in report]
    return {
        **summary, "checkpoints_evaluated_before": reused,
        "accuracy": {"type": "md", "raw_value": markdown_table(["checkpoint", "mode", f"accuracy ({report[0]['correctness']})", "gain vs r00 (± paired SE)", "pass@k", "mean reward",
                                                                     "completions"], accuracy_rows)},
        "plot": {"type": "md", "raw_value": f"![accuracy and reward per round](data:image/png;base64,{plot})"},
        "examples": {"type": "md", "raw_value": markdown_table(["checkpoint", "mode", "prompt", "completion", "answer"], examples)},
    }, output_path("evaluation", data)


def run_stage(stage: str, params: Params, round_number: int | None, root: Path, loaded: Loaded | None = None) -> tuple[dict, Path]:
    """Run one compute step in this process, with a heartbeat file while it runs; returns (metadata, output path).

    `loaded`: the models kept from the steps this process ran before (a fresh, empty one when None).
    """
    # The heartbeat (read by /health and `rl-assets status`) and the process set-up shape no output: not in the stage table.
    from rl_assets.run.hardware import BusyShare
    from rl_assets.run.heartbeat import Heartbeat
    from rl_assets.run.loaded import Loaded
    from rl_assets.run.process import free_large_blocks_at_once, peak_memory, quiet_step, release_freed_memory, reset_peak_memory

    quiet_step()
    if params.compute.return_freed_memory:
        free_large_blocks_at_once()
    reset_peak_memory()
    try:
        with Heartbeat(root, stage, round_number) as beat:
            with BusyShare(step_device(params)) as busy:
                metadata, path = _run_stage(stage, params, round_number, root, loaded or Loaded())
            # This process's peak while writing the output, models kept from earlier steps included: what a machine must have.
            metadata = {**metadata, **busy.result(), **peak_memory()}
            beat.summary.update({key: metadata[key] for key in ("busy_share", "busy_device", "peak_rss_gb", "peak_cuda_gb") if key in metadata})
    finally:
        release_freed_memory()  # the next step's peak starts from what is in use, not from this step's leftovers
    return metadata, path


def _run_stage(stage: str, params: Params, round_number: int | None, root: Path, loaded: Loaded) -> tuple[dict, Path]:
    if stage not in COMPUTE_STAGES:
        raise ValueError(f"unknown stage {stage!r}; one of {list(COMPUTE_STAGES)}")
    if stage in ROUND_STAGES and (round_number is None or not 1 <= round_number <= params.rounds):
        raise ValueError(f"{stage} needs --round between 1 and rounds={params.rounds}")
    torch.manual_seed(params.seed * 1000 + (round_number or 0))  # e.g. fresh LoRA adapters: the same whatever ran before
    device = step_device(params)
    metadata, path = runner(stage)(params, round_number, root, device, loaded)
    if STAGE_TABLE[stage].heldout:
        metadata = with_heldout(metadata, path, params, root, device, loaded)
    return metadata, path


def step_device(params: Params) -> str:
    """The device of this process's work: compute.device, this rank's GPU under torchrun, with its memory share."""
    from rl_assets.core.policy import pick_device

    device = pick_device(params.compute.device)
    if device == "cuda" and dist.is_initialized():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    if device.startswith("cuda") and params.compute.gpu_memory_fraction < 1:  # share a GPU without one step starving the rest
        torch.cuda.set_per_process_memory_fraction(params.compute.gpu_memory_fraction, torch.device(device))
    return device
