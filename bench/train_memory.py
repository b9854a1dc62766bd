"""Peak memory and time of one GRPO training round on a real model, in each of the memory settings a user can pick.

    .venv/bin/python bench/train_memory.py [--model base_models/smollm2-135m-instruct] [--params examples/smollm2/params.yaml]
                                           [--set k=v] [--configs full,full_checkpointed,...]

Each configuration runs in a fresh process (the C allocator's state is per process): the model loaded as the train
step loads it (`load_trainable_policy`: adapters with LoRA), then `train_on_rollouts` on a table of the params' shape
(prompts_per_round x samples_per_prompt rows, prompts of 45 tokens, completions of 5-23 random tokens, rewards 0/1),
as one round of `make real` trains. It prints each configuration's peak RSS (VmHWM) during the round, the round's
seconds, and both as ratios to the first configuration measured.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKPOINTED = "train.gradient_checkpointing=true"
FREED = "compute.return_freed_memory=true"
LORA = "train.lora.enabled=true"
CONFIGS = {  # name: the params overrides on top of --params and --set
    "full": [],
    "full_checkpointed": [CHECKPOINTED],
    "full_checkpointed_freed": [CHECKPOINTED, FREED],
    "lora": [LORA],
    "lora_checkpointed": [LORA, CHECKPOINTED],
    "lora_checkpointed_freed": [LORA, CHECKPOINTED, FREED],
}


def worker(model_path: str, params_path: str, overrides: list[str]) -> dict:
    import pyarrow as pa
    import torch

    from rl_assets.core.params_file import load_params
    from rl_assets.core.policy import load_trainable_policy
    from rl_assets.run.process import free_large_blocks_at_once, peak_memory, reset_peak_memory
    from rl_assets.train.policy_gradient import train_on_rollouts

    params = load_params(params_path, overrides)
    if params.compute.return_freed_memory:
        free_large_blocks_at_once()  # what a step does with it (rl_assets.run.stages.run_stage)
    model, tokenizer = load_trainable_policy(model_path, params.train.lora, model_path)
    generator = torch.Generator().manual_seed(0)
    group = params.rollouts.samples_per_prompt
    rows = []
    for i in range(params.rollouts.prompts_per_round * group):
        vocabulary = min(40000, tokenizer.vocab_size)
        completion = torch.randint(3, vocabulary, (int(torch.randint(5, 24, (1,), generator=generator)),), generator=generator).tolist()
        rows.append({"prompt_id": f"p{i // group}", "sample_idx": i % group, "truncated": False, "completion_mask": None,
                     "prompt_ids": torch.randint(3, vocabulary, (45,), generator=generator).tolist(), "completion_ids": completion,
                     "logprobs": [-1.0] * len(completion), "sampler_logprobs": None})
    rollouts = pa.Table.from_pylist(rows)
    rewards = pa.table({"prompt_id": rollouts["prompt_id"], "sample_idx": rollouts["sample_idx"],
                        "reward": [float(torch.rand(1, generator=generator) > 0.5) for _ in rows]})
    reset_peak_memory()  # the peak from here on: the round's, not the load's
    started = time.perf_counter()
    _, metrics, _, _ = train_on_rollouts(model, rollouts, rewards, params.train, group_size=group, temperature=params.rollouts.temperature,
                                         pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id, seed=0,
                                         max_new_tokens=params.rollouts.max_new_tokens, progress=False)
    seconds = time.perf_counter() - started
    return {"peak_gb": peak_memory()["peak_rss_gb"], "seconds": round(seconds, 3), "steps": metrics["steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / "base_models/smollm2-135m-instruct"))
    parser.add_argument("--params", default=str(REPO / "examples/smollm2/params.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.params, args.overrides)))
        return
    names = [name for name in args.configs.split(",") if name]
    if unknown := set(names) - set(CONFIGS):
        parser.error(f"unknown configuration(s) {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    results = {}
    for name in names:
        overrides = [*args.overrides, *CONFIGS[name]]
        command = [sys.executable, __file__, "--model", args.model, "--params", args.params, "--worker",
                   *(item for override in overrides for item in ("--set", override))]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        first = results[names[0]]
        results[name].update(peak_ratio=round(results[name]["peak_gb"] / first["peak_gb"], 3),
                             time_ratio=round(results[name]["seconds"] / first["seconds"], 3) if first["seconds"] else None)
        ratio = f"{results[name]['time_ratio']:.2f}x" if results[name]["time_ratio"] is not None else "-"
        print(f"{name:<26} peak {results[name]['peak_gb']:.2f} GB ({results[name]['peak_ratio']:.2f}x)  "
              f"{results[name]['seconds']:.1f} s ({ratio})  {' '.join(CONFIGS[name]) or 'as params say'}", file=sys.stderr, flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
