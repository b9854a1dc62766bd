"""train.drop_equal_reward_groups off and on: training time and held-out accuracy over the same rounds.

    .venv/bin/python bench/zero_advantage_filter.py [--params params.yaml] [--rounds 3] [--repeats 2] [--r00 data/r00/checkpoint]
                                                    [--set section.key=value ...]

One process, library calls only (no Dagster). r00 is built once (SFT as the params say; --r00 loads
a saved one instead, such as the pipeline's data/r00/checkpoint of the same params). Two chains of
rounds start from it, one per setting, each round rollouts -> rewards -> train -> held-out
evaluation (the evaluation asset's settings). They run interleaved, round by round, so the
machine's load falls on both; round 1 samples the same rollouts for both. A round's
rollout_reward_mean is the training-prompt accuracy of the policy that sampled it (the previous
round's), over B x G samples.

Training time is the `train_on_rollouts` call alone, as in a resident process: wall and CPU seconds
of each chain's rounds, and the median of --repeats interleaved timings of both settings on round
1's table from r00. On a loaded machine two torch threads spend most of their time waiting for each
other; OMP_NUM_THREADS=1 with --rounds 0 gives a ratio of the work itself.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"off": False, "on": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=str(REPO / "params.yaml"))
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each chain (0: only the round-1 timings)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved timings of both settings on round 1's table")
    parser.add_argument("--r00", type=Path, default=None, help="a saved r00 checkpoint of the same params (skips the SFT)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()

    os.chdir(REPO)  # the params' data paths are relative to the project
    import torch

    from rl_assets.run.process import quiet_step
    from rl_assets.core.params_file import load_params
    from rl_assets.eval.evaluation import eval_prompts, evaluate_checkpoint
    from rl_assets.core.policy import load_base_model, load_policy
    from rl_assets.data.prompts import build_prompts
    from rl_assets.data.raw_data import load_raw_data
    from rl_assets.rewards import score_rollouts
    from rl_assets.rollout.sampling import sample_rollouts
    from rl_assets.train.sft import warm_start
    from rl_assets.train.policy_gradient import train_on_rollouts

    quiet_step()
    params = load_params(args.params, args.overrides)
    raw, _ = load_raw_data(params.raw_data, params.seed)
    model, tokenizer = load_base_model(params.model, params.seed) if args.r00 is None else load_policy(args.r00)
    prompts, _ = build_prompts(raw, params.prompts, tokenizer)
    if params.sft.enabled and args.r00 is None:
        warm_start(model, tokenizer, prompts, params.sft, params.seed, use_cpu=True)
    held_out = eval_prompts(prompts, params.evaluation)

    def accuracy(policy) -> dict:
        rows = evaluate_checkpoint(policy, tokenizer, held_out, params.evaluation, params.seed, params.rewards)
        return {f"{row['mode']}_accuracy": round(row["accuracy"], 4) for row in rows}

    def rollouts_of(policy, round_number: int):
        table = sample_rollouts(policy, tokenizer, prompts, params.rollouts, round_number=round_number, seed=params.seed,
                                policy_id=f"r{round_number - 1:02d}", prompts_hash="bench", progress=False)
        return table, score_rollouts(table, params.rewards, rollouts_hash="bench")

    def timed_train(policy, rollouts, rewards, setting: str, round_number: int, optimizer_state=None):
        train = params.train.model_copy(update={"drop_equal_reward_groups": SETTINGS[setting]})
        wall, cpu = time.perf_counter(), time.process_time()
        trained, metrics, _, state = train_on_rollouts(
            policy, rollouts, rewards, train, group_size=params.rollouts.samples_per_prompt, temperature=params.rollouts.temperature,
            pad_id=tokenizer.pad_token_id, seed=params.seed * 1000 + round_number, max_new_tokens=params.rollouts.max_new_tokens,
            optimizer_state=optimizer_state, progress=False)
        seconds = {"train_s": round(time.perf_counter() - wall, 2), "train_cpu_s": round(time.process_time() - cpu, 2)}
        return trained, metrics, state if train.carry_optimizer_state else None, seconds

    r00 = accuracy(model) if args.rounds else None
    arms = {setting: {"model": copy.deepcopy(model), "optimizer": None, "rounds": []} for setting in SETTINGS}
    for round_number in range(1, args.rounds + 1):
        for setting, arm in arms.items():
            rollouts, rewards = rollouts_of(arm["model"], round_number)
            arm["model"], metrics, arm["optimizer"], seconds = timed_train(arm["model"], rollouts, rewards, setting, round_number, arm["optimizer"])
            arm["rounds"].append({"round": round_number, **seconds, "steps": metrics["steps"], "minibatch_size": metrics["minibatch_size"],
                                  "trained_rows": metrics["trained_rows"], "equal_reward_group_share": round(metrics["equal_reward_group_share"], 3),
                                  "rollout_reward_mean": round(metrics["reward_mean"], 4), **accuracy(arm["model"])})
            print(json.dumps({"setting": setting, **arm["rounds"][-1]}), flush=True)

    repeats = {setting: [] for setting in SETTINGS}
    if args.repeats:
        rollouts, rewards = rollouts_of(model, 1)
        for _ in range(args.repeats):
            for setting in SETTINGS:
                repeats[setting].append(timed_train(copy.deepcopy(model), rollouts, rewards, setting, 1)[3])
        print(json.dumps({"round_1_repeats": repeats}), flush=True)

    summary = {"params": args.params, "overrides": args.overrides, "torch_threads": torch.get_num_threads(), "rounds": args.rounds,
               "r00": r00, **ratios(repeats, "round_1_median", statistics.median), **ratios({s: arm["rounds"] for s, arm in arms.items()}, "chain", sum)}
    if args.rounds:
        last = {setting: arm["rounds"][-1] for setting, arm in arms.items()}
        summary.update({f"final_{key}": {s: last[s][key] for s in SETTINGS} for key in ("sampled_accuracy", "greedy_accuracy", "rollout_reward_mean")})
        summary.update({key: {s: sum(r[key] for r in arm["rounds"]) for s, arm in arms.items()} for key in ("steps", "trained_rows")})
    print(json.dumps(summary, indent=2))


def ratios(timings: dict[str, list[dict]], name: str, pick) -> dict:
    """Training seconds on / off, wall and CPU: the chains' sums, or the repeats' medians."""
    if not timings["off"]:
        return {}
    seconds = {s: {key: round(pick(t[key] for t in timings[s]), 2) for key in ("train_s", "train_cpu_s")} for s in SETTINGS}
    return {f"{name}_train_seconds": seconds,
            f"{name}_ratio_on_over_off": {key: round(seconds["on"][key] / seconds["off"][key], 3) for key in ("train_s", "train_cpu_s")}}


if __name__ == "__main__":
    main()
