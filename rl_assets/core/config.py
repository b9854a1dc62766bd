"""Typed view of `params.yaml`: one model per section, every field documented, defaults only here.

The stages' sections are here; where and how a run executes (compute, Slurm, storage, tracking, schedule,
promotion) is in run_params.py, the base class of both in sections.py.

Loading (params_file.py) stops with a `ParamsError` that names the file, the key path and what is allowed, so a
typo in a long experiment config fails before any compute starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import Field, model_validator

from rl_assets.core.algorithms import ALGORITHMS, algorithm
from rl_assets.core.run_params import ComputeParams, PromotionParams, ScheduleParams, StorageParams, TrackingParams
from rl_assets.core.sections import Section


class ParamsError(ValueError):
    """A params file or override that cannot be used; the message names the file and key path."""



class TinyModelParams(Section):
    hidden_size: int = Field(128, ge=8, description="Width of the embedded Llama-style model.")
    num_layers: int = Field(4, ge=1, description="Decoder layers of the embedded model.")
    num_heads: int = Field(4, ge=1, description="Attention heads of the embedded model.")
    intermediate_size: int = Field(512, ge=8, description="MLP width of the embedded model.")

    @model_validator(mode="after")
    def _check_heads(self):  # what LlamaConfig would reject inside the first compute step
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"hidden_size/num_heads={self.hidden_size}/{self.num_heads}={self.hidden_size // self.num_heads} (the head size) "
                             "must be even: rotary position embeddings rotate pairs of dimensions")
        return self


class TinyVisionParams(Section):
    image_size: int = Field(48, ge=8, description="Side of the square the embedded VLM's images are resized to, in pixels.")
    patch_size: int = Field(8, ge=2, description="Side of a patch; each patch is one image token ((image_size / patch_size)^2 per image).")
    hidden_size: int = Field(64, ge=8, description="Width of the SigLIP vision tower.")
    num_layers: int = Field(2, ge=1, description="Encoder layers of the vision tower.")
    num_heads: int = Field(4, ge=1, description="Attention heads of the vision tower.")

    @model_validator(mode="after")
    def _check_shape(self):
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}")
        return self


class ModelParams(Section):
    name_or_path: str = Field("tiny", min_length=1, description="'tiny' (embedded, built locally), a local HF folder or a hub id.")
    tiny: TinyModelParams = Field(default_factory=TinyModelParams, description="Shape of the embedded model when name_or_path is 'tiny'.")
    vision: TinyVisionParams | None = Field(None, description="With name_or_path 'tiny': the embedded model reads images, a LLaVA made of the "
                                                              "tiny Llama and a SigLIP vision tower of this shape (rl_assets.core.vision). "
                                                              "null: text only. A hub or local VLM brings its own.")

    @model_validator(mode="after")
    def _check_vision(self):
        if self.vision is not None and self.name_or_path != "tiny":
            raise ValueError(f"vision shapes the embedded model only; name_or_path={self.name_or_path!r} brings its own vision tower")
        return self


# Keyword arguments the rewards stage already passes to reward functions; an extra column may not shadow them.
RESERVED_EXTRA = ("answer", "completion", "completion_ids", "completions", "image_ids", "prompt", "prompt_id", "prompts", "truncated")


class ColumnsParams(Section):
    prompt: str = Field("prompt", min_length=1, description="The source's column holding the problem text.")
    answer: str = Field("answer", min_length=1, description="The source's column holding the reference answer (text or a number).")
    extra: list[str] = Field(default_factory=list, description="Columns passed on to reward functions as keyword arguments, by their own name.")
    image: str | None = Field(None, min_length=1, description="The source's column holding the row's image: a path relative to the source "
                                                              "file's folder, the file's bytes, or a datasets Image value; stored "
                                                              "content-addressed in <data>/images (rl_assets.data.images). null: text only.")

    @model_validator(mode="after")
    def _check_extra(self):
        reserved = sorted(set(self.extra) & set(RESERVED_EXTRA))
        if reserved:
            raise ValueError(f"extra columns {reserved} would shadow reward arguments; reserved: {list(RESERVED_EXTRA)}")
        repeated = sorted({c for c in self.extra if self.extra.count(c) > 1})
        if repeated:
            raise ValueError(f"extra lists columns more than once: {repeated}")
        return self


class SourceParams(Section):
    kind: Literal["generator", "python", "jsonl", "csv", "parquet", "hf_dataset"] = Field(
        description="generator: templates JSON; python: your 'module:function'; jsonl/csv/parquet: a file; hf_dataset: a save_to_disk folder.")
    path: str | None = Field(None, min_length=1, description="File or folder, relative to the project root (every kind but python).")
    function: str | None = Field(None, description="python only: 'module:function' called as function(count=..., seed=...) -> list of row dicts.")
    count: int = Field(0, ge=0, description="Rows to generate (generator and python only).")
    columns: ColumnsParams = Field(default_factory=ColumnsParams, description="Which columns hold the prompt, the answer and extra reward inputs.")
    split: str | None = Field(None, min_length=1, description="hf_dataset only: the split of a saved DatasetDict.")
    weight: float = Field(1.0, gt=0, description="Share of raw_data.max_rows drawn from this source, relative to the other weights.")
    on_bad_rows: Literal["error", "skip"] | None = Field(None, description="Overrides raw_data.on_bad_rows for this source.")

    @model_validator(mode="after")
    def _check_kind(self):
        generated = self.kind in ("generator", "python")
        if generated and self.count < 1:
            raise ValueError(f"a {self.kind} source needs count >= 1")
        if not generated and self.count:
            raise ValueError("count applies to generator and python sources only")
        if (self.kind == "python") != (self.function is not None):
            raise ValueError("function ('module:function') is required for, and only for, python sources")
        if self.function is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.function):
            raise ValueError(f"function must be 'module:function', got {self.function!r}")
        if (self.kind == "python") == (self.path is not None):
            raise ValueError("python sources take function, not path" if self.kind == "python" else f"a {self.kind} source needs a path")
        if self.kind == "generator" and self.columns != ColumnsParams():
            raise ValueError("columns do not apply to generator sources (templates define prompt and answer)")
        if self.split is not None and self.kind != "hf_dataset":
            raise ValueError("split applies to hf_dataset sources only")
        return self


class RawDataParams(Section):
    sources: list[SourceParams] = Field(min_length=1, description="Where problems come from; all are merged into one table.")
    max_rows: int | None = Field(None, ge=1, description="Mix the sources to this many rows, split by weight (seeded draw without replacement); unset: every row.")
    on_bad_rows: Literal["error", "skip"] = Field("error", description="error: stop at the first bad row; skip: drop bad rows and report them.")

    @model_validator(mode="after")
    def _check_weights(self):
        if self.max_rows is None and any(s.weight != 1.0 for s in self.sources):
            raise ValueError("source weights apply only when raw_data.max_rows is set")
        return self


class PromptsParams(Section):
    eval_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="Share of unique problems held out for evaluation (hash-based, stable).")
    sft_fraction: float = Field(0.25, ge=0.0, lt=1.0, description="Share of the other problems kept for the SFT warm start; the rest are RL prompts.")
    max_prompt_tokens: int = Field(64, ge=1, description="Prompts longer than this (in the policy's tokens) are dropped.")
    template: str = Field("{prompt}", description="How a problem is shown to the model; must contain {prompt}.")
    chat_template: bool | str = Field(False, description="true: wrap the templated text as a user turn with the tokenizer's chat template; "
                                                         "a string: that Jinja chat template instead; false: plain text.")
    conflicting_answers: Literal["error", "drop", "first"] = Field(
        "error", description="A problem that appears with different answers (e.g. '3+4=' as 6, 7 and 8): error stops the prompts step "
                             "naming the rows; drop leaves every row of it out; first keeps the first answer. Each answer would otherwise "
                             "become a prompt of its own, split apart, so the same problem could be trained on and held out.")

    @model_validator(mode="after")
    def _check_template(self):
        if "{prompt}" not in self.template:
            raise ValueError("template must contain {prompt}")
        if isinstance(self.chat_template, str) and not self.chat_template.strip():
            raise ValueError("chat_template must be true, false or a non-empty Jinja template")
        return self


class SFTParams(Section):
    enabled: bool = Field(True, description="Warm-start r00 with supervised fine-tuning on the reference answers.")
    learning_rate: float = Field(3e-3, gt=0, description="Peak learning rate of the warm start.")
    max_steps: int = Field(300, ge=1, description="Optimizer steps of the warm start.")
    batch_size: int = Field(64, ge=1, description="Examples per optimizer step.")
    demonstration: list[str] = Field(default_factory=list, description="The policy's turns of a demonstration episode, format strings over the "
                                     "prompts row ({problem}, {answer}, {prompt}): the rollouts' tools or environment answer between them "
                                     "and their tokens carry no loss. Empty: the answer alone.")
    demonstration_share: float = Field(1.0, ge=0.0, le=1.0, description="Share of the sft rows shown as demonstration episodes (the first "
                                       "ones in table order); the others show the answer alone, as without `demonstration`.")


# The rollouts keys that make a rollout an episode: the evaluation runs its episodes with them too.
EPISODE_KEYS = ["rollouts.tools", "rollouts.tool_format", "rollouts.environment", "rollouts.max_turns", "rollouts.max_episode_tokens"]


class EnvironmentParams(Section):
    name: str = Field(min_length=1, description="A built-in environment (guess_the_number, tools) or 'module:Class' from your code.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of its constructor.")


class SelectionParams(Section):
    kind: Literal["uniform", "band", "priority"] = Field("uniform", description="How a round picks its B prompts from the rl split: "
                                                         "uniform (a seeded draw), band (only prompts whose pass rate so far lies "
                                                         "between low and high), priority (weighted toward a 50% pass rate); "
                                                         "rl_assets/rollout/selection.py.")
    low: float = Field(0.0, ge=0, lt=1, description="band: a prompt whose pass rate so far is at most this is skipped (never solved).")
    high: float = Field(1.0, gt=0, le=1, description="band: a prompt whose pass rate so far is at least this is skipped (always solved).")
    min_samples: int = Field(1, ge=1, description="Completions of a prompt that must have been scored before its pass rate counts; "
                                                  "fewer: it counts as not yet seen (always in the band, the largest priority).")
    experiments: list[str] = Field(default_factory=list, description="Other experiments whose rounds count toward the pass rates too "
                                                                     "(matched by prompt_id), e.g. an earlier run on the same data.")

    @model_validator(mode="after")
    def _ordered(self):
        if self.low >= self.high:
            raise ValueError(f"selection.low ({self.low}) must be below selection.high ({self.high})")
        return self


class RolloutsParams(Section):
    prompts_per_round: int = Field(64, ge=1, description="B: training prompts sampled each round.")
    samples_per_prompt: int = Field(8, ge=1, description="G: completions per prompt (the GRPO group).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; log-probs are stored under it.")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling threshold.")
    max_new_tokens: int = Field(8, ge=1, description="Completion length cap; longer completions are truncated.")
    batch_size: int = Field(256, ge=1, description="Sequences generated per forward batch.")
    logprob_batch_size: int = Field(64, ge=1, description="Sequences per forward pass when recomputing the stored log-probs (on a GPU memory grows with it; a CPU pass keeps its logits under 2^25 values).")
    engine: Literal["auto", "transformers", "vllm"] = Field("auto", description="auto: vLLM on a GPU when installed, else batched transformers generate.")
    staleness: int = Field(0, ge=0, description="k: round N samples from checkpoint N-1-k, so it need not wait for round N-1's training "
                                                "(0: from N-1, on-policy). Training corrects for the older sampler with truncated importance "
                                                "weights (train.sampler_correction_cap) against the parent's own log-probs.")
    decode: Literal["eager", "compiled"] = Field("eager", description="eager: one forward per step as written; compiled: a step of fixed shapes through torch.compile "
                                                     "(CUDA graphs on a GPU, where an eager step waits on kernel launches), compiled once per process and "
                                                     "batch size; the same completions for a seed up to the compiled kernels' rounding. vLLM ignores it.")
    tools: list[str] = Field(default_factory=list, description="Tools the policy may call (built in: calculator, python; or module:function "
                                                               "with type hints and a docstring): rollouts become episodes of calls and results.")
    tool_format: Literal["tagged", "hermes"] = Field("tagged", description="How calls are written: tagged `<call NAME>ARG</call>` (the embedded "
                                                                          "model), hermes `<tool_call>{json}</tool_call>` (Qwen2.5 chat templates).")
    environment: EnvironmentParams | None = Field(None, description="A multi-turn environment instead of tools (built in: guess_the_number).")
    max_turns: int = Field(4, ge=1, le=64, description="Policy turns per episode (tools or environment); an episode still going after them is truncated.")
    max_episode_tokens: int = Field(64, ge=1, description="Policy tokens per episode over all its turns (max_new_tokens caps each turn).")
    selection: SelectionParams = Field(default_factory=SelectionParams, description="Which prompts each round samples: uniform, or by "
                                                                                    "their pass rates over the rounds so far.")

    @model_validator(mode="after")
    def _one_environment(self):
        if self.tools and self.environment is not None:
            raise ValueError("set rollouts.tools or rollouts.environment, not both (the tools are an environment of their own)")
        if self.episodes and self.engine == "vllm":
            raise ValueError("rollouts.engine: vllm samples single completions; episodes (tools, environment) use engine: transformers")
        return self

    @property
    def episodes(self) -> tuple[str, dict] | None:
        """(environment name, options) when rollouts are episodes, else None."""
        if self.tools:
            return "tools", {"tools": self.tools, "format": self.tool_format}
        if self.environment is not None:
            return self.environment.name, self.environment.options
        return None


class RewardFunctionParams(Section):
    name: str = Field(min_length=1, description="A function in rl_assets.rewards, or 'module:function' from your code.")
    weight: float = Field(1.0, description="Weight in the total reward.")
    options: dict[str, Any] = Field(default_factory=dict, validate_default=True, description="Keyword arguments of the function, checked against its signature.")
    column: str | None = Field(None, pattern=r"^\w+$", description="Score column (score_<column>); defaults to the function's name.")

    @property
    def score_name(self) -> str:
        """The function's score column is `score_<score_name>`."""
        return self.column or self.name.rpartition(":")[2]


class RewardsParams(Section):
    functions: list[RewardFunctionParams] = Field(min_length=1, description="Weighted reward functions (TRL signature).")

    @model_validator(mode="after")
    def _unique_columns(self):
        columns = [f.score_name for f in self.functions]
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise ValueError(f"reward functions must have distinct names (one score column each; set `column` to tell them apart); repeated: {repeated}")
        return self


class RewardModelParams(Section):
    preference_data: str = Field(min_length=1, description="JSONL of preference pairs: chosen, rejected and optionally prompt per line.")
    name_or_path: str = Field("tiny", min_length=1, description="Base model: 'tiny' (the embedded model with a score head), a local HF folder or a hub id.")
    tiny: TinyModelParams = Field(default_factory=TinyModelParams, description="Shape of the embedded model when name_or_path is 'tiny'.")
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate of TRL's RewardTrainer.")
    max_steps: int = Field(100, ge=1, description="Optimizer steps.")
    batch_size: int = Field(16, ge=1, description="Preference pairs per optimizer step.")
    max_length: int = Field(256, ge=8, description="Pairs whose prompt + response is longer (in tokens) are dropped.")


class LoraParams(Section):
    enabled: bool = Field(False, description="Train LoRA adapters (PEFT) instead of all weights.")
    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: int = Field(32, ge=1, description="Adapter scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input. 0 (PEFT's, verl's and OpenRLHF's default): "
                           "with dropout the training forward is not the policy that sampled, so the first step's ratio is not 1, "
                           "and its masks held for the backward cost memory.")
    target_modules: list[str] | Literal["all-linear"] = Field("all-linear", description="Modules that get adapters.")
    merge: bool = Field(False, description="Save each round's checkpoint with adapters merged into full weights; "
                                           "off saves only the adapters (loading needs peft and the r00 folder).")
    load_in_4bit: bool = Field(False, description="QLoRA: the frozen base weights in 4-bit NF4 (bitsandbytes, CUDA only); needs merge off.")

    @model_validator(mode="after")
    def _check_qlora(self):
        if self.load_in_4bit and self.merge:
            raise ValueError("load_in_4bit cannot merge adapters into 4-bit weights; set merge: false")
        return self


class DPOParams(Section):
    beta: float = Field(0.1, gt=0, description="DPO temperature: strength of the implicit KL to the parent checkpoint.")
    loss_type: list[str] = Field(default_factory=lambda: ["sigmoid"], min_length=1, description="TRL DPO loss terms, e.g. [sigmoid, sft].")
    loss_weights: list[float] | None = Field(None, description="One weight per loss_type entry; None weighs them equally.")
    min_margin: float = Field(0.5, ge=0, description="A pair needs best - worst reward >= this (and > 0).")
    batch_size: int = Field(16, ge=1, description="Preference pairs per optimizer step (per process).")

    @model_validator(mode="after")
    def _check_weights(self):
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ValueError(f"loss_weights has {len(self.loss_weights)} entries for {len(self.loss_type)} loss types")
        return self


class RFTParams(Section):
    top_k: int = Field(1, ge=1, description="Best completions kept per prompt (expert iteration).")
    min_reward: float = Field(1.0, description="Completions below this total reward are never kept.")
    batch_size: int = Field(32, ge=1, description="Examples per optimizer step (per process).")


class PPOParams(Section):
    gamma: float = Field(1.0, ge=0, le=1, description="GAE's discount per policy token (1.0: the score at the end counts in full).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE's lambda: 1.0 Monte-Carlo returns, 0.0 one-step TD on the value model.")
    value_clip: float | None = Field(0.2, gt=0, description="How far a value may move from its pre-round estimate before the value loss "
                                                            "stops pulling it (PPO's clipped value loss); null: unclipped.")
    critic_learning_rate: float | None = Field(None, gt=0, description="AdamW learning rate of the value model; null: 10x "
                                                                       "train.learning_rate (verl's and OpenRLHF's defaults are 10-18x the "
                                                                       "policy's: a value head starts from nothing).")
    critic_epochs: int | None = Field(None, ge=1, description="Passes of the value model over a round's table; null: train.epochs.")
    critic_warmup_rounds: int = Field(0, ge=0, description="Rounds in which only the value model trains: the policy's checkpoint is its "
                                                           "parent's weights, so the first advantages come from a value model that has "
                                                           "seen returns.")
    critic_init: Literal["policy", "reward_model"] = Field(
        "policy", description="policy: r00's body with a zero value head (every value starts at 0, so round 1's advantages are the "
                              "returns); reward_model: the trained reward_model asset, head included (OpenRLHF's choice).")
    kl_in_reward: bool = Field(False, description="Take train.beta's KL to r00 as a per-token reward penalty, beta x (log pi_old - "
                                                  "log pi_ref), the classic RLHF form; false: as the k3 term of the loss, as GRPO does.")
    whiten_advantages: bool = Field(True, description="Normalise the GAE advantages to mean 0 and std 1 over the round's policy tokens.")
    critic_lora: bool = Field(False, description="Train the value model as LoRA adapters (train.lora's r, alpha, dropout and target "
                                                 "modules) and its value head on the frozen body it started from, saved as adapters "
                                                 "(works with or without a LoRA policy).")


class TrainParams(Section):
    algorithm: Literal[tuple(ALGORITHMS)] = Field(
        "grpo", description="grpo/rloo/reinforce_pp: policy gradient on the stored table; ppo: the same with a value model (the rNN/critic "
                            "asset) and GAE; dpo: TRL DPOTrainer on best-vs-worst pairs; rft: TRL SFTTrainer on the top-k completions "
                            "(rejection-sampling fine-tuning).")
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = Field("grpo", description="Token aggregation of the policy-gradient loss (TRL's names).")
    learning_rate: float = Field(1e-4, gt=0, description="AdamW peak learning rate.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field("constant", description="Learning-rate schedule within a round, after warmup.")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Share of a round's optimizer steps spent warming up linearly.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    epochs: int = Field(2, ge=1, description="Passes over the round's rollout table (or pairs / kept completions).")
    minibatch_size: int = Field(128, ge=1, description="Completions per optimizer step (global, across processes).")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches each process splits its share of a minibatch into.")
    epsilon: float = Field(0.2, gt=0, lt=1, description="Lower clip: the importance ratio is clipped to [1 - epsilon, 1 + epsilon_high].")
    epsilon_high: float | None = Field(None, gt=0, description="Upper clip (DAPO's clip-higher, e.g. 0.28); None means epsilon.")
    beta: float = Field(0.0, ge=0, description="Weight of the k3 KL penalty to the reference (r00) policy; 0 turns it off.")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="GRPO's std scaling of advantages; none is Dr. GRPO.")
    sampler_correction_cap: float | None = Field(3.0, gt=0, description="Cap of the truncated importance weights that correct for a sampler "
                                                                        "other than the trainer (vLLM's own log-probs, TRL's token_truncate; an "
                                                                        "older checkpoint with rollouts.staleness); null: off.")
    mask_truncated_completions: bool = Field(False, description="Leave completions that hit max_new_tokens out of the loss (DAPO).")
    drop_equal_reward_groups: bool = Field(False, description="Train only on groups whose rewards differ (DAPO's dynamic-sampling filter, as "
                                                              "verl applies it): all-equal groups have advantage 0, so they are left out of "
                                                              "the loss, its normalisation and the KL penalty. A round keeps its optimizer steps, "
                                                              "each on a near-equal share of the rows kept, and costs fewer rows; the token "
                                                              "metrics (the entropy guard's too) then cover the trained rows only.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    freeze_vision: bool = Field(False, description="A vision-language policy's vision encoder and projector keep their weights: only the "
                                                   "language model trains (with LoRA, adapters on the language model alone).")
    mixed_precision: Literal["auto", "no", "bf16", "fp16", "pure_bf16"] = Field(
        "auto", description="auto: bf16 where the GPU supports it, else fp16 with loss scaling, fp32 on CPU; bf16/fp16 keep fp32 master "
                            "weights under autocast; pure_bf16: bf16 weights and updates (half the memory, small updates round away).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass to save memory.")
    save_steps: int = Field(0, ge=0, description="Save the full training state every this many optimizer steps (0: never); a rerun resumes.")
    keep_last: int = Field(2, ge=1, description="Intermediate training states kept per round; older ones are deleted.")
    resume: bool = Field(True, description="Resume from a saved state of the same round; false discards it and starts over.")
    carry_optimizer_state: bool = Field(False, description="Keep AdamW's moments from round to round, as one long TRL run does (the "
                                                           "moments of each checkpoint on disk in data/run_state/optimizer/<checkpoint id>.pt, "
                                                           "never in a checkpoint: 2x the weights per round); off starts each round fresh.")
    checkpoint_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="The dtype of a round's saved weights. bfloat16 halves a checkpoint on disk, in DVC's cache and on the "
                               "remote; the saved weights are rounded to 8 significant bits (relative error up to 2^-9), and evaluation, "
                               "serving and promotion use them as saved. The next round samples and trains from the float32 weights, "
                               "kept in data/run_state/weights until two rounds later. LoRA adapters (lora.merge off) are saved as they are.")
    lora: LoraParams = Field(default_factory=LoraParams)
    ppo: PPOParams = Field(default_factory=PPOParams, description="The value model and GAE of algorithm ppo.")
    dpo: DPOParams = Field(default_factory=DPOParams)
    rft: RFTParams = Field(default_factory=RFTParams)

    @model_validator(mode="after")
    def _check_batches(self):
        if self.minibatch_size % self.gradient_accumulation_steps:
            raise ValueError(f"minibatch_size={self.minibatch_size} must be a multiple of gradient_accumulation_steps={self.gradient_accumulation_steps}")
        return self


class EvaluationParams(Section):
    max_prompts: int = Field(200, ge=1, description="Held-out prompts evaluated per checkpoint.")
    samples_per_prompt: int = Field(4, ge=1, description="Samples per prompt for sampled accuracy.")
    temperature: float = Field(1.0, gt=0, description="Temperature of sampled accuracy.")
    greedy: bool = Field(True, description="Also report greedy accuracy (one more completion per prompt); false: sampled only.")
    batch_size: int = Field(256, ge=1, description="Completions generated at once (memory, and speed: on CPU a smaller batch can be faster).")
    max_new_tokens: int = Field(8, ge=1, description="Completion length cap at evaluation.")
    decode: Literal["eager", "compiled"] = Field("eager", description="As rollouts.decode, for the held-out completions.")
    correctness: str | None = Field(None, description="The reward function (its score column name) whose score 1 counts as correct; "
                                                      "default: the first of rewards.functions.")

    def correctness_problem(self, rewards: RewardsParams) -> str | None:
        """Why `correctness` names none of the reward functions' score columns (None when it names one).

        Checked by the preflight after it loads the reward functions, not while parsing: a misspelt function
        ('my_rewards:corect') changes its score column too, and its own error is the one that points at the fix.
        """
        names = [f.score_name for f in rewards.functions]
        if self.correctness is None or self.correctness in names:
            return None
        return f"evaluation.correctness: {self.correctness!r} is not one of the reward functions {names}"


class GuardsParams(Section):
    kl_max: float = Field(0.03, gt=0, description="A checkpoint whose KL to the reference exceeds this fails its blocking check; later rounds stop.")
    kl_rows: int = Field(64, ge=1, description="Rollout rows of each round the KL to the reference is measured on, exact over the vocabulary "
                                                "(the first sample of every prompt, then the second, ...): each costs a forward of the policy "
                                                "and of the reference.")
    entropy_min: float = Field(0.01, ge=0, description="Mean token entropy (nats) below this counts as a collapsed policy (blocking).")
    reward_drop_max: float = Field(0.1, ge=0, description="Mean rollout reward may fall at most this much below the previous round's (warning).")
    accuracy_drop_max: float = Field(0.05, ge=0, description="Sampled held-out accuracy may fall at most this much below the previous checkpoint's (warning).")
    explained_variance_min: float = Field(-0.5, description="ppo: the parent value model's explained variance of a round's returns "
                                                             "below this is reported (warning); 0 is a constant's, 1 a perfect model's.")
    tool_error_share_max: float = Field(0.5, ge=0, le=1, description="Share of an episode table's tool calls that may fail (warning).")
    truncated_episode_share_max: float = Field(0.5, ge=0, le=1, description="Share of episodes that may end at a turn or token limit (warning).")
    hacking_window: int = Field(2, ge=1, description="Reward-hacking guard (blocking, on the evaluation, so before promotion): over this many "
                                "rounds, the training reward of a policy's rollouts may not rise while its held-out accuracy under "
                                "evaluation.correctness falls, nor may that check call a growing share of its rewarded rollouts wrong.")
    hacking_accuracy_fall_min: float = Field(0.02, ge=0, description="Reward-hacking guard: a fall of held-out accuracy counts when it is at "
                                             "least this and beyond two paired standard errors (noise alone does not fire it).")
    hacking_disagreement_rise_max: float = Field(0.2, ge=0, le=1, description="Reward-hacking guard: the share of rewarded rollouts (reward "
                                                 "above their prompt group's mean) that evaluation.correctness scores wrong may rise at "
                                                 "most this over the window.")


class Params(Section):
    experiment: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                            description="Which experiment a run belongs to: runs, promotion and rollback are kept apart by it. "
                                        "Absent: 'default' for ./params.yaml, else the params file's path (examples/gsm8k/params.yaml "
                                        "-> examples-gsm8k-params).")
    seed: int = Field(0, ge=0, description="Seed of every random choice in the pipeline.")
    rounds: int = Field(3, ge=1, le=99, description="R: RL rounds, each rollouts -> rewards -> checkpoint.")
    owners: list[str] = Field(default_factory=list, description="Owners of every asset in the Dagster UI: emails or 'team:name'.")
    compute: ComputeParams = Field(default_factory=ComputeParams)
    model: ModelParams = Field(default_factory=ModelParams)
    raw_data: RawDataParams
    prompts: PromptsParams = Field(default_factory=PromptsParams)
    sft: SFTParams = Field(default_factory=SFTParams)
    rollouts: RolloutsParams = Field(default_factory=RolloutsParams)
    rewards: RewardsParams
    reward_model: RewardModelParams | None = Field(None, description="Train the reward_model asset from preference pairs (off when absent).")
    train: TrainParams = Field(default_factory=TrainParams)
    evaluation: EvaluationParams = Field(default_factory=EvaluationParams)
    guards: GuardsParams = Field(default_factory=GuardsParams)
    schedule: ScheduleParams = Field(default_factory=ScheduleParams)
    promotion: PromotionParams = Field(default_factory=PromotionParams)
    tracking: TrackingParams = Field(default_factory=TrackingParams, description="Experiment trackers (TensorBoard by default).")
    storage: StorageParams = Field(default_factory=StorageParams, description="A remote for outputs and run state, and retention.")

    @model_validator(mode="after")
    def _check_vision(self):
        if self.model.vision is not None and algorithm(self.train.algorithm).value_model and self.train.ppo.critic_init == "reward_model":
            raise ValueError("train.ppo.critic_init: reward_model reads text only, and the policy reads images (model.vision); "
                             "use critic_init: policy")
        return self

    @model_validator(mode="after")
    def _check_critic(self):
        if algorithm(self.train.algorithm).value_model and self.train.ppo.critic_init == "reward_model" and self.reward_model is None:
            raise ValueError("train.ppo.critic_init: 'reward_model' starts the value model from the reward_model asset, and params have "
                             "no reward_model section; add one or set critic_init: policy")
        if algorithm(self.train.algorithm).value_model and self.train.drop_equal_reward_groups:
            raise ValueError("train.drop_equal_reward_groups leaves out groups whose rewards are equal, and ppo's value model makes "
                             "advantages from every row (a group of one is always 'equal'); set it to false with algorithm ppo")
        if algorithm(self.train.algorithm).value_model and self.train.ppo.critic_warmup_rounds >= self.rounds:
            raise ValueError(f"train.ppo.critic_warmup_rounds: {self.train.ppo.critic_warmup_rounds} of rounds={self.rounds} would leave "
                             "the policy untrained; warm-up rounds must be fewer than rounds")
        return self

    @model_validator(mode="after")
    def _check_sharding(self):
        if self.compute.sharding != "fsdp":
            return self
        if self.train.lora.enabled:
            raise ValueError("compute.sharding fsdp with train.lora: LoRA adapters are not sharded yet; use sharding none (DDP), "
                             "whose memory LoRA already cuts")
        if self.train.mixed_precision == "fp16":
            raise ValueError("compute.sharding fsdp with train.mixed_precision fp16: the sharded step has no loss scaler; use bf16")
        if algorithm(self.train.algorithm).trainer != "policy_gradient":
            raise ValueError(f"compute.sharding fsdp shards the policy-gradient step; train.algorithm {self.train.algorithm!r} trains "
                             "with TRL's trainer: give it an Accelerate FSDP config (compute.accelerate_config) instead")
        return self

    @model_validator(mode="after")
    def _check_groups(self):
        if self.rollouts.samples_per_prompt < 2 and (group := algorithm(self.train.algorithm).group):
            raise ValueError(f"rollouts.samples_per_prompt: {self.rollouts.samples_per_prompt} gives each prompt a group of one, and "
                             f"train.algorithm {self.train.algorithm!r} learns by comparing a prompt's completions with each other "
                             f"({group}): nothing would be learned. Set samples_per_prompt to 2 or more "
                             "(4-16 is usual), or use algorithm 'rft', which keeps single completions by their reward")
        return self

    @model_validator(mode="after")
    def _check_owners(self):
        bad = [o for o in self.owners if not (o.startswith("team:") and len(o) > 5) and not re.fullmatch(r"[^@\s]+@[^@\s]+", o)]
        if bad:
            raise ValueError(f"owners must be emails or 'team:name', not {bad}")
        return self

    def section_hash(self, *sections: str) -> str:
        """Content hash of the named sections, stored in lineage so a result names the params it used."""
        blob = json.dumps({s: self.model_dump(mode="json")[s] for s in sections}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
