"""Throughput on a real pretrained model: rl-assets' sampling, log-prob pass and training vs the plain loops, and matmul peaks.

    .venv/bin/python bench/real_model.py [--model base_models/smollm2-135m-instruct] [--threads 2]
                                         [--prompts 32] [--samples 4] [--max-new-tokens 24] [--batch-size 128] [--decode eager]
                                         [--train-rows 64] [--completion-tokens 16] [--accum 4] [--epochs 1]
                                         [--logprob-batch-size 64] [--precisions no,bf16,pure_bf16]
                                         [--cases sampling,logprobs,training,matmul] [--repeats 3] [--json PATH]

The model is a plain Hugging Face folder (default SmolLM2-135M-Instruct, which `make real-model` imports),
on CPU with torch.set_num_threads(--threads). Each precision runs in its own worker process
(`real_model.py --worker MODE`): the model is loaded fresh in that precision's weights dtype, and
Accelerate's process-wide state (which fixes one mixed precision per process) starts clean. The
precisions are rl-assets' `train.mixed_precision` modes (rl_assets/core/precision.py): `no` (fp32 weights),
`bf16` (fp32 weights, forward passes under CPU bf16 autocast) and `pure_bf16` (bf16 weights and updates).
Both sides of a precision hold their own copy of the model, get the same inputs and batch sizes, and
are timed side by side: one warm-up call of each (not timed), then --repeats calls alternating which
side goes first. A side's figure is the median over its calls (the best is in the JSON too).

  sampling  completion tokens/s. Prompts: word-arithmetic questions ("What is 12 plus 7? Reply with just
            the number.") rendered with the tokenizer's chat template, --prompts of them x --samples each,
            in batches of --batch-size, temperature --temperature, --max-new-tokens. rl-assets:
            `rollouts.generate(..., autocast=compute_autocast(mode))`, with `--decode compiled` its compiled static
            loop (rollouts.decode; compiled in the untimed warm-up call) (its time includes tokenizing the
            prompts and decoding the completions). Plain: a bare `model.generate(input_ids, attention_mask,
            do_sample=True, temperature, top_k=0, top_p=1.0, max_new_tokens, pad_token_id, eos_token_id)`
            loop over left-padded batches built beforehand, under `torch.autocast("cpu", bf16)` for `bf16`
            (top_k=0, top_p=1.0: the distribution rl-assets samples; it draws differently, so the completions
            differ: `mean_completion_tokens` gives each side's mean length). Tokens are counted up to and
            including each row's first end-of-sequence id, on both sides.
  logprobs  the rollouts step's stored log-prob pass under no_grad, prompt + completion tokens/s, in
            micro-batches of --logprob-batch-size. rl-assets: `rollouts.completion_logprobs` under the
            precision's autocast, kept per row as `sample_rollouts` stores them. Plain: a right-padded
            forward with `logits_to_keep` (only the positions from the shortest prompt's last token on get
            logits), log_softmax in fp32, gather. `max_abs_diff` is the largest per-token difference.
  training  one `train_on_rollouts` call (GRPO, --epochs epochs, minibatch = all --train-rows rows, --accum
            micro-batches, beta 0, lr --lr) vs a plain loop over the same micro-batches (the same row order:
            the permutation train_on_rollouts draws for seed 0): right-padded forward with logits_to_keep,
            fp32 log_softmax at the completion positions, GRPO's clipped loss (per-sequence token mean)
            with random advantages, backward, clip_grad_norm_(1.0), AdamW step (weight decay 0), under the
            precision's autocast / weights. The plain AdamW is created once and kept across calls (a plain
            loop holds it). rl-assets trains a fresh load of the model each call (loaded off the clock, as a
            round starts from its parent checkpoint); its time includes what one call sets up (Accelerator,
            a fresh AdamW whose moments are allocated at the first step, the optimizer state it returns), so
            at one step per call the ratio is a lower bound for longer rounds (--epochs amortizes the setup).
            Prompt + completion tokens/s.
            Sequences: --samples rows per prompt (the same chat prompts, --train-rows / --samples of them)
            with RANDOM completion ids (no special tokens) of 1/2 to 1x --completion-tokens tokens, the
            shorter ones ending in the EOS id; rewards random. The stored log-probs are rl-assets' own pass
            in the same precision (outside the timing), so `first_call_kl_old` (train_on_rollouts' kl_old on
            its warm-up call, at the first step) shows whether the first ratio is 1.
  matmul    a --matmul-size square matmul (2048) in fp32 and in bf16 in the parent process on the same
            threads, best of max(5, --repeats) after a warm-up: GFLOP/s = 2 n^3 / s.

Achieved FLOP/s: training 6 x P x tokens / s, the log-prob pass 2 x P x tokens / s, with P = the
parameters less the input embedding, plus the LM head's matrix when it is tied to it (SmolLM2: a
49,152 x 576 matmul per token), so every weight matrix a token goes through counts once. Attention's own FLOPs (small at these
lengths), the log_softmax and the optimizer are not counted. Training's figure is compared with the
matmul of its compute dtype (fp32 for `no`, bf16 for `bf16` and `pure_bf16`).

Prints a table per case with the ratios rl-assets / plain in the same precision and rl-assets / the
fastest plain precision, all measured in this run, and a JSON summary (--json PATH to also write it).
Targets (issue 31): rollouts >= 0.8x the fastest plain sampling loop; training >= 0.8x the fastest plain
training loop whose precision keeps the first ratio at 1 and the fp32 run's accuracy (accuracy is not
measured here). Exit code 0 whatever the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "base_models" / "smollm2-135m-instruct"
CASES = ("sampling", "logprobs", "training", "matmul")
WORKER_CASES = ("sampling", "logprobs", "training")
PRECISIONS = ("no", "bf16", "pure_bf16")
SIDES = ("rl_assets", "plain")
TARGET = 0.8  # rl-assets >= TARGET x the fastest plain loop
OPERATIONS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


# --- inputs --------------------------------------------------------------------------------------------------------------


def questions(count: int, seed: int) -> list[str]:
    """Word-arithmetic questions, distinct, seeded."""
    rng, seen = random.Random(seed), []
    while len(seen) < count:
        a, b, op = rng.randint(2, 99), rng.randint(2, 20), rng.choice(list(OPERATIONS))
        text = f"What is {a} {op} {b}? Reply with just the number."
        if text not in seen:
            seen.append(text)
    return seen


def chat_prompts(tokenizer, texts: list[str]) -> list[str]:
    """Each question as a user turn in the tokenizer's chat template (the question alone when it has none)."""
    if not tokenizer.chat_template:
        return texts
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True) for t in texts]


def end_ids(model, tokenizer) -> list[int]:
    """The ids a completion stops at: the tokenizer's EOS and the checkpoint's generation-config EOS ids."""
    ids = []
    for value in (tokenizer.eos_token_id, model.generation_config.eos_token_id):
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids


def completion_length(row: list[int], eos: list[int]) -> int:
    """Tokens up to and including the first end-of-sequence id (the whole row when there is none)."""
    for index, token in enumerate(row):
        if token in eos:
            return index + 1
    return len(row)


def training_sequences(tokenizer, args, eos: int) -> tuple[list[str], list[list[int]], list[list[int]], list[bool]]:
    """(prompt texts, prompt ids, completion ids, truncated) of --train-rows rows: --samples rows per chat prompt, random completions."""
    texts = chat_prompts(tokenizer, questions(args.train_rows // args.samples, args.seed + 1))
    prompt_ids = [ids for ids in tokenizer(texts)["input_ids"] for _ in range(args.samples)]
    special = set(tokenizer.all_special_ids)
    vocabulary = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(args.seed + 2)
    completions, truncated = [], []
    for _ in prompt_ids:
        length = rng.randint(max(1, args.completion_tokens // 2), args.completion_tokens)
        ids = [rng.choice(vocabulary) for _ in range(length)]
        if length < args.completion_tokens:  # a finished answer ends in EOS; a full-length one was cut off
            ids[-1] = eos
        completions.append(ids)
        truncated.append(length == args.completion_tokens)
    return [t for t in texts for _ in range(args.samples)], prompt_ids, completions, truncated


def right_padded(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad: int) -> dict:
    """A plain loop's batch: right-padded ids and mask, how many trailing positions need logits, and the completion mask over them.

    Logits are kept from the shortest prompt's last position on (`logits_to_keep`); position j of the
    kept logits (but the last) predicts token start + 1 + j, where start = shortest prompt length - 1.
    """
    import torch

    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    width, start = max(lengths), min(map(len, prompt_ids)) - 1
    input_ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    mask = torch.zeros(len(lengths), width - start - 1)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, : lengths[i]] = torch.tensor(p + c)
        attention[i, : lengths[i]] = 1
        mask[i, len(p) - 1 - start : len(p) - 1 - start + len(c)] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "keep": width - start, "targets": input_ids[:, start + 1 :], "mask": mask}


def plain_logprobs(model, batch: dict, autocast, temperature: float):
    """(N, kept - 1) per-token log-probs of the kept positions' next tokens: forward, fp32 log_softmax, gather."""
    import torch

    with autocast:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=batch["keep"]).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return logp.gather(-1, batch["targets"][..., None]).squeeze(-1)


# --- timing --------------------------------------------------------------------------------------------------------------


def side_by_side(calls: dict, repeats: int, prepare: dict | None = None) -> tuple[dict, dict, dict]:
    """One warm-up call of each side (not timed), then `repeats` rounds alternating which side goes first.

    `prepare[side]`, when given, runs before each of that side's calls, off the clock.
    Returns (seconds per timed call, outputs of the timed calls, output of the warm-up call), each by side.
    """
    prepare = prepare or {}
    warm_up = {}
    for name, call in calls.items():
        prepare.get(name, lambda: None)()
        warm_up[name] = call()
    seconds, outputs = {name: [] for name in calls}, {name: [] for name in calls}
    names = list(calls)
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else names[::-1]:
            prepare.get(name, lambda: None)()
            started = time.perf_counter()
            out = calls[name]()
            seconds[name].append(time.perf_counter() - started)
            outputs[name].append(out)
    return seconds, outputs, warm_up


def rates(tokens: list[int], seconds: list[float]) -> dict:
    """Tokens/s of each timed call: the median (the figure used), the best, and the raw numbers."""
    per_call = [t / s for t, s in zip(tokens, seconds)]
    return {"tokens_per_s": statistics.median(per_call), "best_tokens_per_s": max(per_call), "tokens": tokens[0],
            "seconds": [round(s, 4) for s in seconds]}


# --- the worker: one precision, every case ------------------------------------------------------------------------------


def load_model(path: Path, mode: str):
    """A fresh copy in this precision's weights dtype (fp32 master weights unless pure bf16), in eval mode."""
    from transformers import AutoModelForCausalLM

    from rl_assets.core.precision import weights_dtype

    model = AutoModelForCausalLM.from_pretrained(path, dtype=weights_dtype(mode))
    model.eval()
    return model


def flop_parameters(model) -> int:
    """Parameters a token's forward multiplies through: all but the input embedding, plus the LM head when tied to it."""
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # a tied matrix counts once here
    return total - embedding.numel() + (head.numel() if head.data_ptr() == embedding.data_ptr() else 0)


def plain_autocast(mode: str):
    """The plain loops' precision context: CPU bf16 autocast for `bf16`, nothing for fp32 or bf16 weights."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()


def measure_sampling(args, mode: str, models: dict, tokenizer) -> dict:
    import torch

    from rl_assets.core.precision import compute_autocast
    from rl_assets.rollout.generation import generate

    texts = chat_prompts(tokenizer, questions(args.prompts, args.seed))
    eos, pad = end_ids(models["plain"], tokenizer), tokenizer.pad_token_id
    expanded = [ids for ids in tokenizer(texts)["input_ids"] for _ in range(args.samples)]  # prompt-major, as rl-assets expands them
    batches = []
    for start in range(0, len(expanded), args.batch_size):  # left-padded, built before the clock starts
        chunk = expanded[start : start + args.batch_size]
        width = max(map(len, chunk))
        batches.append((torch.tensor([[pad] * (width - len(ids)) + ids for ids in chunk]),
                        torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk])))

    def ours():
        out = generate(models["rl_assets"], tokenizer, texts, args.samples, greedy=False, temperature=args.temperature,
                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, seed=args.seed, autocast=compute_autocast(mode, "cpu"),
                       compiled=args.decode == "compiled")
        return out.completion_ids

    def plain():
        torch.manual_seed(args.seed)
        rows = []
        with torch.no_grad(), plain_autocast(mode):
            for input_ids, attention in batches:
                sequences = models["plain"].generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=args.temperature,
                                                     top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens, pad_token_id=pad, eos_token_id=eos)
                rows += sequences[:, input_ids.shape[1] :].tolist()
        return rows

    seconds, outputs, _ = side_by_side({"rl_assets": ours, "plain": plain}, args.repeats)
    cut = {side: [row[: completion_length(row, eos)] for row in outputs[side][-1]] for side in SIDES}
    result = {side: rates([sum(completion_length(r, eos) for r in rows) for rows in outputs[side]], seconds[side]) for side in SIDES}
    result["completions"] = len(expanded)
    result["mean_completion_tokens"] = {side: round(sum(map(len, cut[side])) / max(len(expanded), 1), 2) for side in SIDES}
    return result


def stored_logprobs(model, mode: str, prompt_ids, completion_ids, pad: int, args) -> list[list[float]]:
    """rl-assets' stored log-prob pass, as `sample_rollouts` runs it: micro-batches, no_grad, the precision's autocast."""
    import torch

    from rl_assets.core.precision import compute_autocast
    from rl_assets.core.logprobs import completion_logprobs

    out = []
    with torch.no_grad(), compute_autocast(mode, "cpu"):
        for start in range(0, len(prompt_ids), args.logprob_batch_size):
            stop = start + args.logprob_batch_size
            lp, mask = completion_logprobs(model, prompt_ids[start:stop], completion_ids[start:stop], pad, args.temperature)
            out += [row[: int(m.sum())].tolist() for row, m in zip(lp.cpu(), mask.cpu())]
    return out


def measure_logprobs(args, mode: str, models: dict, tokenizer, sequences) -> dict:
    import torch

    _, prompt_ids, completion_ids, _ = sequences
    pad = tokenizer.pad_token_id
    tokens = sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))
    batches = [right_padded(prompt_ids[s : s + args.logprob_batch_size], completion_ids[s : s + args.logprob_batch_size], pad)
               for s in range(0, len(prompt_ids), args.logprob_batch_size)]

    def plain():
        out = []
        with torch.no_grad():
            for batch in batches:
                logp = plain_logprobs(models["plain"], batch, plain_autocast(mode), args.temperature)
                out += [row[m.bool()].tolist() for row, m in zip(logp, batch["mask"])]
        return out

    calls = {"rl_assets": lambda: stored_logprobs(models["rl_assets"], mode, prompt_ids, completion_ids, pad, args), "plain": plain}
    seconds, outputs, _ = side_by_side(calls, args.repeats)
    result = {side: rates([tokens] * len(seconds[side]), seconds[side]) for side in SIDES}
    pairs = [(a, b) for ours, theirs in zip(outputs["rl_assets"][-1], outputs["plain"][-1]) for a, b in zip(ours, theirs)]
    result["max_abs_diff"] = max((abs(a - b) for a, b in pairs), default=0.0)
    return result


def measure_training(args, mode: str, models: dict, tokenizer, sequences) -> dict:
    import pyarrow as pa
    import torch

    from rl_assets.core.config import TrainParams
    from rl_assets.core.schemas import ROLLOUTS, rewards_schema
    from rl_assets.train.policy_gradient import train_on_rollouts

    texts, prompt_ids, completion_ids, truncated = sequences
    n, G, pad = len(prompt_ids), args.samples, tokenizer.pad_token_id
    tokens = sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)) * args.epochs

    # rl-assets: a rollouts table as the rollouts step writes it (its stored log-probs from its own pass), random rewards.
    stored = stored_logprobs(models["rl_assets"], mode, prompt_ids, completion_ids, pad, args)
    rows = [{"round": 1, "prompt_id": f"q{i // G}", "sample_idx": i % G, "prompt": texts[i], "answer": "", "extra": "{}", "completion": "",
             "prompt_ids": prompt_ids[i], "completion_ids": completion_ids[i], "logprobs": stored[i], "truncated": truncated[i],
             "policy_id": "policy", "temperature": args.temperature, "top_p": 1.0, "max_new_tokens": args.completion_tokens, "seed": 0,
             "prompts_hash": "prompts"} for i in range(n)]
    rollouts = pa.Table.from_pylist(rows, schema=ROLLOUTS)
    rng = random.Random(args.seed + 3)
    rewards = pa.table({"round": rollouts["round"], "prompt_id": rollouts["prompt_id"], "sample_idx": rollouts["sample_idx"],
                        "policy_id": rollouts["policy_id"], "reward": [float(rng.random() < 0.5) for _ in range(n)],
                        "reward_config_hash": ["c"] * n, "rollouts_hash": ["h"] * n}, schema=rewards_schema([]))
    params = TrainParams(algorithm="grpo", loss_type="grpo", learning_rate=args.lr, epochs=args.epochs, minibatch_size=n,
                         gradient_accumulation_steps=args.accum, mixed_precision=mode, beta=0.0, gradient_checkpointing=False, save_steps=0)

    def fresh_policy():
        # Each call trains a fresh load (off the clock), the weights the stored log-probs came from, as a round starts from its
        # parent checkpoint. Also needed: after a bf16-autocast call the model no longer takes rl-assets' next log-prob pass.
        models["rl_assets"] = None
        models["rl_assets"] = load_model(args.model, mode)

    def ours():
        _, metrics, _, _ = train_on_rollouts(models["rl_assets"], rollouts, rewards, params, group_size=G, temperature=args.temperature,
                                             pad_id=pad, seed=0, max_new_tokens=args.completion_tokens, device="cpu", progress=False)
        return {k: metrics[k] for k in ("loss", "grad_norm", "steps", "kl_old", "clip_fraction")}

    # Plain: the same micro-batches (train_on_rollouts' row order for seed 0, epoch e), random advantages, one AdamW kept across calls.
    epochs = []
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        epochs.append([right_padded([prompt_ids[i] for i in micro], [completion_ids[i] for i in micro], pad) | {"rows": micro}
                       for micro in order.tensor_split(args.accum)])
    advantages = torch.randn(n, generator=torch.Generator().manual_seed(args.seed + 4))
    optimizer = torch.optim.AdamW(models["plain"].parameters(), lr=args.lr, weight_decay=0.0)
    epsilon = params.epsilon

    def plain():
        model = models["plain"]
        model.train()
        losses = []
        for micro_batches in epochs:
            for batch in micro_batches:
                logp = plain_logprobs(model, batch, plain_autocast(mode), args.temperature)
                ratio = torch.exp(logp - logp.detach())  # at the first step the stored log-probs are these: ratio 1
                advantage = advantages[batch["rows"]][:, None]
                per_token = -torch.min(ratio * advantage, ratio.clamp(1 - epsilon, 1 + epsilon) * advantage)
                mask = batch["mask"]
                loss = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean() / args.accum
                loss.backward()
                losses.append(loss.item())
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        return {"loss": sum(losses), "grad_norm": float(grad_norm)}

    seconds, outputs, warm_up = side_by_side({"rl_assets": ours, "plain": plain}, args.repeats, prepare={"rl_assets": fresh_policy})
    result = {side: rates([tokens] * len(seconds[side]), seconds[side]) for side in SIDES}
    result["first_call_kl_old"] = warm_up["rl_assets"]["kl_old"]  # before any update: 0 when the stored log-probs match training's
    result["first_call_clip_fraction"] = warm_up["rl_assets"]["clip_fraction"]
    result["steps_per_call"] = outputs["rl_assets"][-1]["steps"]
    result["finite_losses"] = all(math.isfinite(o["loss"]) for side in SIDES for o in outputs[side])
    return result


def worker(args) -> None:
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging

    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()  # the "Loading weights" bars of every fresh load
    mode, cases = args.worker, [c for c in args.cases.split(",") if c in WORKER_CASES]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    models = {side: load_model(args.model, mode) for side in SIDES}
    reference = models["plain"]
    result = {"precision": mode, "weights_dtype": str(next(reference.parameters()).dtype), "parameters": sum(p.numel() for p in reference.parameters()),
              "flop_parameters": flop_parameters(reference), "threads": torch.get_num_threads()}
    sequences = training_sequences(tokenizer, args, end_ids(models["plain"], tokenizer)[0])
    result["train_tokens_per_call"] = sum(len(p) + len(c) for p, c in zip(sequences[1], sequences[2])) * args.epochs
    for case in cases:
        print(f"  {mode}: {case} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        if case == "sampling":
            result[case] = measure_sampling(args, mode, models, tokenizer)
        elif case == "logprobs":
            result[case] = measure_logprobs(args, mode, models, tokenizer, sequences)
        else:
            result[case] = measure_training(args, mode, models, tokenizer, sequences)
        result[case]["case_s"] = round(time.perf_counter() - started, 2)
    print("RESULT " + json.dumps(result), flush=True)


# --- the parent: matmul peaks, one worker per precision, the table -------------------------------------------------------


def matmul_gflops(dtype, size: int, repeats: int) -> float:
    """Best GFLOP/s of a size x size matmul in `dtype` (2 n^3 FLOPs) over `repeats` timed calls after a warm-up."""
    import torch

    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def cpu_description() -> dict:
    import torch

    name, flags = "unknown", set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return {"model": name, "cores": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def run_worker(args, mode: str) -> dict:
    """One precision in a fresh process; its progress goes to stderr, its numbers come back on a `RESULT` line."""
    command = [sys.executable, str(Path(__file__).resolve()), *args.argv, "--model", str(args.model), "--worker", mode]  # resolved: cwd differs
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    results = [json.loads(line[len("RESULT ") :]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not results:
        sys.exit(f"worker {mode} failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
    return results[-1]


def summarize(case: str, workers: dict) -> dict:
    """Per precision both sides and rl-assets / plain; then the fastest plain precision and rl-assets / it."""
    per_precision = {}
    for mode, result in workers.items():
        if case in result:
            numbers = result[case]
            numbers["ratio_same_precision"] = numbers["rl_assets"]["tokens_per_s"] / numbers["plain"]["tokens_per_s"]
            per_precision[mode] = numbers
    fastest = max(per_precision, key=lambda m: per_precision[m]["plain"]["tokens_per_s"])
    top = per_precision[fastest]["plain"]["tokens_per_s"]
    for numbers in per_precision.values():
        numbers["ratio_vs_fastest_plain"] = numbers["rl_assets"]["tokens_per_s"] / top
    best = max(per_precision, key=lambda m: per_precision[m]["rl_assets"]["tokens_per_s"])
    return {"per_precision": per_precision, "fastest_plain": fastest, "fastest_plain_tokens_per_s": top, "fastest_rl_assets": best,
            "ratio_fastest_rl_assets_vs_fastest_plain": per_precision[best]["rl_assets"]["tokens_per_s"] / top}


def add_flops(summary: dict, workers: dict, matmul: dict | None, factor: int) -> None:
    """Achieved GFLOP/s = factor x P x tokens/s per side, and its share of the same run's matmul in the compute dtype."""
    for mode, numbers in summary["per_precision"].items():
        P = workers[mode]["flop_parameters"]
        peak_dtype = "fp32" if mode == "no" else "bf16"
        for side in SIDES:
            numbers[side]["gflops"] = factor * P * numbers[side]["tokens_per_s"] / 1e9
            if matmul:
                numbers[side][f"share_of_{peak_dtype}_matmul"] = numbers[side]["gflops"] / matmul[f"{peak_dtype}_gflops"]


def print_table(title: str, summary: dict, extra: list[tuple[str, str]], flops: bool) -> None:
    print(f"\n{title}")
    header = f"{'precision':<10} {'rl-assets':>11} {'plain':>11} {'ratio':>7} {'vs fastest plain':>17}"
    if flops:
        header += f" {'GFLOP/s rl / plain':>19} {'of matmul':>14}"
    print(header + "".join(f" {label:>{max(len(label), 10)}}" for label, _ in extra))
    for mode, n in summary["per_precision"].items():
        line = (f"{mode:<10} {n['rl_assets']['tokens_per_s']:>11,.0f} {n['plain']['tokens_per_s']:>11,.0f} {n['ratio_same_precision']:>6.2f}x "
                f"{n['ratio_vs_fastest_plain']:>16.2f}x")
        if flops:
            shares = [v for k, v in n["rl_assets"].items() if k.startswith("share_of")] + [v for k, v in n["plain"].items() if k.startswith("share_of")]
            share_text = " / ".join(f"{100 * s:.0f}%" for s in shares) if shares else "-"
            line += f" {n['rl_assets']['gflops']:>9.1f} / {n['plain']['gflops']:<7.1f} {share_text:>14}"
        for label, key in extra:
            value = n.get(key)
            text = (f"{value:.3g}" if isinstance(value, float) else " / ".join(map(str, value.values())) if isinstance(value, dict)
                    else str(value))
            line += f" {text:>{max(len(label), 10)}}"
        print(line)
    print(f"fastest plain: {summary['fastest_plain']} ({summary['fastest_plain_tokens_per_s']:,.0f} tokens/s); fastest rl-assets: "
          f"{summary['fastest_rl_assets']}, {summary['ratio_fastest_rl_assets_vs_fastest_plain']:.2f}x it")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a Hugging Face causal-LM folder (default: `make real-model`'s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (torch.set_num_threads) in every case")
    parser.add_argument("--prompts", type=int, default=32, help="distinct chat prompts sampled from")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (also training's group size)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=128, help="sequences per generate call")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--decode", choices=("eager", "compiled"), default="eager", help="rl-assets' sampling loop (rollouts.decode)")
    parser.add_argument("--train-rows", type=int, default=64, help="training (and log-prob pass) sequences; one minibatch")
    parser.add_argument("--completion-tokens", type=int, default=16, help="longest random training completion")
    parser.add_argument("--accum", type=int, default=4, help="gradient accumulation micro-batches per optimizer step")
    parser.add_argument("--epochs", type=int, default=1, help="passes (optimizer steps) per training call")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--logprob-batch-size", type=int, default=64, help="sequences per forward of the log-prob pass")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated subset of {','.join(PRECISIONS)}")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per side after the warm-up")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.model = args.model.resolve()
    cases, precisions = [c for c in args.cases.split(",") if c], [p for p in args.precisions.split(",") if p]
    if unknown := set(cases) - set(CASES):
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {','.join(CASES)}")
    if unknown := set(precisions) - set(PRECISIONS):
        parser.error(f"unknown precision(s) {sorted(unknown)}; choose from {','.join(PRECISIONS)}")
    if args.train_rows % args.samples or args.train_rows % args.accum:
        parser.error(f"--train-rows {args.train_rows} must be a multiple of --samples {args.samples} and of --accum {args.accum}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    args.case_list, args.precision_list = cases, precisions
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if not (args.model / "config.json").is_file():
        sys.exit(f"no model folder at {args.model}: run `make real-model` (it imports SmolLM2-135M-Instruct there), or pass --model DIR")
    if args.worker:
        return worker(args)
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    cpu = cpu_description()
    print(f"model {args.model}; CPU {cpu['model']} ({cpu['cores']} cores, AVX512-BF16 {cpu['avx512_bf16']}, AMX-BF16 {cpu['amx_bf16']}, "
          f"torch capability {cpu['torch_cpu_capability']}), {args.threads} thread(s); torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"sampling {args.prompts} prompts x {args.samples} samples, {args.max_new_tokens} new tokens, batch {args.batch_size}; training "
          f"{args.train_rows} rows (completions <= {args.completion_tokens} random tokens), {args.accum} micro-batches, {args.epochs} epoch(s); "
          f"{args.repeats} timed call(s) per side", flush=True)
    summary = {"model": str(args.model), "cpu": cpu, "threads": args.threads,
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
               "sizes": {k: getattr(args, k) for k in ("prompts", "samples", "max_new_tokens", "batch_size", "decode", "temperature", "train_rows",
                                                       "completion_tokens", "accum", "epochs", "lr", "logprob_batch_size", "repeats", "seed")},
               "precisions": args.precision_list, "cases": args.case_list,
               "flop_formula": "training 6 x P x tokens/s, log-prob pass 2 x P x tokens/s; P = parameters - input embedding (+ LM head if tied)",
               "targets": {"sampling": f"rl-assets >= {TARGET}x the fastest plain sampling loop",
                           "training": f"rl-assets >= {TARGET}x the fastest plain training loop whose precision keeps the first ratio at 1 "
                                       "and the fp32 run's accuracy"}}

    matmul = None
    if "matmul" in args.case_list:
        print("  matmul ...", file=sys.stderr, flush=True)
        repeats = max(5, args.repeats)
        matmul = {"size": args.matmul_size, "fp32_gflops": matmul_gflops(torch.float32, args.matmul_size, repeats),
                  "bf16_gflops": matmul_gflops(torch.bfloat16, args.matmul_size, repeats)}
        summary["matmul"] = matmul

    workers = {}
    if set(args.case_list) & set(WORKER_CASES):
        workers = {mode: run_worker(args, mode) for mode in args.precision_list}
        first = next(iter(workers.values()))
        summary["parameters"], summary["flop_parameters"] = first["parameters"], first["flop_parameters"]
        summary["workers"] = {mode: {k: w[k] for k in ("weights_dtype", "threads", "train_tokens_per_call")} for mode, w in workers.items()}
        print(f"parameters {first['parameters']:,} (P for FLOPs {first['flop_parameters']:,})")

    if "sampling" in args.case_list:
        summary["sampling"] = summarize("sampling", workers)
        print_table("sampling: completion tokens/s (median of the timed calls)", summary["sampling"],
                    [("mean tokens (ours, plain)", "mean_completion_tokens")], flops=False)
    if "logprobs" in args.case_list:
        summary["logprobs"] = summarize("logprobs", workers)
        add_flops(summary["logprobs"], workers, matmul, 2)
        print_table("log-prob pass: prompt + completion tokens/s", summary["logprobs"], [("max |diff|", "max_abs_diff")], flops=True)
    if "training" in args.case_list:
        summary["training"] = summarize("training", workers)
        add_flops(summary["training"], workers, matmul, 6)
        print_table("training: prompt + completion tokens/s", summary["training"],
                    [("first kl_old", "first_call_kl_old"), ("first clip", "first_call_clip_fraction")], flops=True)
    if matmul:
        print(f"\nmatmul {args.matmul_size}x{args.matmul_size} (best of {max(5, args.repeats)}): fp32 {matmul['fp32_gflops']:,.1f} GFLOP/s, "
              f"bf16 {matmul['bf16_gflops']:,.1f} GFLOP/s")
    print(f"targets: rollouts >= {TARGET}x the fastest plain sampling loop; training >= {TARGET}x the fastest plain training loop whose "
          "precision keeps the first ratio at 1 and the fp32 run's accuracy (not measured here)")
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
