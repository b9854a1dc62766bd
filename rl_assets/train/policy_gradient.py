"""checkpoint (rounds >= 1), policy gradient: GRPO, RLOO or REINFORCE++ on a round's stored rollouts and rewards.

Reads top to bottom: advantages from the rewards table, then `epochs` passes of shuffled minibatches,
each a clipped-ratio step against the log-probs stored at sampling time; the table is never
re-sampled. Accelerate does the data parallelism (torchrun or `accelerate launch`; gloo on CPU),
mixed precision and loss scaling: each process takes a slice of every global minibatch, so
the update matches one process on the same global batch. The full state is saved every
`save_steps`, and a rerun of a killed step resumes from it (see train_state.py).

With `train.drop_equal_reward_groups` the groups whose rewards are all equal are left out first, as
verl's DAPO filter does: before the advantages, the KL penalty and the loss normalisation see them.
A round still takes as many optimizer steps as it would without the filter, each on a near-equal share
of the informative rows (every one of them, each epoch); the token metrics (entropy, KL, clipping)
describe the rows trained on.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from rl_assets.train.advantages import equal_reward_group_share, group_advantages, informative_rows, reinforce_pp_advantages, rloo_advantages
from rl_assets.core.algorithms import algorithm
from rl_assets.core.config import TrainParams
from rl_assets.train.losses import policy_loss, sampler_importance_weights
from rl_assets.core.precision import accelerate_mixed_precision, resolve_mixed_precision
from rl_assets.core.logprobs import completion_kl, completion_logprobs, plain_rows
from rl_assets.train.train_state import commit_state, latest_state, state_path

TOKEN_METRICS = ("clip_low", "clip_high", "clip_fraction", "kl_old", "kl_ref", "entropy", "sampler_capped")
STEP_METRICS = ("loss", "grad_norm")


def join_rewards(rollouts: pa.Table, rewards: pa.Table) -> torch.Tensor:
    """(N,) total reward for each rollout row, matched on (prompt_id, sample_idx)."""
    by_key = {(p, s): r for p, s, r in zip(rewards["prompt_id"].to_pylist(), rewards["sample_idx"].to_pylist(), rewards["reward"].to_pylist())}
    keys = list(zip(rollouts["prompt_id"].to_pylist(), rollouts["sample_idx"].to_pylist()))
    missing = [k for k in keys if k not in by_key]
    if missing:
        raise ValueError(f"rewards table has no score for {len(missing)} rollouts, e.g. prompt_id={missing[0][0]} sample_idx={missing[0][1]}")
    return torch.tensor([by_key[k] for k in keys], dtype=torch.float32)


def table_group_size(rollouts: pa.Table, configured: int) -> int:
    """G as the stored table has it: each prompt's rows, contiguous and equally many; params must agree.

    Advantages are normalised per group of G consecutive rows, so a G that differs from the table's
    would silently mix prompts into groups.
    """
    prompt_ids = rollouts["prompt_id"].to_pylist()
    runs = [len(list(group)) for _, group in itertools.groupby(prompt_ids)]  # consecutive rows of one prompt
    sizes = set(runs)
    if len(runs) != len(set(prompt_ids)) or len(sizes) != 1:
        raise ValueError(f"rollouts table: every prompt needs the same number of consecutive samples; found group sizes {sorted(sizes)}")
    (size,) = sizes
    if size != configured:
        raise ValueError(f"rollouts table has {size} samples per prompt but rollouts.samples_per_prompt is {configured}; "
                         f"rerun the rollouts or set rollouts.samples_per_prompt={size}")
    return size


def advantages_for(params: TrainParams, reward: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N,) advantages of the configured estimator."""
    estimator = algorithm(params.algorithm).advantages
    if estimator == "rloo":
        return rloo_advantages(reward, group_size)
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(reward, group_size)
    if estimator == "group":
        return group_advantages(reward, group_size, scale=params.scale_rewards)
    raise ValueError(f"train.algorithm {params.algorithm!r} takes its advantages from {estimator or 'no estimator'}, not from rewards alone")


def loss_beta(params: TrainParams) -> float:
    """The weight of the loss's k3 KL term: train.beta, unless ppo takes the KL as a reward penalty instead (kl_in_reward)."""
    return 0.0 if algorithm(params.algorithm).value_model and params.ppo.kl_in_reward else params.beta


def kept_rows(table: pa.Table, params: TrainParams) -> torch.Tensor:
    """(N,) 1.0 for a row in the loss, 0.0 for a truncated completion with train.mask_truncated_completions
    (a cut-off answer is neither right nor wrong)."""
    if not params.mask_truncated_completions:
        return torch.ones(table.num_rows)
    return (~torch.tensor(table["truncated"].to_pylist(), dtype=torch.bool)).float()


def policy_masks(rollouts: pa.Table) -> list[list[int]]:
    """Per completion token, 1 where the policy wrote it: an episode's `completion_mask`, all ones for a single completion.

    Tool and environment tokens (0) carry no loss, no KL and no share of the loss normalisation.
    """
    stored = rollouts["completion_mask"].to_pylist() if "completion_mask" in rollouts.column_names else [None] * rollouts.num_rows
    return [mask if mask is not None else [1] * len(ids) for mask, ids in zip(stored, rollouts["completion_ids"].to_pylist())]


def padded(rows: list[list[float]], width: int) -> torch.Tensor:
    """(len(rows), width) float32, each row right-padded with zeros."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


@dataclass
class TrainingBatch:
    """A round's table as training reads it: one entry per row trained on (equal-reward groups left out when asked)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    stored: list[list[float]]  # per completion token, the log-prob stored at sampling (the ratio's denominator)
    sampler: list[list[float] | None]  # the sampling engine's own log-probs (vLLM), for the mismatch correction
    policy: list[list[int]]  # per completion token, 1 where the policy wrote it (policy_masks)
    advantages: torch.Tensor  # (n,), or (n, T) per token (ppo)
    keep: torch.Tensor  # (n,) 1.0, or 0.0 for a row left out of the loss (a truncated completion, when masked)
    tokens: torch.Tensor  # (n,) float64: the policy tokens of each kept row (the loss normalisation of dapo)
    rewards: torch.Tensor  # (N,) every row's reward, the dropped rows' included
    vision: list | None = None  # each row's pixel inputs (a vision-language policy, rl_assets.core.vision); None: text only

    def __len__(self) -> int:
        return len(self.prompt_ids)


def rows_trained_on(all_rewards: torch.Tensor, params: TrainParams, group_size: int,
                    token_advantages: torch.Tensor | None = None) -> torch.Tensor | None:
    """(N,) bool: the rows training uses, those of groups whose rewards differ, with `train.drop_equal_reward_groups` (and no
    per-token advantages); None: every row. The others' advantages are 0: they cost compute and dilute the loss normalisation."""
    if params.drop_equal_reward_groups and token_advantages is None:
        return informative_rows(all_rewards, group_size)
    return None


def prepare_batch(rollouts: pa.Table, rewards: pa.Table, params: TrainParams, group_size: int,
                  token_advantages: torch.Tensor | None = None, vision: list | None = None) -> TrainingBatch:
    """Tables in, tensors out: the rewards joined, the uninformative groups dropped, the advantages, masks and token counts.

    `token_advantages`: (N, T) per-token advantages of every row (ppo's GAE, rl_assets.train.critic.ppo_targets), used as given.
    `vision`: every row's pixel inputs (a vision-language policy), kept for the rows trained on.
    """
    all_rewards = join_rewards(rollouts, rewards)
    table, reward = rollouts, all_rewards
    rows = list(range(rollouts.num_rows))
    if algorithm(params.algorithm).advantages == "gae" and token_advantages is None:
        raise ValueError(f"train.algorithm {params.algorithm} takes its advantages from the value model (ppo_targets); none were given")
    if (informative := rows_trained_on(all_rewards, params, group_size, token_advantages)) is not None:
        table, reward = rollouts.filter(pa.array(informative.tolist())), all_rewards[informative]
        rows = informative.nonzero().squeeze(1).tolist()
    if token_advantages is not None:
        advantages = token_advantages
    else:
        advantages = advantages_for(params, reward, group_size) if reward.numel() else reward
    stored = table["logprobs"].to_pylist()
    policy = policy_masks(table)
    keep = kept_rows(table, params)
    return TrainingBatch(prompt_ids=table["prompt_ids"].to_pylist(), completion_ids=table["completion_ids"].to_pylist(), stored=stored,
                         sampler=table["sampler_logprobs"].to_pylist() if params.sampler_correction_cap is not None else [None] * len(stored),
                         policy=policy, advantages=advantages, keep=keep,
                         tokens=torch.tensor([sum(m) for m in policy], dtype=torch.float64) * keep.double(), rewards=all_rewards,
                         vision=[vision[i] for i in rows] if vision is not None else None)


def steps_per_epoch(rows: int, table_rows: int, minibatch_size: int, processes: int) -> int:
    """Optimizer steps per epoch for `rows` trained on out of a table of `table_rows`; an epoch's shuffled rows are split
    into that many near-equal minibatches (`torch.tensor_split`), so every row is trained on.

    As many steps as the whole table makes minibatches of `minibatch_size` (at least one), whatever the filter left
    out, but no more than gives each of the `processes` (world size x gradient accumulation steps) micro-batches a row:
    with fewer rows than that (every group dropped) none.

    >>> steps_per_epoch(64, 64, 16, 2), steps_per_epoch(30, 64, 16, 2), steps_per_epoch(6, 64, 16, 4), steps_per_epoch(3, 64, 16, 4)
    (4, 4, 1, 0)
    >>> [len(minibatch) for minibatch in torch.arange(30).tensor_split(4)]   # 30 informative rows of 64: none left out
    [8, 8, 7, 7]
    """
    return min(max(table_rows // minibatch_size, 1), rows // processes)


def micro_weight(loss_type: str, micro_rows: int, minibatch_rows: int, world: int, accum: int) -> float:
    """What one micro-batch's loss is multiplied by before its backward, so the step's gradient is the minibatch's loss.

    grpo and dr_grpo average over rows: a micro-batch weighs its share of the minibatch's rows (times `world`, since DDP
    averages the ranks' gradients), which is 1 / accum when they split evenly. bnpo averages each micro-batch's tokens
    (TRL's local batch) and dapo divides by the minibatch's tokens already: 1 / accum.

    >>> micro_weight("grpo", 2, 16, 1, 8), micro_weight("grpo", 3, 14, 2, 2), micro_weight("dapo", 3, 14, 2, 2)
    (0.125, 0.42857142857142855, 0.5)
    """
    return micro_rows * world / minibatch_rows if loss_type in ("grpo", "dr_grpo") else 1 / accum


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, accum: int, loss_type: str) -> list[torch.Tensor]:
    """One rank's rows of an optimizer step, split into `accum` micro-batches. Where the step's gradient does not depend on
    how rows are grouped (grpo and dr_grpo weigh each row alike, dapo divides by the minibatch's tokens), rows of
    similar `lengths` (prompt and completion tokens) go together, so a micro-batch is little padding; bnpo averages each
    micro-batch's tokens, so its rows stay as drawn.

    >>> rows, lengths = torch.tensor([0, 1, 2, 3]), torch.tensor([5, 90, 7, 88])
    >>> [m.tolist() for m in micro_batches(rows, lengths, 2, "grpo")], [m.tolist() for m in micro_batches(rows, lengths, 2, "bnpo")]
    ([[0, 2], [3, 1]], [[0, 1], [2, 3]])
    """
    if loss_type != "bnpo":
        rows = rows[lengths[rows].argsort(stable=True)]
    return list(rows.tensor_split(accum))


def shard_model(model) -> None:
    """Shard `model` over the process group with torch's FSDP2 (`fully_shard`): each decoder layer (the classes the model
    names in `_no_split_modules`, as Accelerate's auto-wrap does), then the rest. Each rank then holds 1/world of the
    weights, their gradients and AdamW's moments; a layer's weights are gathered for its forward and backward only."""
    from torch.distributed.fsdp import fully_shard

    layers = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)


def inner_optimizer(optimizer):
    """The torch optimizer itself (Accelerate wraps it; a sharded round uses it bare)."""
    return getattr(optimizer, "optimizer", optimizer)


def make_optimizer(model, params: TrainParams, accelerator, optimizer_state: dict | None, total_steps: int, shard: bool = False):
    """(model, optimizer, scheduler): AdamW, fresh or continuing `optimizer_state`, and the LR schedule.

    Prepared by Accelerate (DDP across processes, or the FSDP of an Accelerate config), or with `shard` sharded by
    torch's FSDP2 directly (`shard_model`; Accelerate 1.15 does FSDP on GPUs only, this runs on CPUs too). The sharded
    model and its optimizer are not handed to Accelerate: its DDP would wrap the shards, and its saved state keeps rank
    0's optimizer alone (`save_state` saves every rank's shards with torch.distributed.checkpoint instead).
    """
    from accelerate import DistributedType
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from transformers import get_scheduler

    sharded = shard or accelerator.distributed_type == DistributedType.FSDP
    if shard:
        shard_model(model)
    # torch's fused AdamW: one kernel over every tensor, no temporaries as large as the weights (faster, and
    # less memory at the peak); FSDP's sharded parameters keep the default implementation.
    fused = {} if sharded else {"fused": True}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=params.learning_rate, weight_decay=params.weight_decay,
                                  **fused)
    if not shard:
        model, optimizer = accelerator.prepare(model, optimizer)
    if optimizer_state is not None:  # loaded into the wrapped model: FSDP shards the whole state it is given
        for group in optimizer.param_groups:  # the saved groups carry the scheduler's key too
            group.setdefault("initial_lr", params.learning_rate)
        if sharded:
            set_optimizer_state_dict(model, inner_optimizer(optimizer), optimizer_state, options=StateDictOptions(full_state_dict=True))
        else:  # set_optimizer_state_dict would first fill zero moments and gradients by a step: 3x the weights' memory, at the peak
            optimizer.optimizer.load_state_dict(index_keyed(optimizer_state, accelerator.unwrap_model(model), optimizer.optimizer))
        for group in optimizer.param_groups:  # this round's settings, the carried moments
            group.update(lr=params.learning_rate, initial_lr=params.learning_rate, weight_decay=params.weight_decay)
    scheduler = get_scheduler(params.lr_scheduler, optimizer, num_warmup_steps=round(params.warmup_ratio * total_steps), num_training_steps=total_steps)
    accelerator.register_for_checkpointing(scheduler)
    return model, optimizer, scheduler


def resume_point(accelerator, state_dir: Path | None, fingerprint: dict | None, resume: bool,
                 sharded: tuple | None = None) -> tuple[int, list[dict], dict | None]:
    """(first step to take, the history so far, this rank's running sums) from the last saved state that matches, else a fresh start.

    Without `resume` the saved states are removed first: a round trained afresh must not resume a stale one later.
    `sharded`: (model, optimizer) of a round sharded by `shard_model`, whose shards come back from torch.distributed.checkpoint.
    """
    if state_dir is not None and not resume and accelerator.is_main_process:
        shutil.rmtree(state_dir, ignore_errors=True)
    accelerator.wait_for_everyone()
    if state_dir is not None and resume and (found := latest_state(state_dir, fingerprint)):
        path, info = found
        accelerator.load_state(str(path))  # the schedule, every rank's RNG (and a prepared model and optimizer)
        if sharded is not None:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            model, optimizer = sharded
            weights, moments = get_state_dict(model, optimizer)
            state = {"model": weights, "optimizer": moments}
            dcp.load(state, checkpoint_id=str(path / SHARDED_STATE))
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        return info["step"], info["history"], json.loads((path / f"sums-rank{accelerator.process_index}.json").read_text())
    return 0, [], None


def train_step(model, batch: TrainingBatch, micro_batches: list[torch.Tensor], accelerator, params: TrainParams, *, minibatch_rows: int,
               num_items: float, ref_model, pad_id: int, temperature: float, max_new_tokens: int) -> dict:
    """The forward and backward passes of one optimizer step over this rank's micro-batches (the last one syncs gradients).

    On a CPU a micro-batch whose completion logits would pass PLAIN_LOGITS_MAX goes through in chunks of
    `plain_rows`, a backward each, its loss weighted by the chunk's share of what the loss type averages over: the
    same gradient, a fraction of the memory (TRL's fused head, which it would take otherwise, makes GBs of CPU tiles).
    Returns the step's sums on this rank: `loss` (each micro-batch's weighted by `micro_weight`), `tokens` (the loss's),
    `sequence_tokens` (prompts' and completions', without padding), and each of TOKEN_METRICS weighted by its micro-batch's tokens.
    """
    accum = len(micro_batches)
    sums = dict.fromkeys(TOKEN_METRICS, 0.0) | {"loss": 0.0, "tokens": 0.0, "sequence_tokens": 0.0}
    for micro_index, micro in enumerate(micro_batches):
        rows = micro.tolist()
        weight = micro_weight(params.loss_type, len(rows), minibatch_rows, accelerator.num_processes, accum)
        size = plain_rows(model, [batch.prompt_ids[i] for i in rows], [batch.completion_ids[i] for i in rows])
        chunks = [rows[start : start + size] for start in range(0, len(rows), size)]
        for chunk_index, chunk in enumerate(chunks):
            last = micro_index == accum - 1 and chunk_index == len(chunks) - 1
            # The chunk's share of the micro-batch's loss: its rows (grpo, dr_grpo average over rows) or its tokens (bnpo);
            # dapo's denominator, num_items, is the global minibatch's already.
            share = {"grpo": len(chunk) / len(rows), "dr_grpo": len(chunk) / len(rows), "dapo": 1.0,
                     "bnpo": batch.tokens[chunk].sum().item() / max(batch.tokens[rows].sum().item(), 1.0)}[params.loss_type]
            prompts, completions = [batch.prompt_ids[i] for i in chunk], [batch.completion_ids[i] for i in chunk]
            with accelerator.autocast(), (accelerator.no_sync(model) if not last else contextlib.nullcontext()):
                vision = [batch.vision[i] for i in chunk] if batch.vision is not None else None
                logprobs, mask, entropy = completion_logprobs(model, prompts, completions, pad_id, temperature, with_entropy=True, vision=vision)
                mask = mask * batch.keep[chunk].to(mask.device)[:, None] * padded([batch.policy[i] for i in chunk], mask.shape[1]).to(mask.device)
                old = padded([batch.stored[i] for i in chunk], logprobs.shape[1]).to(logprobs.device)
                weights = None
                if any(batch.sampler[i] is not None for i in chunk):
                    sampled = padded([batch.sampler[i] if batch.sampler[i] is not None else [float("nan")] * len(batch.stored[i]) for i in chunk],
                                   logprobs.shape[1]).to(logprobs.device)
                    weights = sampler_importance_weights(old, sampled, mask, params.sampler_correction_cap)
                ref = None
                if ref_model is not None and loss_beta(params) > 0:
                    with torch.no_grad():
                        ref, _ = completion_logprobs(ref_model, prompts, completions, pad_id, temperature, vision=vision)
                advantages = batch.advantages[chunk] if batch.advantages.ndim == 1 else batch.advantages[chunk][:, : logprobs.shape[1]]
                loss, metrics = policy_loss(logprobs, old, advantages.to(logprobs.device), mask, loss_type=params.loss_type,
                                            epsilon=params.epsilon, epsilon_high=params.epsilon_high, ref_logprobs=ref, beta=loss_beta(params),
                                            max_completion_length=max_new_tokens, num_items=num_items, num_processes=accelerator.num_processes,
                                            sampler_weights=weights)
                accelerator.backward(loss * share * weight)
            chunk_tokens = mask.sum().item()
            metrics["entropy"] = ((entropy * mask).sum() / mask.sum().clamp(min=1)).item()
            # the share of tokens whose importance weight for another sampler (vLLM, an older checkpoint) hit its cap
            metrics["sampler_capped"] = 0.0 if weights is None else (((weights >= params.sampler_correction_cap) * mask).sum()
                                                                    / mask.sum().clamp(min=1)).item()
            for key in TOKEN_METRICS:
                sums[key] += metrics[key] * chunk_tokens
            sums["loss"] += loss.item() * share * weight
            sums["tokens"] += chunk_tokens
            sums["sequence_tokens"] += sum(len(p) + len(c) for p, c in zip(prompts, completions))  # what the forward computed on
    return sums


def train_on_rollouts(model, rollouts: pa.Table, rewards: pa.Table, params: TrainParams, *, group_size: int, temperature: float,
                      pad_id: int, seed: int, max_new_tokens: int, device: str = "cpu", ref_model=None,
                      state_dir: Path | None = None, fingerprint: dict | None = None, optimizer_state: dict | None = None,
                      token_advantages: torch.Tensor | None = None, progress: bool = True, shard: bool = False, vision: list | None = None):
    """Update `model` on the stored table; returns (trained model, the round's metrics, per-step history, optimizer state).

    `shard` (compute.sharding: fsdp, with several processes): torch's FSDP2 shards the weights, gradients and moments
    (`shard_model`); the end of the round gathers them, and rank 0 returns a whole copy (the other ranks None).

    `token_advantages`: ppo's (N, T) GAE advantages from the value model (rl_assets.train.critic.ppo_targets).
    `vision`: each rollout row's pixel inputs, for a vision-language policy (rl_assets.core.vision.pixel_inputs).

    `optimizer_state` continues the previous round's AdamW moments (train.carry_optimizer_state) instead of a fresh optimizer;
    `state_dir` and `fingerprint` are where the state is saved every `save_steps`, and which saved state a rerun may resume.
    """
    from accelerate import Accelerator, DistributedType
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    accelerator = Accelerator(cpu=not device.startswith("cuda"),
                              mixed_precision=accelerate_mixed_precision(resolve_mixed_precision(params.mixed_precision, device)))
    rank, world, accum = accelerator.process_index, accelerator.num_processes, params.gradient_accumulation_steps
    if params.minibatch_size % (world * accum):
        raise ValueError(f"train.minibatch_size={params.minibatch_size} must divide evenly over {world} processes x {accum} accumulation steps")
    batch = prepare_batch(rollouts, rewards, params, group_size, token_advantages, vision)
    n = len(batch)
    steps = steps_per_epoch(n, rollouts.num_rows, params.minibatch_size, world * accum)
    total_steps = params.epochs * steps

    if params.gradient_checkpointing:
        model.config.use_cache = False
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()  # the new name, where it exists
    shard = shard and world > 1
    model, optimizer, scheduler = make_optimizer(model, params, accelerator, optimizer_state, total_steps, shard=shard)
    sharded = (model, optimizer) if shard else None  # what save_state and resume_point keep with torch.distributed.checkpoint
    start_step, history, resumed_sums = resume_point(accelerator, state_dir, fingerprint, params.resume, sharded)
    sums = resumed_sums or {"steps": 0, "tokens": 0.0, **dict.fromkeys(STEP_METRICS, 0.0), **dict.fromkeys(TOKEN_METRICS, 0.0)}  # this rank's
    sums.setdefault("sequence_tokens", 0.0)  # a state saved before it was counted

    lengths = torch.tensor([len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)])
    model.train()
    started, step = time.perf_counter(), 0
    bar = tqdm(total=total_steps, initial=start_step, desc="train", disable=None if progress and rank == 0 else True, leave=False)  # None: only on a terminal
    for epoch in range(params.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))  # a function of (seed, epoch): resumable
        for rows in order.tensor_split(steps) if steps else []:
            step += 1
            if step <= start_step:
                continue
            step_sums = train_step(model, batch, micro_batches(rows.tensor_split(world)[rank], lengths, accum, params.loss_type),  # this rank's slice
                                   accelerator, params,
                                   minibatch_rows=len(rows),
                                   num_items=batch.tokens[rows].sum().item() / accum,  # dapo: tokens of the global minibatch, per micro-step
                                   ref_model=ref_model, pad_id=pad_id, temperature=temperature, max_new_tokens=max_new_tokens)
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), params.max_grad_norm)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # sharded: a DTensor
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

            sums["steps"] += 1
            sums["grad_norm"] += float(grad_norm)
            for key in ("loss", "tokens", "sequence_tokens", *TOKEN_METRICS):
                sums[key] += step_sums[key]
            point = _reduce(accelerator, step_sums)
            history.append({"step": step, "loss": point["loss"], "grad_norm": float(grad_norm), "learning_rate": scheduler.get_last_lr()[0],
                            **{key: point[key] for key in TOKEN_METRICS}})
            bar.update()
            bar.set_postfix(loss=f"{point['loss']:.4f}", clip=f"{point['clip_fraction']:.3f}")
            if state_dir is not None and params.save_steps and step % params.save_steps == 0 and step < total_steps:
                save_state(accelerator, state_dir, step, {"step": step, "fingerprint": fingerprint, "history": history}, sums, params.keep_last,
                            sharded)
    bar.close()
    elapsed = time.perf_counter() - started
    # Collective under FSDP: every rank takes part, rank 0 gets whole tensors (name-keyed, the same format without sharding).
    final_optimizer_state = optimizer_state  # no step taken: the moments that came in go on (a fresh optimizer's would count a step)
    if total_steps:
        final_optimizer_state = get_optimizer_state_dict(model, inner_optimizer(optimizer), options=StateDictOptions(full_state_dict=True,
                                                                                                                 cpu_offload=True))
    full_weights = None
    if shard:
        full_weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    elif accelerator.distributed_type == DistributedType.FSDP:
        full_weights = accelerator.get_state_dict(model)
    model = accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # a plain forward again, as a fresh load has (rl_assets.run.loaded)
    model.eval()
    if params.gradient_checkpointing:
        getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()

    result = round_metrics(_reduce(accelerator, sums), sums, batch, rollouts, group_size, steps=step, start_step=start_step, elapsed=elapsed,
                           minibatch=-(-n // steps) if steps else 0, world=world)
    result.update(mixed_precision=accelerator.mixed_precision, carried_optimizer_state=optimizer_state is not None)
    if full_weights is not None:  # the unwrapped FSDP model holds this rank's shards only: rank 0 gets a whole copy
        model = _whole_copy(model, full_weights) if accelerator.is_main_process else None
    return model, result, history, final_optimizer_state


def round_metrics(total: dict, sums: dict, batch: TrainingBatch, rollouts: pa.Table, group_size: int, *, steps: int, start_step: int,
                  elapsed: float, minibatch: int, world: int) -> dict:
    """The round's metrics from the reduced totals (`_reduce` over every rank) and this rank's `sums`; no step, no token means."""
    result = {key: total[key] for key in TOKEN_METRICS} if steps else {}  # no step: no tokens to average, not zeros
    rewards, n = batch.rewards, len(batch)
    result.update(
        loss=total["loss"],
        grad_norm=sums["grad_norm"] / max(sums["steps"], 1),  # already global (DDP all-reduces gradients)
        steps=steps,
        tokens_per_second=total["tokens_all"] / elapsed if elapsed and steps > start_step else 0.0,
        sequence_tokens_per_second=total["sequence_tokens_all"] / elapsed if elapsed and steps > start_step else 0.0,
        loop_seconds=round(elapsed, 3),  # the training loop alone: the rest of the step is loading, the KL pass, saving
        resumed_from_step=start_step,
        reward_mean=rewards.mean().item(),
        reward_std=rewards.std().item() if rewards.numel() > 1 else 0.0,
        equal_reward_group_share=equal_reward_group_share(rewards, group_size),
        trained_rows=n,
        minibatch_size=minibatch,
        dropped_rows=rollouts.num_rows - n,
        dropped_groups=(rollouts.num_rows - n) // group_size,
        truncated_share=float(sum(rollouts["truncated"].to_pylist()) / rollouts.num_rows),
        world_size=world,
    )
    return result


def index_keyed(state: dict, model, optimizer) -> dict:
    """A name-keyed optimizer state (`get_optimizer_state_dict(full_state_dict=True)`, what a round saves) as the
    index-keyed one `optimizer.load_state_dict` takes, for `optimizer` over `model`'s parameters. The tensors are
    shared, not copied: `load_state_dict` keeps them when dtype and device already match.

    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.AdamW(model.parameters())
    >>> saved = {"state": {"bias": {"step": torch.tensor(1.0)}}, "param_groups": [{"params": ["weight", "bias"], "lr": 0.1}]}
    >>> index_keyed(saved, model, optimizer)
    {'state': {1: {'step': tensor(1.)}}, 'param_groups': [{'params': [0, 1], 'lr': 0.1}]}
    """
    names = {id(p): name for name, p in model.named_parameters()}
    index = {names[id(p)]: i for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
    unknown = sorted((set(state["state"]) | {n for g in state["param_groups"] for n in g["params"]}) - set(index))
    if unknown:
        raise ValueError(f"the carried optimizer state names parameters this model does not train: {unknown[:5]}")
    return {"state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]} for group in state["param_groups"]]}


def _whole_copy(sharded, full_weights: dict):
    """A plain (unsharded) model with the gathered weights, for the KL metric and the save on rank 0."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    if hasattr(sharded, "peft_config"):
        raise NotImplementedError("LoRA adapters under FSDP are not supported yet; use DDP (no accelerate_config) or ZeRO-2 with LoRA")
    with no_init_weights():  # the weights come next; buffers such as rotary frequencies are built as usual
        plain = AutoModelForCausalLM.from_config(sharded.config)
    missing = set(plain.load_state_dict(full_weights, strict=False).missing_keys)
    plain.tie_weights()
    if missing - {"lm_head.weight"} or ("lm_head.weight" in missing and not plain.config.get_text_config().tie_word_embeddings):
        raise ValueError(f"the gathered FSDP state dict lacks weights: {sorted(missing)[:5]}")
    return plain.eval()


def kl_rows(rollouts: pa.Table, count: int) -> list[int]:
    """The `count` rows the reference KL is measured on: the first sample of every prompt, then the second, and so on
    (table order within each), so a few rows cover as many prompts as they can; always the same rows for a table.

    >>> kl_rows(pa.table({"sample_idx": [0, 1, 2, 0, 1, 2]}), 3)
    [0, 3, 1]
    """
    samples = rollouts["sample_idx"].to_pylist()
    return sorted(range(len(samples)), key=lambda row: (samples[row], row))[:count]


def reference_kl(model, ref_model, rollouts: pa.Table, *, pad_id: int, temperature: float, rows: int = 64, vision: list | None = None) -> float:
    """How far the policy has moved from the reference (r00): mean per-token KL(policy || reference).

    The KL is exact over the vocabulary at each completion position of `rows` of the round's stored
    rollouts (`kl_rows`: one sample of each prompt first, so the figure is deterministic). Each row costs a
    forward of both models: on SmolLM2-135M all 320 rows of a round took longer than its training.
    A sampled estimator such as k3 would be heavy-tailed here: the rollouts come from the previous policy, not this one.
    Measured whatever `train.beta` is: the guard that stops drifting runs reads it.
    """
    chosen = kl_rows(rollouts, rows)
    prompt_ids, completion_ids, masks = (rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist(), policy_masks(rollouts))
    total, tokens = completion_kl(model, ref_model, [prompt_ids[r] for r in chosen], [completion_ids[r] for r in chosen], pad_id, temperature,
                                  masks=[masks[r] for r in chosen], vision=[vision[r] for r in chosen] if vision is not None else None)
    return total / max(tokens, 1.0)


def _reduce(accelerator, sums: dict) -> dict:
    """Token-weighted means over all processes: the loss per step (mean of ranks), the rest per token."""
    keys = ["loss", "tokens", "sequence_tokens", *TOKEN_METRICS]
    values = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    if accelerator.num_processes > 1:
        values = accelerator.reduce(values, reduction="sum")
    totals = dict(zip(keys, values.tolist()))
    steps = max(float(sums.get("steps", 1)), 1.0)
    out = {key: totals[key] / max(totals["tokens"], 1.0) for key in TOKEN_METRICS}
    out["loss"] = totals["loss"] / accelerator.num_processes / steps
    out["tokens_all"], out["sequence_tokens_all"] = totals["tokens"], totals["sequence_tokens"]
    return out


SHARDED_STATE = "sharded"  # a saved state's folder of the sharded weights and moments (torch.distributed.checkpoint)


def save_state(accelerator, state_dir: Path, step: int, info: dict, sums: dict, keep_last: int, sharded: tuple | None = None) -> None:
    """Save what `resume_point` reads back as `state_dir`/step-NNNNNN (atomically): Accelerate's state (the prepared model and
    optimizer, every rank's RNG, registered objects), each rank's running `sums`, `info` (step, fingerprint, history) last;
    with `sharded`, every rank's shards too. Only the newest `keep_last` states are kept."""
    tmp = state_dir / f".tmp-step-{step:06d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if sharded is not None:  # every rank writes its own shards (Accelerate would keep rank 0's optimizer alone)
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        weights, moments = get_state_dict(*sharded)
        dcp.save({"model": weights, "optimizer": moments}, checkpoint_id=str(tmp / SHARDED_STATE))
    (tmp / f"sums-rank{accelerator.process_index}.json").write_text(json.dumps(sums))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        commit_state(tmp, state_path(state_dir, step), info, keep_last)
    accelerator.wait_for_everyone()
