"""Peak memory: rl-assets vs TRL's GRPOTrainer on the same model and batch, side by side in one run.

    .venv/bin/python bench/memory.py [--sequences 16] [--prompt-tokens 100] [--completion-tokens 256] [--vocab 151936]
                                     [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2] [--intermediate 128]
                                     [--model DIR] [--gradient-checkpointing] [--vision [--image-size 64] [--patch-size 8]]
                                     [--group-size 4] [--threads 1] [--cases logprobs,train] [--rss-limit-gib G]
                                     [--rl-assets-from DIR] [--json PATH]

The model is a randomly initialised Qwen2 (`Qwen2Config`, by default the real 151,936-token vocabulary
and a tiny body), or with --model a real one's folder (SmolLM2-135M-Instruct from `make real-model`), fp32 on CPU; the batch is N sequences of P random prompt ids + C random completion
ids, no padding. With --vision the model is a LLaVA (that language model, a real one's weights with --model, and a
random SigLIP vision tower: no pretrained VLM is reachable here) and each
sequence shows one random image: its placeholder tokens start the prompt, its pixels go with the batch in each side's
own layout (rl-assets: per row; TRL: stacked, with num_images). Two cases, each side of each case in a fresh process (`memory.py --worker CASE`) so
peak-RSS high-water marks never mix:

  logprobs  the rollouts step's log-prob pass under no_grad. rl-assets: `rollouts.completion_logprobs`
            over the N sequences in micro-batches of TRL's size. TRL: `GRPOTrainer._get_per_token_logps_and_entropies`
            with the inputs `_generate_and_score_completions` builds (prompt + completion ids, their masks,
            logits_to_keep = C, batch_size = per_device_train_batch_size = N), on a model patched by the trainer.
  train     one training minibatch of N: forward with grad, loss, backward, optimizer step. rl-assets:
            `train.train_on_rollouts` (one epoch, minibatch_size = N, fp32). TRL: a real `GRPOTrainer`'s
            `compute_loss` on an inputs dict shaped like `_generate_and_score_completions`' output,
            `accelerator.backward`, grad clipping, `optimizer.step()` of the trainer's own AdamW.

Peak of a case = ru_maxrss after it - RSS just before it (after gc and malloc_trim), in MiB: model,
trainer and inputs are built, and the modules rl-assets imports lazily (TRL's fused head, accelerate)
loaded, before the baseline, so only what the case itself allocates counts (the optimizer's Adam
moments and gradients included, on both sides; one-time first-forward allocations too: no warm-up).
A background thread also samples RSS every ~2 ms as a cross-check, and the process's own max RSS
(setup included: the TRL side holds a trainer) is shown too. The parent kills a worker whose RSS passes --rss-limit-gib (a
shared machine); that side is then reported as "> limit". Prints a table with the ratio rl-assets / TRL
measured in this run; exit code 0 whatever the ratio.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ("logprobs", "train")
SIDES = ("rl_assets", "trl")
TARGET = 1.0  # rl-assets peak <= TARGET x TRL peak
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


# --- measurement helpers (worker side) --------------------------------------------------------------------------------


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def max_rss() -> int:
    """This process's peak RSS so far (ru_maxrss is KiB on Linux), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release_free_memory() -> None:
    """gc, then hand glibc's free heap pages back to the OS so the baseline RSS holds only live memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Sampler(threading.Thread):
    """Samples this process's RSS every `interval` seconds until stopped; `peak` is the largest sample."""

    def __init__(self, interval: float = 0.002):
        super().__init__(daemon=True)
        self.interval, self.peak, self.samples = interval, current_rss(), 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, current_rss())
            self.samples += 1
            time.sleep(self.interval)

    def stop(self) -> int:
        self._done.set()
        self.join()
        self.peak = max(self.peak, current_rss())
        return self.peak


# --- the shared model and batch ----------------------------------------------------------------------------------------


IMAGE_TOKEN_ID = 3  # --vision: the image placeholder, never a random prompt or completion id


def image_tokens(args) -> int:
    return (args.image_size // args.patch_size) ** 2 if args.vision else 0


def build_model(args):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    language = None
    if args.model:  # a real model's folder (e.g. SmolLM2 from `make real-model`), fp32 as the example trains it
        from rl_assets.core.policy import load_policy

        language, _ = load_policy(args.model, "cpu", torch.float32)
        config = language.config
    else:
        config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                             num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                             max_position_embeddings=max(args.prompt_tokens + args.completion_tokens, 128), tie_word_embeddings=args.tie_embeddings,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if args.vision:  # a LLaVA: this language model (the real one's weights with --model) and a SigLIP vision tower, one token per patch
        from transformers import LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

        tower = SiglipVisionConfig(hidden_size=args.vision_hidden, intermediate_size=4 * args.vision_hidden, num_hidden_layers=args.vision_layers,
                                   num_attention_heads=args.heads, image_size=args.image_size, patch_size=args.patch_size)
        config.max_position_embeddings = max(config.max_position_embeddings, args.prompt_tokens + args.completion_tokens + image_tokens(args))
        model = LlavaForConditionalGeneration(LlavaConfig(vision_config=tower, text_config=config, image_token_id=IMAGE_TOKEN_ID,
                                                          vision_feature_select_strategy="full", vision_feature_layer=-1,
                                                          image_seq_length=image_tokens(args), tie_word_embeddings=config.tie_word_embeddings))
        if language is not None:
            model.model.language_model.load_state_dict(language.model.state_dict())
            model.lm_head.load_state_dict(language.lm_head.state_dict())
            del language
    else:
        model = language if language is not None else Qwen2ForCausalLM(config)
    model = model.to(torch.float32)
    model.train()
    return model


def build_batch(args):
    """N x P prompt ids and N x C completion ids, random, avoiding the special ids 0-3 (so nothing reads as padding or an image);
    with --vision each prompt starts with one image's placeholder tokens."""
    import torch

    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(4, args.vocab, (args.sequences, args.prompt_tokens), generator=generator)
    completions = torch.randint(4, args.vocab, (args.sequences, args.completion_tokens), generator=generator)
    if args.vision:
        prompts = torch.cat([torch.full((args.sequences, image_tokens(args)), IMAGE_TOKEN_ID), prompts], dim=1)
    return prompts, completions


def build_pixels(args):
    """(N, 3, S, S) random pixel values, one image per sequence (--vision); None without."""
    import torch

    if not args.vision:
        return None
    return torch.randn(args.sequences, 3, args.image_size, args.image_size, generator=torch.Generator().manual_seed(2))


def rewards_per_sequence(args) -> list[float]:
    """Varied rewards (never equal within a group), so every advantage is non-zero."""
    return [float((i * 7) % args.group_size) + 0.25 * (i % 3) for i in range(args.sequences)]


def old_logprob(args) -> float:
    """Stored (old) per-token log-prob: a random-init model is close to uniform, so ratios start near 1."""
    return -math.log(args.vocab)


# --- the four workers: (setup, case) -------------------------------------------------------------------------------------


def preimport_rl_assets_lazy_imports() -> None:
    """Modules the rl-assets functions import on first call (TRL's fused head, accelerate): loaded here, before the baseline,
    as the TRL side loads them with its trainer, so neither case counts import footprint as working memory."""
    import accelerate  # noqa: F401
    import transformers  # noqa: F401
    import trl.trainer.utils  # noqa: F401


def setup_rl_assets_logprobs(args):
    import torch

    preimport_rl_assets_lazy_imports()

    from rl_assets.core.logprobs import completion_logprobs

    model = build_model(args)
    prompts, completions = build_batch(args)
    prompt_ids, completion_ids = prompts.tolist(), completions.tolist()
    vision = per_row_pixels(args)
    batch = args.sequences  # TRL passes per_device_train_batch_size = N

    def case():
        out = []
        with torch.no_grad():
            for start in range(0, len(prompt_ids), batch):
                stop = start + batch
                lp, mask = completion_logprobs(model, prompt_ids[start:stop], completion_ids[start:stop], 0, args.temperature,
                                               vision=vision[start:stop] if vision else None)
                out += [row[: int(m.sum())].tolist() for row, m in zip(lp.cpu(), mask.cpu())]  # as sample_rollouts stores them
        return out

    return case


def per_row_pixels(args) -> list | None:
    """rl-assets' layout of the pixels: each row's inputs (rl_assets.core.vision.VisionInputs)."""
    pixels = build_pixels(args)
    return None if pixels is None else [{"pixel_values": pixels[i : i + 1]} for i in range(args.sequences)]


def setup_rl_assets_train(args):
    import pyarrow as pa

    from rl_assets.core.config import TrainParams
    from rl_assets.core.schemas import ROLLOUTS, rewards_schema
    from rl_assets.train.policy_gradient import train_on_rollouts

    preimport_rl_assets_lazy_imports()
    model = build_model(args)
    prompts, completions = build_batch(args)
    n, G, C = args.sequences, args.group_size, args.completion_tokens
    rows = [{"round": 1, "prompt_id": f"p{i // G}", "sample_idx": i % G, "prompt": "", "answer": "", "extra": "{}", "completion": "",
             "prompt_ids": prompts[i].tolist(), "completion_ids": completions[i].tolist(), "logprobs": [old_logprob(args)] * C,
             "truncated": False, "policy_id": "policy", "temperature": args.temperature, "top_p": 1.0, "max_new_tokens": C, "seed": 0,
             "prompts_hash": "prompts"} for i in range(n)]
    rollouts = pa.Table.from_pylist(rows, schema=ROLLOUTS)
    rewards = pa.table({"round": rollouts["round"], "prompt_id": rollouts["prompt_id"], "sample_idx": rollouts["sample_idx"],
                        "policy_id": rollouts["policy_id"], "reward": rewards_per_sequence(args), "reward_config_hash": ["c"] * n,
                        "rollouts_hash": ["h"] * n}, schema=rewards_schema([]))
    vision = per_row_pixels(args)
    params = TrainParams(algorithm="grpo", loss_type="grpo", learning_rate=args.lr, epochs=1, minibatch_size=n, mixed_precision="no",
                         gradient_checkpointing=args.gradient_checkpointing, beta=0.0, save_steps=0)

    def case():
        _, metrics, _, _ = train_on_rollouts(model, rollouts, rewards, params, group_size=G, temperature=args.temperature, pad_id=0, seed=0,
                                             max_new_tokens=C, device="cpu", progress=False, vision=vision)
        return {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "steps": metrics["steps"]}

    return case


def build_trl_trainer(args, model, output_dir: str):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rl_assets.core.tokenizer import build_tiny_tokenizer

    config = GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, per_device_train_batch_size=args.sequences, gradient_accumulation_steps=1,
        num_generations=args.group_size, gradient_checkpointing=args.gradient_checkpointing, beta=0.0, max_completion_length=args.completion_tokens,
        temperature=args.temperature, loss_type="grpo", learning_rate=args.lr, optim="adamw_torch", report_to=[], logging_strategy="no",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    if args.model:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)  # used only for its pad/eos ids: no text is tokenized or generated
    else:
        tokenizer = build_tiny_tokenizer()  # the same: its pad/eos ids only
    dataset = Dataset.from_dict({"prompt": ["1+1="] * args.sequences})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions), args=config,
                          train_dataset=dataset, processing_class=tokenizer)
    return trainer


def trl_tensors(args):
    """prompt_ids / prompt_mask / completion_ids / completion_mask as `_generate_and_score_completions` builds them (no padding here)."""
    import torch

    prompts, completions = build_batch(args)
    return prompts, torch.ones_like(prompts), completions, torch.ones_like(completions)


def setup_trl_logprobs(args):
    import torch

    model = build_model(args)
    trainer = build_trl_trainer(args, model, tempfile.mkdtemp(prefix="rl-assets-memory-trl-"))
    prompt_ids, prompt_mask, completion_ids, completion_mask = trl_tensors(args)
    prompt_completion_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits_to_keep = completion_ids.size(1)
    batch_size = trainer.args.per_device_train_batch_size

    def case():
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, prompt_completion_ids, attention_mask, logits_to_keep,
                                                                     batch_size=batch_size, **trl_pixels(args))
        return logps

    return case


def trl_pixels(args) -> dict:
    """TRL's layout of the pixels: every image's `pixel_values` stacked, and `num_images` per sequence (one each)."""
    pixels = build_pixels(args)
    return {} if pixels is None else {"pixel_values": pixels, "num_images": [1] * args.sequences}


def setup_trl_train(args):
    import torch

    model = build_model(args)
    trainer = build_trl_trainer(args, model, tempfile.mkdtemp(prefix="rl-assets-memory-trl-"))
    trainer.create_optimizer()  # the trainer's own AdamW (adamw_torch, lr --lr); its moments are allocated lazily at step()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; compute_loss normalizes by it
    trainer.model.train()
    prompt_ids, prompt_mask, completion_ids, completion_mask = trl_tensors(args)
    from rl_assets.train.advantages import group_advantages

    reward = torch.tensor(rewards_per_sequence(args))
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": group_advantages(reward, args.group_size, scale="group"),
        "num_items_in_batch": completion_mask.sum(),
        "old_per_token_logps": torch.full(completion_ids.shape, old_logprob(args)),
        **trl_pixels(args),
    }

    def case():
        loss = trainer.compute_loss(trainer.model, inputs)
        trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss.item()}

    return case


WORKERS = {("logprobs", "rl_assets"): setup_rl_assets_logprobs, ("train", "rl_assets"): setup_rl_assets_train,
           ("logprobs", "trl"): setup_trl_logprobs, ("train", "trl"): setup_trl_train}


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    case_name, side = args.worker.split(":")
    started = time.perf_counter()
    case = WORKERS[(case_name, side)](args)
    setup_s = time.perf_counter() - started
    release_free_memory()
    baseline, max_before = current_rss(), max_rss()
    sampler = Sampler()
    sampler.start()
    started = time.perf_counter()
    result = case()
    case_s = time.perf_counter() - started
    sampled = sampler.stop()
    max_after = max_rss()
    del result
    print("RESULT " + json.dumps({
        "case": case_name, "side": side, "baseline_mib": baseline / MIB, "peak_mib": (max_after - baseline) / MIB,
        "sampled_peak_mib": (sampled - baseline) / MIB, "samples": sampler.samples, "maxrss_before_mib": max_before / MIB,
        "maxrss_after_mib": max_after / MIB, "setup_high_water": max_after <= max_before, "setup_s": round(setup_s, 2), "case_s": round(case_s, 2),
    }), flush=True)


# --- the parent: runs each worker in a fresh process -------------------------------------------------------------------


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def child_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def run_worker(args, case: str, side: str, limit: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", f"{case}:{side}", *args.shape_args]
    path = os.pathsep.join([str(args.rl_assets_from.resolve()), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path,
           "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, text=True)
        watched = 0
        killed = False
        while process.poll() is None:
            watched = max(watched, child_rss(process.pid))
            if watched > limit:
                process.kill()
                killed = True
                break
            time.sleep(0.02)
        process.wait()
        out.seek(0)
        log = out.read()
    if killed:
        print(f"  {case}:{side}: killed at RSS {watched / MIB:.0f} MiB (> --rss-limit-gib {limit / 1024**3:.1f})", file=sys.stderr)
        return {"case": case, "side": side, "over_limit": True, "watched_rss_mib": watched / MIB}
    results = [json.loads(line[len("RESULT "):]) for line in log.splitlines() if line.startswith("RESULT ")]
    if process.returncode or not results:
        sys.exit(f"worker {case}:{side} failed (exit {process.returncode}):\n{log[-6000:]}")
    result = results[-1]
    result["watched_rss_mib"] = watched / MIB
    return result


def fmt(result: dict) -> str:
    return "> limit" if result.get("over_limit") else f"{result['peak_mib']:.0f}"


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape = parser.add_argument_group("shape (passed on to the workers)")
    shape.add_argument("--sequences", type=int, default=16, help="N sequences in the batch (one minibatch)")
    shape.add_argument("--prompt-tokens", type=int, default=100, help="P prompt tokens per sequence")
    shape.add_argument("--completion-tokens", type=int, default=256, help="C completion tokens per sequence")
    shape.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen2's real one by default)")
    shape.add_argument("--hidden", type=int, default=64)
    shape.add_argument("--layers", type=int, default=2)
    shape.add_argument("--heads", type=int, default=4)
    shape.add_argument("--kv-heads", type=int, default=2)
    shape.add_argument("--intermediate", type=int, default=128)
    shape.add_argument("--tie-embeddings", action="store_true", help="tie lm_head to the input embedding (Qwen2Config's default is untied)")
    shape.add_argument("--model", default=None, help="a model folder (e.g. base_models/smollm2-135m-instruct) instead of the random Qwen2; "
                       "--vocab and the body options are then read from it")
    shape.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in the backward pass (both sides)")
    shape.add_argument("--vision", action="store_true", help="a vision-language model: the language model (random, or --model's) in a LLaVA with a SigLIP tower, one "
                       "image per sequence (its placeholder tokens before the P prompt tokens)")
    shape.add_argument("--image-size", type=int, default=64, help="--vision: image side in pixels")
    shape.add_argument("--patch-size", type=int, default=8, help="--vision: patch side (one image token per patch)")
    shape.add_argument("--vision-hidden", type=int, default=128, help="--vision: the tower's width")
    shape.add_argument("--vision-layers", type=int, default=2, help="--vision: the tower's layers")
    shape.add_argument("--group-size", type=int, default=4, help="G completions per prompt (TRL's num_generations); must divide N")
    shape.add_argument("--temperature", type=float, default=1.0)
    shape.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate (both sides)")
    shape.add_argument("--threads", type=int, default=1, help="torch threads in each worker")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--rss-limit-gib", type=float, default=None,
                        help="kill a worker whose RSS passes this (default: 85%% of MemAvailable when the worker starts)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--rl-assets-from", type=Path, default=REPO,
                        help="directory whose rl_assets package the workers import (default: this checkout), e.g. a `git archive` of another commit")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sequences % args.group_size:
        parser.error(f"--group-size {args.group_size} must divide --sequences {args.sequences}")
    if args.model:
        args.vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]  # random ids must be in range
    args.shape_args = []
    for action in shape._group_actions:
        value = getattr(args, action.dest)
        if isinstance(value, bool):
            args.shape_args += [action.option_strings[0]] if value else []
        elif value is None:
            continue
        else:
            args.shape_args += [action.option_strings[0], str(value)]
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.worker:
        return worker(args)
    cases = [c for c in args.cases.split(",") if c]
    if unknown := set(cases) - set(CASES):
        sys.exit(f"unknown case(s) {sorted(unknown)}; choose from {CASES}")
    import torch
    import transformers
    import trl

    N, P, C, V = args.sequences, args.prompt_tokens, args.completion_tokens, args.vocab
    logits_gib = N * (P + C) * V * 4 / 1024**3
    body = (f"model {args.model}" if args.model else f"Qwen2 hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV heads, "
            f"intermediate {args.intermediate}, tied={args.tie_embeddings}")
    if args.vision:
        body += (f", in a LLaVA with a SigLIP tower ({args.vision_layers} layers, width {args.vision_hidden}): one {args.image_size}px image "
                 f"per sequence, {image_tokens(args)} image tokens before the prompt")
    print(f"shape: N={N} sequences x (P={P} prompt + C={C} completion) tokens, vocab {V}, {body}, G={args.group_size}, "
          f"gradient checkpointing {args.gradient_checkpointing}, fp32 CPU, {args.threads} thread(s); full (N, P+C, V) fp32 logits = {logits_gib:.2f} GiB")
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
          f"rl_assets from {args.rl_assets_from.resolve()}", flush=True)
    results = {}
    for case in cases:
        for side in SIDES:
            limit = int(args.rss_limit_gib * 1024**3) if args.rss_limit_gib else int(0.85 * mem_available())
            print(f"  {case}:{side} ...", file=sys.stderr, flush=True)
            result = run_worker(args, case, side, limit)
            results[(case, side)] = result
            if result.get("setup_high_water"):
                print(f"  warning: {case}:{side}: ru_maxrss did not rise during the case (setup's high-water mark {result['maxrss_before_mib']:.0f} MiB "
                      f">= case peak); its peak is a lower bound — see the sampled column", file=sys.stderr)

    print(f"\n{'case':<10} {'rl-assets peak MiB':>18} {'TRL peak MiB':>13} {'ratio':>7}   {'sampled (rl/TRL) MiB':>21}  "
          f"{'process max RSS (rl/TRL) MiB':>28}  {'case s (rl/TRL)':>15}")
    summary = {"shape": {k: getattr(args, k) for k in ("sequences", "prompt_tokens", "completion_tokens", "vocab", "hidden", "layers", "heads",
                                                        "kv_heads", "intermediate", "tie_embeddings", "model", "gradient_checkpointing", "group_size",
                                                        "temperature", "threads", "vision", "image_size", "patch_size", "vision_hidden",
                                                        "vision_layers")},
               "full_logits_gib": round(logits_gib, 3), "rl_assets_from": str(args.rl_assets_from.resolve()), "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
               "target": f"rl-assets <= {TARGET}x TRL", "cases": {}}
    for case in cases:
        ours, theirs = results[(case, "rl_assets")], results[(case, "trl")]
        ratio = None
        if not ours.get("over_limit") and not theirs.get("over_limit") and theirs["peak_mib"] > 0:
            ratio = ours["peak_mib"] / theirs["peak_mib"]
        sampled = "/".join("-" if r.get("over_limit") else f"{r['sampled_peak_mib']:.0f}" for r in (ours, theirs))
        seconds = "/".join("-" if r.get("over_limit") else f"{r['case_s']:.1f}" for r in (ours, theirs))
        process = "/".join("-" if r.get("over_limit") else f"{r['maxrss_after_mib']:.0f}" for r in (ours, theirs))
        ratio_text = f"{ratio:.2f}x" if ratio is not None else ("> limit" if ours.get("over_limit") else "n/a")
        print(f"{case:<10} {fmt(ours):>18} {fmt(theirs):>13} {ratio_text:>7}   {sampled:>21}  {process:>28}  {seconds:>15}")
        summary["cases"][case] = {"rl_assets": ours, "trl": theirs, "ratio_rl_assets_over_trl": round(ratio, 3) if ratio is not None else None,
                                  "meets_target": ratio is not None and ratio <= TARGET}
    print(f"target: rl-assets <= {TARGET}x TRL")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
