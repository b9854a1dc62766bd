"""Algorithms side by side on one task: held-out curves and seconds per round over several seeds, each seed's arms from the same r00.

    .venv/bin/python bench/algorithms.py [--params params.yaml] [--seeds 0,1,2] [--rounds N] [--set section.key=value]
                                         [--arm NAME:section.key=value,section.key=value ...]

Each arm is the whole pipeline (`python -m pipelines run`) in a fresh copy of the project (bench/vs_trl.py's
make_project), with `seed=S` and the arm's overrides. The default arms are GRPO (the params as they are) and
PPO with a value model (`train.algorithm=ppo`, and every row kept: GRPO's filter of equal-reward groups has
no meaning without groups). Within a seed the arms share r00 (the SFT warm start depends on the seed only; its
checkpoint id is compared, not assumed), so their difference at round n is paired; the spread of those
differences over the seeds gives the standard error printed beside the mean.

Seconds come from Dagster's event log: a round is the time between two rNN/checkpoint materializations; within
a round, the policy step is rNN/checkpoint's time after rNN/rewards minus its held-out evaluation, and the value
model's step rNN/critic's time after rNN/checkpoint (the resident child runs one output after another).
Prints one JSON line per run, then the summary, which also says how soon each later arm reached the first arm's final
sampled accuracy, as a share of the first arm's time to its final round (e.g. a curriculum against uniform sampling).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import REPO, make_project, pipeline_curve, round_seconds, run_logged  # noqa: E402

DEFAULT_ARMS = ["grpo:", "ppo:train.algorithm=ppo,train.drop_equal_reward_groups=false"]


def step_seconds(root: Path) -> dict:
    """Mean seconds per round of the policy step (without its held-out evaluation) and of the value model's step (PPO).

    From each step's own duration (`.rl_assets/steps.jsonl`, written by the step's heartbeat), not from the gaps between
    Dagster events: a resident run reports several outputs at once, so those gaps are not step times.
    """
    from dagster import AssetKey, DagsterInstance

    from rl_assets.run.heartbeat import step_durations

    seconds = {key: step["seconds"] for key, step in step_durations(root).items()}
    policy, critic = [], []
    with DagsterInstance.from_config(str(root / ".dagster")) as instance:
        n = 1
        while (checkpoint := instance.get_latest_materialization_event(AssetKey([f"r{n:02d}", "checkpoint"]))) is not None:
            heldout = checkpoint.asset_materialization.metadata.get("heldout_seconds")
            policy.append(seconds[("train", n)] - (heldout.value if heldout else 0.0))
            if ("critic", n) in seconds:
                critic.append(seconds[("critic", n)])
            n += 1
    # milliseconds kept: a micro round's steps take a fraction of a second on a fast machine
    return {"policy_step_s": round(statistics.fmean(policy), 3) if policy else None,
            "critic_step_s": round(statistics.fmean(critic), 3) if critic else None}


def run_arm(params: Path, overrides: list[str], keep: bool) -> dict:
    """One pipeline run in a fresh copy: its curve, seconds per round and per step, and r00's checkpoint id."""
    from rl_assets.core.checkpoints import checkpoint_id

    root = make_project(params, overrides)
    try:
        print(f"python -m pipelines run ({' '.join(overrides)}) in {root} ...", file=sys.stderr, flush=True)
        process = run_logged([str(REPO / ".venv/bin/python"), "-m", "pipelines", "run"], root, root / "pipeline.log")
        curve = pipeline_curve(root)["curve"]
        later = round_seconds(curve)["later_rounds_s"]
        return {"overrides": overrides, "r00": checkpoint_id(root / "data/r00/checkpoint"), "process": process,
                "seconds_per_round": later, **step_seconds(root), "curve": curve}
    finally:
        if keep:
            print(f"project copy kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def mean_and_se(values: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error (None from one value).

    >>> mean_and_se([0.1, 0.3])
    (0.2, 0.1)
    """
    mean = statistics.fmean(values)
    return round(mean, 4), (round(statistics.stdev(values) / math.sqrt(len(values)), 4) if len(values) > 1 else None)


def time_to_reach(curve: list[dict], target: float) -> float | None:
    """Seconds from r00 to the first later checkpoint whose sampled accuracy is at least `target` (None: none is).

    >>> time_to_reach([{"round": 0, "sampled_accuracy": 0.5, "elapsed_s": 0}, {"round": 1, "sampled_accuracy": 0.6, "elapsed_s": 9.0}], 0.55)
    9.0
    """
    return next((r["elapsed_s"] for r in curve if r["round"] > 0 and r["sampled_accuracy"] >= target), None)


def summary(runs: dict[str, list[dict]]) -> dict:
    """Per arm: the mean curve and the mean gain over r00; per later arm: its paired difference from the first arm, round by round."""
    names = list(runs)
    rounds = min(len(run["curve"]) for arm in runs.values() for run in arm)
    out = {"seeds": len(runs[names[0]]), "same_r00_in_every_seed": all(len({runs[a][i]["r00"] for a in names}) == 1
                                                                         for i in range(len(runs[names[0]])))}
    for name in names:
        arm = runs[name]
        gains = [run["curve"][rounds - 1]["sampled_accuracy"] - run["curve"][0]["sampled_accuracy"] for run in arm]
        out[name] = {"mean_sampled_curve": [round(statistics.fmean(run["curve"][r]["sampled_accuracy"] for run in arm), 4) for r in range(rounds)],
                     "gain_over_r00": mean_and_se(gains),
                     **{key: round(statistics.fmean(run[key] for run in arm), 3) if all(run[key] is not None for run in arm) else None
                        for key in ("seconds_per_round", "policy_step_s", "critic_step_s")},
                     "wall_s": round(statistics.fmean(run["process"]["wall_s"] for run in arm), 1)}
    first = names[0]
    for name in names[1:]:
        out[f"{name}_minus_{first}"] = [mean_and_se([b["curve"][r]["sampled_accuracy"] - a["curve"][r]["sampled_accuracy"]
                                                     for a, b in zip(runs[first], runs[name])]) for r in range(rounds)]
        # how soon the arm reaches the first arm's final sampled accuracy, as a share of the first arm's time to its final round
        ratios = [time_to_reach(b["curve"][:rounds], a["curve"][rounds - 1]["sampled_accuracy"]) for a, b in zip(runs[first], runs[name])]
        ratios = [t / a["curve"][rounds - 1]["elapsed_s"] if t is not None else None for t, a in zip(ratios, runs[first])]
        reached = [r for r in ratios if r is not None]
        out[f"{name}_time_to_{first}_final"] = {"per_seed": [round(r, 3) if r is not None else None for r in ratios],
                                                 "mean_se_of_seeds_that_reached": mean_and_se(reached) if reached else None,
                                                 "reached": f"{len(reached)} of {len(ratios)}"}
        if out[first]["seconds_per_round"] and out[name]["seconds_per_round"]:
            out[f"{name}_over_{first}_seconds_per_round"] = round(out[name]["seconds_per_round"] / out[first]["seconds_per_round"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--seeds", default="0,1,2", metavar="0,1,2")
    parser.add_argument("--rounds", type=int, default=None, help="override params `rounds`")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="for every arm")
    parser.add_argument("--arm", dest="arms", action="append", default=None, metavar="NAME:SECTION.KEY=VALUE,...",
                        help=f"an arm and its overrides (repeat; default: {' and '.join(DEFAULT_ARMS)})")
    parser.add_argument("--keep", action="store_true", help="keep the project copies (their paths are printed)")
    args = parser.parse_args()
    arms = {}
    for spec in args.arms or DEFAULT_ARMS:
        name, _, sets = spec.partition(":")
        arms[name] = [s for s in sets.split(",") if s]
    common = args.overrides + ([f"rounds={args.rounds}"] if args.rounds is not None else [])
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, sets in arms.items():
            run = run_arm(args.params, common + [f"seed={seed}"] + sets, args.keep)
            runs[name].append(run)
            print(json.dumps({"arm": name, "seed": seed, **{k: v for k, v in run.items() if k != "curve"},
                              "sampled": [r["sampled_accuracy"] for r in run["curve"]]}), flush=True)
    print(json.dumps(summary(runs), indent=2))


if __name__ == "__main__":
    main()
