"""The plain training loop gpu_check.sh measures the trainer against: the same r00 weights and round-1 rollouts,
forward + backward + AdamW step in micro-batches, nothing else (no advantages, no clipping, no logging).

    python bench/gpu_plain_loop.py OUT.json    # in gpu_check.sh's work folder, after its train step

Micro-batches, accumulation, gradient checkpointing and the number of optimizer steps are the trainer's (params.yaml
and the r01 card's steps).

Two precisions side by side: fp32 weights under bf16 autocast (what train.mixed_precision: bf16 does) and pure bf16
weights; on a CPU run without bf16, fp32 only. Tokens are the non-padding prompt + completion tokens, as the trainer's
tokens_per_second counts them; the first micro-batch is a warm-up and is not timed.
"""

import json
import sys
import time
from pathlib import Path

import torch

from rl_assets.core.params_file import load_params
from rl_assets.core.paths import DATA, checkpoint_key, output_path
from rl_assets.core.policy import load_policy
from rl_assets.core.schemas import read_table


def micro_batches(rollouts, micro: int, pad_id: int, device: str):
    """(input_ids, attention_mask, completion mask, non-padding tokens) for each run of `micro` rows, right-padded."""
    prompts, completions = rollouts["prompt_ids"].to_pylist(), rollouts["completion_ids"].to_pylist()
    for start in range(0, len(prompts), micro):
        rows = [(p, c) for p, c in zip(prompts[start : start + micro], completions[start : start + micro])]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), pad_id)
        mask, scored = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
        for i, (p, c) in enumerate(rows):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            mask[i, : len(p) + len(c)] = 1
            scored[i, len(p) : len(p) + len(c)] = True
        yield ids.to(device), mask.to(device), scored.to(device), int(mask.sum())


def run(dtype: torch.dtype, autocast: bool, micro: int, accum: int, steps: int, checkpointing: bool, device: str) -> dict:
    model, tokenizer = load_policy(output_path(checkpoint_key(0), DATA), device, dtype=dtype)
    if checkpointing:
        model.config.use_cache = False
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    batches = list(micro_batches(read_table(output_path("r01/rollouts", DATA), "rollouts"), micro, tokenizer.pad_token_id, device))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def micro_step(ids, mask, scored):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # fp32 as the trainer's
        (-(logprobs * scored[:, 1:]).sum() / scored.sum() / accum).backward()

    micro_step(*batches[0][:3])  # warm-up: kernels, allocator
    optimizer.zero_grad(set_to_none=True)
    sync()
    started, tokens, done = time.perf_counter(), 0, 0
    for step in range(steps):
        for k in range(accum):
            ids, mask, scored, n = batches[(step * accum + k) % len(batches)]
            micro_step(ids, mask, scored)
            tokens += n
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done += 1
    sync()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"tokens_per_s": round(tokens / seconds), "seconds": round(seconds, 2), "steps": done, "peak_gib": peak and round(peak, 2)}


def main() -> None:
    train = load_params("params.yaml").train
    accum = train.gradient_accumulation_steps
    micro, checkpointing = train.minibatch_size // accum, train.gradient_checkpointing
    steps = json.loads((output_path(checkpoint_key(1), DATA) / "lineage.json").read_text())["metrics"]["steps"]
    out = sys.argv[1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {"fp32 weights + bf16 autocast": run(torch.float32, True, micro, accum, steps, checkpointing, device)} if device == "cuda" else {}
    if device == "cuda":
        torch.cuda.empty_cache()  # the first run's model and moments are gone with its frame
        torch.cuda.reset_peak_memory_stats()
        results["bf16 weights"] = run(torch.bfloat16, False, micro, accum, steps, checkpointing, device)
    else:
        results["fp32"] = run(torch.float32, False, micro, accum, steps, checkpointing, device)
    Path(out).write_text(json.dumps(results))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
