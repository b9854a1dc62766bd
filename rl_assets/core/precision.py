"""One precision rule for every step that runs the policy: sampling, stored log-probs, training, evaluation.

`train.mixed_precision` decides it. Mixed precision (`bf16`, `fp16`) keeps fp32 master weights and
runs the forward passes under autocast, so small AdamW updates are not rounded away (transformers 5
keeps a bf16 hub checkpoint in bf16 unless told otherwise, so every loader asks for fp32).
`pure_bf16` is the separate, explicit choice of bf16 weights and bf16 updates. The rollouts step
computes its stored log-probs under the same weights dtype and autocast as the trainer's forward,
so training's first importance ratio is 1.
"""

from __future__ import annotations

import contextlib

import torch


def resolve_mixed_precision(requested: str, device: str) -> str:
    """auto: bf16 on GPUs that support it, fp16 (with loss scaling) on older GPUs, fp32 ("no") on CPU.

    >>> resolve_mixed_precision("auto", "cpu")
    'no'
    >>> resolve_mixed_precision("fp16", "cpu")
    Traceback (most recent call last):
    ...
    ValueError: train.mixed_precision: fp16 needs a GPU (loss scaling is CUDA-only); use auto, no or bf16 on CPU
    """
    if requested == "fp16" and not device.startswith("cuda"):
        raise ValueError("train.mixed_precision: fp16 needs a GPU (loss scaling is CUDA-only); use auto, no or bf16 on CPU")
    if requested != "auto":
        return requested
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"


def weights_dtype(mode: str) -> torch.dtype:
    """The dtype the policy's weights are loaded and kept in: fp32 master weights unless pure bf16.

    >>> weights_dtype("bf16"), weights_dtype("pure_bf16")
    (torch.float32, torch.bfloat16)
    """
    return torch.bfloat16 if mode == "pure_bf16" else torch.float32


def accelerate_mixed_precision(mode: str) -> str:
    """What Accelerate is told: autocast for mixed precision; nothing for fp32 or pure bf16 (the weights are already bf16)."""
    return mode if mode in ("bf16", "fp16") else "no"


def compute_autocast(mode: str, device: str):
    """The autocast context of the trainer's forward pass (Accelerate's, for `accelerate_mixed_precision(mode)`), for use outside it.

    >>> with compute_autocast("no", "cpu"):
    ...     torch.ones(2, 2).mm(torch.ones(2, 2)).dtype
    torch.float32
    """
    amp = accelerate_mixed_precision(mode)
    if amp == "no":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def trainer_precision(requested: str, use_cpu: bool) -> dict:
    """The bf16 / fp16 / use_cpu flags of a transformers TrainingArguments for `requested` (see resolve_mixed_precision).

    >>> trainer_precision("auto", use_cpu=True)
    {'bf16': False, 'fp16': False, 'use_cpu': True}
    """
    mode = resolve_mixed_precision(requested, "cpu" if use_cpu else "cuda")
    return {"bf16": mode in ("bf16", "pure_bf16"), "fp16": mode == "fp16", "use_cpu": use_cpu}
