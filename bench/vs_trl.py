"""rl-assets vs TRL: wall time from the same SFT checkpoint to a target held-out sampled accuracy.

    .venv/bin/python bench/vs_trl.py [--params params.yaml] [--rounds N] [--set section.key=value] [--gain 0.03 | --target 0.45] [--max-rounds N]
                                     [--seeds 0,1,2]

rl-assets: the whole pipeline through Dagster (`python -m pipelines run`) in a fresh copy of the
project. Its time to target is when the first rNN/checkpoint whose sampled accuracy (the evaluation
asset) reaches the target finished materializing (Dagster's event log), minus when r00/checkpoint
finished: the SFT warm start is shared by both sides, so it is not counted.

TRL: `trl.GRPOTrainer` run directly, in its own Python process, from that same r00 checkpoint, with
the same reward functions and our `train`/`rollouts` sections mapped onto `GRPOConfig`
(`grpo_config` below). Its dataset is exactly the prompts our rounds drew, round after round, in
order (`shuffle_dataset=False`), so TRL's k-th generation batch holds our round k's B prompts; G
samples each; `num_iterations = train.epochs` passes of `train.minibatch_size`-completion
minibatches over it. After each such "round" a callback stops the clock, measures held-out sampled
accuracy with `rl_assets.eval.evaluation` (same prompts, samples, temperature and seed as the evaluation
asset; the RNG state is restored afterwards), starts the clock again, and stops training at the
target or after --max-rounds. TRL's clock starts when its process is launched (imports, model load
and trainer construction count, as the pipeline's step processes count on our side). What still
differs by design: TRL keeps one optimizer (and its Adam state) across rounds, as our rounds do
only with `train.carry_optimizer_state` (the default params set it), and TRL shuffles a round's
completions once where we reshuffle per epoch.
With the default guards, a blocking check can stop the pipeline early (`--set guards.kl_max=100`).

Prints both curves, then a JSON summary: times to target and their ratio (rl-assets / TRL), each
side's seconds to the end of round 1 and per later round, each side's wall time and the machine's
load average when it ended (other work on the machine slows either side). A target that is not
reached is a result (null), not an error. With --seeds, one comparison per seed, then time to target
on each side's mean curve over the seeds (the evaluation's noise, ~2 points per seed, shrinks with
the seeds' count; one seed's time to +3 points mostly says whose noise came up first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPY = ["rl_assets", "pipelines", "data/raw", "examples", "dagster.yaml", "workspace.yaml"]  # examples: their data files
LINK = ["base_models"]  # imported real models (`make real-model`): read only, linked rather than copied


def _rounded(accuracy: float | None) -> float | None:
    """An accuracy to 4 places; None where it was not measured (evaluation.greedy: false)."""
    return None if accuracy is None else round(accuracy, 4)


def make_project(params: Path, overrides: list[str]) -> Path:
    """A fresh copy of the project with `params` as its params.yaml, `section.key=value` overrides written into it."""
    import yaml

    root = Path(tempfile.mkdtemp(prefix="rl-assets-vs-trl-"))
    for item in COPY:
        source = REPO / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / item)
    for item in LINK:
        if (REPO / item).is_dir():
            (root / item).symlink_to(REPO / item)
    shutil.copy(params, root / "params.yaml")
    if overrides:
        data = yaml.safe_load((root / "params.yaml").read_text())
        for override in overrides:
            path, _, value = override.partition("=")
            *parents, leaf = path.split(".")
            node = data
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = yaml.safe_load(value)
        (root / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root


def child_env(root: Path) -> dict:
    """The same bare environment for both sides; PYTHONPATH makes the copy's rl_assets the one imported."""
    env = {"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(root / ".dagster"), "HOME": str(root), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(root)}
    env.update({k: v for k, v in os.environ.items() if k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")})
    return env


def run_logged(command: list[str], root: Path, log: Path) -> dict:
    """Run a side to completion; its wall seconds and the machine's load average (1 and 5 min) when it ended."""
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=root, stdout=out, stderr=subprocess.STDOUT, env=child_env(root))
    if done.returncode:
        sys.exit(f"{' '.join(command[:4])} failed (exit {done.returncode}) in {root}; last lines of {log}:\n{log.read_text()[-4000:]}")
    return {"wall_s": round(time.perf_counter() - started, 1), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()[:2]]}


def pipeline_curve(root: Path) -> dict:
    """Accuracy per checkpoint (evaluation asset) and seconds from r00/checkpoint's materialization to each rNN/checkpoint's."""
    import pyarrow.parquet as pq
    from dagster import AssetKey, DagsterInstance

    rows = pq.read_table(root / "data/evaluation.parquet").to_pylist()
    accuracy = {(r["checkpoint"], r["mode"]): r["accuracy"] for r in rows}
    checkpoints = sorted({r["checkpoint"] for r in rows})
    with DagsterInstance.from_config(str(root / ".dagster")) as instance:
        finished, evaluation_s = {}, {}
        for name in checkpoints:
            event = instance.get_latest_materialization_event(AssetKey(name.split("/")))
            if event is None:
                sys.exit(f"no materialization of {name} in {root / '.dagster'}")
            finished[name] = event.timestamp
            seconds = event.asset_materialization.metadata.get("heldout_seconds")  # the checkpoint's own held-out evaluation
            evaluation_s[name] = seconds.value if seconds is not None else 0.0
    zero, curve, evaluating = finished["r00/checkpoint"], [], 0.0
    for name in checkpoints:
        evaluating += evaluation_s[name] if name != "r00/checkpoint" else 0.0  # r00's evaluation ends before the clock starts
        curve.append({"round": int(name[1:3]), "sampled_accuracy": round(accuracy[(name, "sampled")], 4),
                      "greedy_accuracy": _rounded(accuracy.get((name, "greedy"))), "elapsed_s": round(finished[name] - zero, 1),
                      "elapsed_without_evaluation_s": round(finished[name] - zero - evaluating, 1)})
    first = next(r for r in rows if r["mode"] == "sampled")
    return {"curve": curve, "eval": {"prompts": first["n_prompts"], "samples_per_prompt": first["n_samples"],
                                     "temperature": first["temperature"], "seed": first["seed"]}}


STEP_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "learning_rate": "learning_rate", "entropy": "entropy",
             "clip_fraction": "clip_ratio/region_mean", "clip_low": "clip_ratio/low_mean", "clip_high": "clip_ratio/high_mean"}


def step_point(entry: dict) -> dict:
    """One optimizer step's metrics under our names, from a TRL log entry (logging_steps=1) or our train history."""
    point = {"step": entry["step"]} if "step" in entry else {}
    for ours, theirs in STEP_KEYS.items():
        value = entry.get(ours, entry.get(theirs))
        if value is not None:
            point[ours] = round(float(value), 5)
    return point


def pipeline_steps(root: Path) -> list[dict]:
    """Every optimizer step of our rounds (each checkpoint's train history), numbered on from round to round."""
    from rl_assets.core.checkpoints import read_lineage

    steps = []
    for folder in sorted(p.parent for p in root.glob("data/**/r[0-9][0-9]/checkpoint/lineage.json")):
        for entry in read_lineage(folder).get("history", []):
            steps.append(step_point(entry) | {"step": len(steps) + 1})
    return steps


def time_to_target(curve: list[dict], target: float) -> float | None:
    return next((r["elapsed_s"] for r in curve if r["round"] > 0 and r["sampled_accuracy"] >= target - 1e-9), None)


def round_seconds(curve: list[dict]) -> dict:
    """Seconds to the end of round 1 (start-up included), and per round after it (the steady state)."""
    rounds = [r for r in curve if r["round"] > 0]
    if not rounds:
        return {"first_round_s": None, "later_rounds_s": None}
    later = (rounds[-1]["elapsed_s"] - rounds[0]["elapsed_s"]) / (len(rounds) - 1) if len(rounds) > 1 else None
    return {"first_round_s": rounds[0]["elapsed_s"], "later_rounds_s": round(later, 1) if later is not None else None}


# --- the TRL side: runs in its own process (`vs_trl.py _trl ...`) in the project copy -------------------------------


def grpo_config(params, prompts_per_round: int, max_rounds: int, output_dir: str, device: str):
    """Our `rollouts` and `train` sections mapped onto TRL's GRPOConfig, one generation batch = one of our rounds."""
    from trl import GRPOConfig

    from rl_assets.core.precision import resolve_mixed_precision

    use_cpu, precision = device == "cpu", resolve_mixed_precision(params.train.mixed_precision, device)  # as our training loop picks it

    train, G = params.train, params.rollouts.samples_per_prompt
    if train.algorithm != "grpo":
        raise SystemExit(f"train.algorithm={train.algorithm}: this benchmark compares GRPO only")
    completions = prompts_per_round * G
    if completions % train.minibatch_size:
        raise SystemExit(f"B x G = {completions} completions is not a multiple of train.minibatch_size={train.minibatch_size}")
    micro = train.minibatch_size // train.gradient_accumulation_steps  # TRL's batch sizes count completions, like ours
    steps_per_round = completions // train.minibatch_size * train.epochs
    return GRPOConfig(
        output_dir=output_dir, seed=params.seed, use_cpu=use_cpu, bf16=precision == "bf16", fp16=precision == "fp16", report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=1, dataloader_num_workers=0,  # every step's grad_norm and clip ratios, beside ours
        num_generations=G, temperature=params.rollouts.temperature, top_p=params.rollouts.top_p, top_k=0,
        max_completion_length=params.rollouts.max_new_tokens,
        per_device_train_batch_size=micro, gradient_accumulation_steps=train.gradient_accumulation_steps,
        generation_batch_size=completions, num_iterations=train.epochs, shuffle_dataset=False,
        max_steps=steps_per_round * max_rounds,
        learning_rate=train.learning_rate, lr_scheduler_type=train.lr_scheduler, warmup_steps=train.warmup_ratio,
        weight_decay=train.weight_decay, max_grad_norm=train.max_grad_norm,
        loss_type=train.loss_type, epsilon=train.epsilon, epsilon_high=train.epsilon_high, beta=train.beta,
        scale_rewards=train.scale_rewards, mask_truncated_completions=train.mask_truncated_completions,
        reward_weights=[f.weight for f in params.rewards.functions],
        gradient_checkpointing=train.gradient_checkpointing,  # explicit: TRL's configs default it to True
    ), steps_per_round


def trl_worker(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from rl_assets.core.params_file import load_params
    from rl_assets.eval.evaluation import eval_prompts, evaluate_checkpoint
    from rl_assets.core.policy import load_policy, pick_device
    from rl_assets.core.paths import checkpoint_key, data_dir, output_path
    from rl_assets.rewards import resolve_reward_function
    from rl_assets.rollout.selection import choose_prompts
    from rl_assets.core.schemas import read_table

    params = load_params("params.yaml")
    data = data_dir(params.experiment)
    prompts = read_table(output_path("prompts", data), "prompts")
    held_out = eval_prompts(prompts, params.evaluation)
    rows = []
    for n in range(1, args.max_rounds + 1):  # the prompts our round n draws, in order: TRL's n-th generation batch
        chosen = choose_prompts(prompts, params.rollouts.prompts_per_round, n, params.seed)
        rows += [{"prompt": p, "answer": a, "prompt_id": i} for p, a, i in
                 zip(chosen["prompt"].to_pylist(), chosen["answer"].to_pylist(), chosen["prompt_id"].to_pylist())]
    prompts_per_round = len(rows) // args.max_rounds
    device = pick_device(params.compute.device)
    model, tokenizer = load_policy(output_path(checkpoint_key(0), data), device)
    model.train()
    config, steps_per_round = grpo_config(params, prompts_per_round, args.max_rounds, str(Path(args.out).parent / "trl-output"), device)
    rewards = [resolve_reward_function(f.name, f.options) for f in params.rewards.functions]

    class RoundEval(TrainerCallback):
        """After each round's worth of optimizer steps: held-out accuracy off the clock; stop at the target."""

        def __init__(self):
            self.curve, self.eval_s, self.eval_cpu_s = [], 0.0, 0.0

        def evaluate(self, model, round_number: int, ended: float) -> float:
            cpu = time.process_time()
            rng = torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
            training = model.training
            model.eval()
            result = {r["mode"]: r["accuracy"] for r in evaluate_checkpoint(model, tokenizer, held_out, params.evaluation, params.seed, params.rewards)}
            model.train(training)
            torch.set_rng_state(rng[0])
            if rng[1] is not None:
                torch.cuda.set_rng_state_all(rng[1])
            self.curve.append({"round": round_number, "sampled_accuracy": round(result["sampled"], 4), "greedy_accuracy": _rounded(result.get("greedy")),
                               "elapsed_s": round(ended - args.t0 - self.eval_s, 1), "cpu_s": round(cpu - self.eval_cpu_s, 1)})
            self.eval_s += time.time() - ended
            self.eval_cpu_s += time.process_time() - cpu
            print(f"trl round {round_number}: sampled {result['sampled']:.4f} greedy {_rounded(result.get('greedy'))} "
                  f"at {self.curve[-1]['elapsed_s']} s", file=sys.stderr, flush=True)
            return result["sampled"]

        def on_train_begin(self, args_, state, control, model=None, **kwargs):
            self.evaluate(model, 0, time.time())

        def on_step_end(self, args_, state, control, model=None, **kwargs):
            if state.global_step % steps_per_round == 0:
                accuracy = self.evaluate(model, state.global_step // steps_per_round, time.time())
                if accuracy >= args.target - 1e-9 and not args.full:
                    control.should_training_stop = True

    callback = RoundEval()
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[callback])
    ready = time.time()
    trainer.train()
    import trl

    Path(args.out).write_text(json.dumps({
        "curve": callback.curve, "eval_s_excluded": round(callback.eval_s, 1), "setup_s": round(ready - args.t0, 1),
        "steps_per_round": steps_per_round, "prompts_per_round": prompts_per_round, "trl_version": trl.__version__, "device": device,
        "steps": [step_point(entry) for entry in trainer.state.log_history if "grad_norm" in entry],
        "config": {k: getattr(config, k) for k in ("num_generations", "generation_batch_size", "steps_per_generation", "per_device_train_batch_size",
                                                   "gradient_accumulation_steps", "num_iterations", "learning_rate", "lr_scheduler_type", "loss_type",
                                                   "scale_rewards", "epsilon", "epsilon_high", "beta", "temperature", "top_p", "top_k",
                                                   "max_completion_length", "max_grad_norm", "shuffle_dataset", "gradient_checkpointing", "bf16")},
    }, default=str))


# --- the comparison --------------------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_trl":
        worker = argparse.ArgumentParser()
        for name, kind in (("--target", float), ("--max-rounds", int), ("--out", str), ("--t0", float)):
            worker.add_argument(name, type=kind, required=True)
        worker.add_argument("--full", action="store_true")
        return trl_worker(worker.parse_args(sys.argv[2:]))

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--rounds", type=int, default=None, help="override params `rounds` (the pipeline's RL rounds)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a params value in the copy")
    parser.add_argument("--target", type=float, default=None, help="absolute held-out sampled accuracy to reach")
    parser.add_argument("--gain", type=float, default=0.03, help="target = r00's sampled accuracy + gain (when --target is not given)")
    parser.add_argument("--max-rounds", type=int, default=None, help="TRL stops after this many rounds (default: the pipeline's rounds)")
    parser.add_argument("--full", action="store_true", help="TRL runs all --max-rounds rounds instead of stopping at the target")
    parser.add_argument("--pipeline-root", type=Path, default=None, help="reuse a finished copy (kept by --keep) instead of running the pipeline")
    parser.add_argument("--keep", action="store_true", help="keep the project copy (its path is printed)")
    parser.add_argument("--seeds", default=None, metavar="0,1,2",
                        help="one comparison per seed (`seed=N` override, TRL runs every round), then time to target on the mean curves")
    args = parser.parse_args()

    if args.seeds and args.pipeline_root:
        parser.error("--seeds runs a pipeline per seed; it cannot reuse --pipeline-root")
    if not args.seeds:
        print(json.dumps(compare(args, args.overrides, args.full), indent=2))
        return
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        print(f"\n=== seed {seed} ===", file=sys.stderr, flush=True)
        runs.append(compare(args, args.overrides + [f"seed={seed}"], full=True))  # full curves: the mean curve needs every round
        print(json.dumps({k: runs[-1][k] for k in ("overrides", "target_sampled_accuracy", "ratio_time_to_target_rl_assets_over_trl",
                                                      "ratio_later_rounds_rl_assets_over_trl", "ratio_later_rounds_without_evaluation")}), flush=True)
    print(json.dumps(across_seeds(runs, args.target, args.gain), indent=2))


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """Round by round over the rounds every seed has: mean sampled accuracy and mean elapsed seconds."""
    rounds = min(len(curve) for curve in curves)
    return [{"round": curves[0][i]["round"],
             "sampled_accuracy": round(statistics.fmean(c[i]["sampled_accuracy"] for c in curves), 4),
             "elapsed_s": round(statistics.fmean(c[i]["elapsed_s"] for c in curves), 1)} for i in range(rounds)]


def across_seeds(runs: list[dict], target: float | None, gain: float) -> dict:
    """One comparison over several seeds: each seed's ratios, and time to target on the two mean curves.

    A seed's held-out accuracy moves by about 2 points from evaluation noise alone, so one seed's time to
    +3 points mostly says which side's noise came up first; the mean over n seeds has 1/sqrt(n) of that noise.
    """
    ours, theirs = mean_curve([r["rl_assets"]["curve"] for r in runs]), mean_curve([r["trl"]["curve"] for r in runs])
    goal = target if target is not None else round(ours[0]["sampled_accuracy"] + gain, 4)
    ours_t, theirs_t = time_to_target(ours, goal), time_to_target(theirs, goal)
    later = [r["ratio_later_rounds_rl_assets_over_trl"] for r in runs if r["ratio_later_rounds_rl_assets_over_trl"]]
    bare = [r["ratio_later_rounds_without_evaluation"] for r in runs if r["ratio_later_rounds_without_evaluation"]]
    return {
        "seeds": [next((o for o in r["overrides"] if o.startswith("seed=")), None) for r in runs],
        "per_seed": [{k: r[k] for k in ("target_sampled_accuracy", "ratio_time_to_target_rl_assets_over_trl", "ratio_later_rounds_rl_assets_over_trl",
                                        "ratio_later_rounds_without_evaluation")}
                     | {"rl_assets_time_to_target_s": r["rl_assets"]["time_to_target_s"], "trl_time_to_target_s": r["trl"]["time_to_target_s"]}
                     for r in runs],
        "mean_curve_target_sampled_accuracy": goal,
        "mean_curves": {"rl_assets": ours, "trl": theirs},
        "mean_curves_time_to_target_s": {"rl_assets": ours_t, "trl": theirs_t},
        "ratio_time_to_target_on_mean_curves": round(ours_t / theirs_t, 2) if ours_t and theirs_t else None,
        "median_ratio_later_rounds": round(statistics.median(later), 2) if later else None,
        "median_ratio_later_rounds_without_evaluation": round(statistics.median(bare), 2) if bare else None,
    }


def compare(args: argparse.Namespace, overrides: list[str], full: bool) -> dict:
    """One seed: the pipeline in a fresh copy (or a kept one), then TRL from its r00; the summary of both curves."""
    python = str(REPO / ".venv/bin/python")
    root = args.pipeline_root.resolve() if args.pipeline_root else make_project(args.params, overrides + ([f"rounds={args.rounds}"] if args.rounds is not None else []))
    try:
        pipeline_run = None
        if args.pipeline_root is None:
            print(f"rl-assets: python -m pipelines run in {root} ...", file=sys.stderr, flush=True)
            pipeline_run = run_logged([python, "-m", "pipelines", "run"], root, root / "pipeline.log")
            (root / "pipeline-run.json").write_text(json.dumps(pipeline_run))
        elif (root / "pipeline-run.json").is_file():
            pipeline_run = json.loads((root / "pipeline-run.json").read_text())
        ours = pipeline_curve(root)
        r00 = ours["curve"][0]["sampled_accuracy"]
        target = args.target if args.target is not None else round(r00 + args.gain, 4)
        max_rounds = args.max_rounds or (len(ours["curve"]) - 1)
        print(f"target sampled accuracy {target} (r00 {r00}); TRL GRPOTrainer, at most {max_rounds} rounds ...", file=sys.stderr, flush=True)
        out = root / "trl-result.json"
        t0 = time.time()
        command = [python, str(Path(__file__).resolve()), "_trl", "--target", str(target), "--max-rounds", str(max_rounds), "--out", str(out), "--t0", str(t0)]
        trl_run = run_logged(command + (["--full"] if full else []), root, root / "trl.log")
        theirs = json.loads(out.read_text())

        print(f"\n{'round':>5}  {'rl-assets sampled':>17} {'elapsed s':>10}   {'TRL sampled':>11} {'elapsed s':>10}")
        by_round = {r["round"]: r for r in theirs["curve"]}
        for row in ours["curve"] + [r for r in theirs["curve"] if r["round"] > len(ours["curve"]) - 1]:
            mine = row if row in ours["curve"] else None
            other = by_round.get(row["round"])
            left = f"{mine['sampled_accuracy']:>17.4f} {mine['elapsed_s']:>10.1f}" if mine else f"{'':>17} {'':>10}"
            right = f"{other['sampled_accuracy']:>11.4f} {other['elapsed_s']:>10.1f}" if other else ""
            print(f"{row['round']:>5}  {left}   {right}")
        ours_t, theirs_t = time_to_target(ours["curve"], target), time_to_target(theirs["curve"], target)
        ours_r, theirs_r = round_seconds(ours["curve"]), round_seconds(theirs["curve"])
        ours_bare = round_seconds([{**r, "elapsed_s": r["elapsed_without_evaluation_s"]} for r in ours["curve"]])
        summary = {
            "params": str(args.params), "overrides": overrides, "rounds": len(ours["curve"]) - 1, "target_sampled_accuracy": target,
            "target_rule": "--target" if args.target is not None else f"r00 sampled + {args.gain}",
            "evaluation": ours["eval"],
            "rl_assets": {"time_to_target_s": ours_t, **ours_r, "later_rounds_without_evaluation_s": ours_bare["later_rounds_s"],
                          "pipeline_process": pipeline_run,
                          "curve": ours["curve"], "steps": pipeline_steps(root)},
            "trl": {"time_to_target_s": theirs_t, **theirs_r, "trl_process": trl_run,
                    **{k: theirs[k] for k in ("setup_s", "eval_s_excluded", "steps_per_round", "trl_version", "device", "config")},
                    "curve": theirs["curve"], "steps": theirs.get("steps", [])},
            "same_r00_accuracy": ours["curve"][0]["sampled_accuracy"] == theirs["curve"][0]["sampled_accuracy"],
            "ratio_time_to_target_rl_assets_over_trl": round(ours_t / theirs_t, 2) if ours_t and theirs_t else None,
            "ratio_later_rounds_rl_assets_over_trl": round(ours_r["later_rounds_s"] / theirs_r["later_rounds_s"], 2)
            if ours_r["later_rounds_s"] and theirs_r["later_rounds_s"] else None,
            # TRL's evaluation is off its clock; ours runs inside each checkpoint's step. The same rule on both sides:
            "ratio_later_rounds_without_evaluation": round(ours_bare["later_rounds_s"] / theirs_r["later_rounds_s"], 2)
            if ours_bare["later_rounds_s"] and theirs_r["later_rounds_s"] else None,
        }
        return summary
    finally:
        if args.keep or args.pipeline_root:
            print(f"project copy kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
