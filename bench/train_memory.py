"""Peak memory and time of one GRPO training round on a real model, with and without `compute.return_freed_memory`.

    .venv/bin/python bench/train_memory.py [--model base_models/smollm2-135m-instruct] [--params examples/smollm2/params.yaml] [--set k=v]

Each side runs in a fresh process (the C allocator's state is per process): the model loaded, then
`train_on_rollouts` on a table of the params' shape (prompts_per_round x samples_per_prompt rows, prompts of 45
tokens, completions of 5-23 random tokens, rewards 0/1), as one round of `make real` trains. It prints each side's
peak RSS (VmHWM) during the round, the round's seconds, and the ratios.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(model_path: str, params_path: str, overrides: list[str], fixed: bool) -> dict:
    import pyarrow as pa
    import torch

    from rl_assets.core.config import load_params
    from rl_assets.core.policy import load_policy
    from rl_assets.run.process import free_large_blocks_at_once
    from rl_assets.train.policy_gradient import train_on_rollouts

    if fixed:
        free_large_blocks_at_once()  # what a step does with compute.return_freed_memory
    params = load_params(params_path, overrides)
    model, tokenizer = load_policy(model_path)
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
    open("/proc/self/clear_refs", "w").write("5")  # the peak from here on: the round's, not the load's
    started = time.perf_counter()
    _, metrics, _, _ = train_on_rollouts(model, rollouts, rewards, params.train, group_size=group, temperature=params.rollouts.temperature,
                                         pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id, seed=0, max_new_tokens=params.rollouts.max_new_tokens, progress=False)
    seconds = time.perf_counter() - started
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    return {"peak_gb": int(status["VmHWM"].split()[0]) / 1e6, "seconds": round(seconds, 1), "steps": metrics["steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / "base_models/smollm2-135m-instruct"))
    parser.add_argument("--params", default=str(REPO / "examples/smollm2/params.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--worker", choices=["default", "fixed"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.params, args.overrides, args.worker == "fixed")))
        return
    sides = {}
    for side in ("default", "fixed"):
        command = [sys.executable, __file__, "--model", args.model, "--params", args.params, "--worker", side,
                   *(item for override in args.overrides for item in ("--set", override))]
        done = subprocess.run(command, cwd=REPO,
                              capture_output=True, text=True, check=True)
        sides[side] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{side}: {sides[side]}", file=sys.stderr, flush=True)
    print(json.dumps({**sides, "peak_ratio": round(sides["fixed"]["peak_gb"] / sides["default"]["peak_gb"], 3),
                      "time_ratio": round(sides["fixed"]["seconds"] / sides["default"]["seconds"], 3)}))


if __name__ == "__main__":
    main()
