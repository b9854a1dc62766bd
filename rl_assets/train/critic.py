"""rNN/critic: PPO's value model, trained round after round on the returns of the round's stored rollouts.

The value model is the policy's architecture with a token-classification head of one label
(`AutoModelForTokenClassification`, a Hugging Face folder like any checkpoint; a vision-language policy's is
its multimodal body with that head, `VisionValueModel`, so the values see the images). Round n's starts from
rNN-1/critic; round 1's from r00 with a zero head (every value 0, so its advantages are the plain returns)
or from the reward model, head included (train.ppo.critic_init).

Both PPO outputs of a round read the parent critic's estimates from before the round (`ppo_targets`):
the train stage takes GAE's advantages from them, this stage the returns and the value loss's clip
anchor. Each output is computed the same way from the same inputs, so either can be rewritten alone,
and rescoring a round makes both stale and nothing earlier.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rl_assets.core.config import LoraParams, TrainParams
from rl_assets.core.logprobs import completion_logprobs, completion_values
from rl_assets.core.precision import accelerate_mixed_precision, resolve_mixed_precision
from rl_assets.train.advantages import gae_advantages, token_rewards, whiten
from rl_assets.train.losses import explained_variance, value_loss
from rl_assets.train.policy_gradient import padded, resume_point, save_state, steps_per_epoch

CRITIC_KIND = "critic"  # the lineage card's `kind` of a value model


class VisionValueModel:
    """Marks a vision-language value model: `vision_value_model` makes the class for a VLM's config."""


def vision_value_model(config):
    """The value model class of a vision-language policy's config: its multimodal body (`AutoModel`: vision tower, projector,
    language model; the `model.*` weights of the policy's folder) and a one-output `score` head over the language model's
    hidden states, as `AutoModelForTokenClassification` puts on a text model. Its forward takes the pixel inputs.
    One class per config type, made once: equal configs load as one architecture."""
    return _vision_value_model(type(config))


@functools.cache
def _vision_value_model(config_type):
    from transformers import AutoModel, PreTrainedModel
    from transformers.modeling_outputs import TokenClassifierOutput

    class Model(VisionValueModel, PreTrainedModel):
        config_class = config_type
        base_model_prefix = "model"
        supports_gradient_checkpointing = True
        _supports_sdpa = _supports_flash_attn = True

        def __init__(self, config):
            super().__init__(config)
            self.model = AutoModel.from_config(config)
            self.score = torch.nn.Linear(config.get_text_config().hidden_size, 1, bias=False)
            self.post_init()

        def forward(self, input_ids=None, attention_mask=None, **inputs):
            inputs = {key: value for key, value in inputs.items() if key not in ("labels", "output_attentions", "output_hidden_states", "return_dict")}
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **inputs).last_hidden_state
            return TokenClassifierOutput(logits=self.score(hidden))

    Model.__name__ = Model.__qualname__ = f"{config_type.__name__.removesuffix('Config')}ValueModel"
    return Model


def load_critic(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32, start: str | None = None,
                lora: LoraParams | None = None):
    """The value model at `path` (an rNN/critic folder), or a new one from a policy or reward model folder.

    `start`: None loads a critic as saved; "policy" puts a zero head on a policy checkpoint's body (values start at 0);
    "reward_model" keeps the reward model's body and head (its score of a prefix is the first value estimate).
    `lora` (train.lora, when train.ppo.critic_lora): a new value model gets LoRA adapters on its body and a trainable
    head (PEFT's modules_to_save); a critic saved as adapters loads on the base it names, trainable. Without `lora`,
    adapters load for reading (generate --values, serve).
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    if (Path(path) / "adapter_config.json").is_file():  # a LoRA value model: its adapters and head on the body it started from
        from peft import PeftModel

        from rl_assets.core.policy import adapter_base

        base = load_critic(adapter_base(path), device, dtype, start=_start_of(path))
        return PeftModel.from_pretrained(base, path, is_trainable=lora is not None).to(device)
    config = AutoConfig.from_pretrained(path)
    if start is not None:  # one output, no dropout (the estimate that trains is the one GAE read), no bias (as a reward head)
        config.num_labels, config.classifier_dropout, config.token_classification_bias = 1, 0.0, False
        config.id2label, config.label2id = {0: "value"}, {"value": 0}
    from rl_assets.core.vision import is_vision_model

    loader = vision_value_model(config) if is_vision_model(config) else AutoModelForTokenClassification
    model = loader.from_pretrained(path, config=config, dtype=dtype)
    if start == "policy":
        torch.nn.init.zeros_(model.score.weight)
    if lora is not None and start is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules,
                                                 task_type="TOKEN_CLS", modules_to_save=["score"]))
        model.peft_config[model.active_adapter].base_model_name_or_path = str(Path(path).resolve())  # what save_checkpoint records
    return model.to(device)


def _start_of(adapters: str | Path) -> str:
    """How the body under a LoRA value model was started (its card's `start`): its base is loaded the same way again."""
    from rl_assets.core.checkpoints import read_lineage

    return read_lineage(adapters).get("start", "policy")


@dataclass
class PPOTargets:
    """What the parent value model says about a round's table, before either PPO output trains: all (N, T), 0 off the mask."""

    advantages: torch.Tensor  # GAE, whitened when train.ppo.whiten_advantages
    returns: torch.Tensor  # the value model's targets: GAE's advantages (not whitened) + old values
    old_values: torch.Tensor  # the parent's estimates
    mask: torch.Tensor  # 1 on the policy's tokens of the rows that count

    def rows(self, index: torch.Tensor, width: int) -> "PPOTargets":
        """The targets of rows `index`, cut to a micro-batch's `width` (its longest completion)."""
        return PPOTargets(*(t[index][:, :width] for t in (self.advantages, self.returns, self.old_values, self.mask)))


def ppo_targets(critic, prompt_ids: list[list[int]], completion_ids: list[list[int]], mask: list[list[float]], scores: torch.Tensor,
                params: TrainParams, *, pad_id: int, batch_size: int, stored_logprobs: list[list[float]] | None = None,
                ref_model=None, temperature: float = 1.0, vision: list | None = None) -> PPOTargets:
    """Per-token rewards (the score on the last policy token, the KL penalty with train.ppo.kl_in_reward), the parent's values
    and GAE over the whole table, in no-grad passes of `batch_size` rows.

    `mask`: per completion token, 1 where it counts (the policy wrote it, its row is not left out); `stored_logprobs` and
    `ref_model`: for kl_in_reward, the sampling policy's log-probs and r00, whose per-token k1 KL is the penalty.
    `vision`: each row's pixel inputs (a vision-language policy), read by the value model and r00.
    """
    ppo, width = params.ppo, max(1, max(map(len, completion_ids)))
    token_mask = padded(mask, width)
    old_values = torch.zeros(len(prompt_ids), width)
    kl = torch.zeros(len(prompt_ids), width) if ppo.kl_in_reward and params.beta > 0 else None
    was_training = critic.training
    critic.eval()
    with torch.no_grad():
        for start in range(0, len(prompt_ids), batch_size):
            span = slice(start, start + batch_size)
            pixels = vision[span] if vision is not None else None
            values, _ = completion_values(critic, prompt_ids[span], completion_ids[span], pad_id, vision=pixels)
            old_values[span, : values.shape[1]] = values.cpu()
            if kl is not None:
                if ref_model is None or stored_logprobs is None:
                    raise ValueError("train.ppo.kl_in_reward with beta > 0 needs the reference model and the stored log-probs")
                reference, _ = completion_logprobs(ref_model, prompt_ids[span], completion_ids[span], pad_id, temperature, vision=pixels)
                kl[span, : reference.shape[1]] = padded(stored_logprobs[span], reference.shape[1]) - reference.cpu()
    critic.train(was_training)
    rewards = token_rewards(scores, token_mask, kl=kl, kl_coef=params.beta)
    advantages, returns = gae_advantages(rewards, old_values * token_mask, token_mask, gamma=ppo.gamma, lam=ppo.lam)
    if ppo.whiten_advantages:
        advantages = whiten(advantages, token_mask)
    return PPOTargets(advantages=advantages, returns=returns, old_values=old_values * token_mask, mask=token_mask)


def critic_learning_rate(params: TrainParams) -> float:
    """train.ppo.critic_learning_rate, or 10x the policy's when unset.

    >>> critic_learning_rate(TrainParams(learning_rate=1e-4)), critic_learning_rate(TrainParams(ppo={"critic_learning_rate": 3e-5}))
    (0.001, 3e-05)
    """
    return params.ppo.critic_learning_rate or 10 * params.learning_rate


def train_critic(critic, prompt_ids: list[list[int]], completion_ids: list[list[int]], targets: PPOTargets, params: TrainParams, *,
                 pad_id: int, seed: int, device: str = "cpu", progress: bool = True, state_dir: Path | None = None,
                 fingerprint: dict | None = None, vision: list | None = None):
    """Fit the value model to the round's returns: `critic_epochs` passes of shuffled minibatches, PPO's clipped value loss.
    `vision`: each row's pixel inputs (the value model of a vision-language policy).

    Returns (trained critic, metrics, per-step history). Metrics: value_loss (mean over steps), value_clip_fraction,
    explained_variance and value_mean / return_mean of the parent's estimates against this round's returns (how well
    the value model that gave the advantages predicted them), steps, tokens_per_second, resumed_from_step.
    With `state_dir`, the state is saved every train.save_steps and a rerun resumes from the newest whose `fingerprint`
    matches, as the policy's training does (policy_gradient.save_state, resume_point).
    """
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not device.startswith("cuda"),
                              mixed_precision=accelerate_mixed_precision(resolve_mixed_precision(params.mixed_precision, device)))
    rank, world, accum = accelerator.process_index, accelerator.num_processes, params.gradient_accumulation_steps
    n = len(prompt_ids)
    steps = steps_per_epoch(n, n, params.minibatch_size, world * accum)
    epochs = params.ppo.critic_epochs or params.epochs
    if params.gradient_checkpointing:
        critic.config.use_cache = False
        getattr(critic, "activation_checkpointing_enable", critic.gradient_checkpointing_enable)()
    optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=critic_learning_rate(params), weight_decay=params.weight_decay,
                                  **({"fused": True} if world == 1 else {}))
    critic, optimizer = accelerator.prepare(critic, optimizer)
    start_step, history, resumed = resume_point(accelerator, state_dir, fingerprint, params.resume)
    sums = resumed or {"value_loss": 0.0, "value_clip_fraction": 0.0}  # this rank's, over the steps so far
    critic.train()
    tokens, started, total = 0.0, time.perf_counter(), epochs * steps
    bar = tqdm(total=total, initial=start_step, desc="critic", disable=None if progress and rank == 0 else True, leave=False)
    step = 0
    for epoch in range(epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch + 500))  # not the policy's order
        for rows in order.tensor_split(steps) if steps else []:
            step += 1
            if step <= start_step:
                continue
            micro_batches = rows.tensor_split(world)[rank].tensor_split(accum)
            step_loss = step_clipped = step_tokens = 0.0
            num_items = targets.mask[rows].sum().item() / accum  # the global minibatch's tokens per micro-step (value_loss)
            for micro_index, micro in enumerate(micro_batches):
                chosen = micro.tolist()
                with accelerator.autocast(), (accelerator.no_sync(critic) if micro_index < accum - 1 else contextlib.nullcontext()):
                    values, padding = completion_values(critic, [prompt_ids[i] for i in chosen], [completion_ids[i] for i in chosen], pad_id,
                                                        vision=[vision[i] for i in chosen] if vision is not None else None)
                    part = targets.rows(micro, values.shape[1])
                    mask = part.mask.to(values.device) * padding
                    loss, metrics = value_loss(values, part.old_values.to(values.device), part.returns.to(values.device), mask,
                                               clip=params.ppo.value_clip, num_items=num_items, num_processes=world)
                    accelerator.backward(loss / accum)
                micro_tokens = mask.sum().item()
                step_loss += loss.item() / accum
                step_clipped += metrics["value_clip_fraction"] * micro_tokens
                step_tokens += micro_tokens
            grad_norm = accelerator.clip_grad_norm_(critic.parameters(), params.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clipped = step_clipped / max(step_tokens, 1.0)
            sums["value_loss"] += step_loss
            sums["value_clip_fraction"] += clipped
            tokens += step_tokens
            history.append({"step": step, "value_loss": step_loss, "value_clip_fraction": clipped, "grad_norm": float(grad_norm)})
            bar.update()
            bar.set_postfix(value_loss=f"{step_loss:.4f}")
            if state_dir is not None and params.save_steps and step % params.save_steps == 0 and step < total:
                save_state(accelerator, state_dir, step, {"step": step, "fingerprint": fingerprint, "history": history}, sums, params.keep_last)
    bar.close()
    elapsed = time.perf_counter() - started
    critic = accelerator.unwrap_model(critic, keep_fp32_wrapper=False)
    critic.eval()
    if params.gradient_checkpointing:
        getattr(critic, "activation_checkpointing_disable", critic.gradient_checkpointing_disable)()
    on = targets.mask
    result = {key: value / max(step, 1) for key, value in sums.items()}
    result.update(steps=step, tokens_per_second=tokens / elapsed if elapsed and step > start_step else 0.0, resumed_from_step=start_step,
                  explained_variance=_finite_or_none(explained_variance(targets.old_values, targets.returns, on)),
                  value_mean=float((targets.old_values * on).sum() / on.sum().clamp(min=1)),
                  return_mean=float((targets.returns * on).sum() / on.sum().clamp(min=1)))
    return critic, result, history


def _finite_or_none(value: float) -> float | None:
    """NaN (returns that do not vary) is stored as None: nothing to explain is not a broken metric."""
    return value if value == value else None
