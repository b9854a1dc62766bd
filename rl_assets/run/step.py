"""Compute steps from the command line, without an orchestrator.

    python -m rl_assets.run.step {sft,rollouts,rewards,train,evaluation,reward_model,promote} [--round N] [--params params.yaml] [--set k=v]
    python -m rl_assets.run.step r01/rollouts r01/rewards r01/checkpoint r02/rollouts ...   # several outputs, models kept loaded
    torchrun --nproc_per_node=2 -m rl_assets.run.step train --round 1

A stage name runs that step (rl_assets.run.stages); asset keys run those outputs in one resident
process (rl_assets.run.resident) and stop at a failed blocking guard. Dagster launches the same loop (`run`)
through `pipelines.launch.pipes_child`, whose reporter sends each output to Dagster as a materialization.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from rl_assets.core.config import Params
from rl_assets.core.params_file import load_params
from rl_assets.core.stage_table import COMPUTE_STAGES


def parse_args(argv: list[str] | None = None, prog: str = "python -m rl_assets.run.step") -> tuple[argparse.Namespace, Params]:
    """The outputs asked for and the params; `args.stage` is the one stage asked for by name, else None (asset keys)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("outputs", nargs="+", metavar="STAGE_OR_KEY", help=f"a stage ({', '.join(COMPUTE_STAGES)}) or asset keys (r01/rollouts ...)")
    parser.add_argument("--round", type=int, default=None, help="round number N for a round's stage")
    parser.add_argument("--params", default=os.environ.get("RL_ASSETS_PARAMS", "params.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--resolved-params", metavar="FILE", help="params already resolved by the orchestrator (JSON of every field: "
                        "file, ${VAR} and --set applied once), instead of --params and --set")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch's CPU threads (default: torch's, every core); "
                        "a run whose sampling and training overlap gives each step half")
    args = parser.parse_args(argv)
    if args.resolved_params and args.overrides:
        parser.error("--resolved-params already has the overrides applied; --set goes with --params")
    # A stage's name runs that stage; anything else is asset keys ("evaluation" is both: the key, with its guards).
    args.stage = args.outputs[0] if len(args.outputs) == 1 and args.outputs[0] in COMPUTE_STAGES and not _is_key(args.outputs[0]) else None
    if args.stage is None and args.round is not None:
        parser.error("--round goes with a stage name (sft, rollouts, rewards, train, ...); asset keys name their round (r02/rollouts)")
    if args.resolved_params:  # validated as they are: the orchestrator's ${VAR} values, never this process's environment
        return args, Params.model_validate_json(Path(args.resolved_params).read_text())
    return args, load_params(args.params, args.overrides)


def _is_key(name: str) -> bool:
    from rl_assets.core.paths import stage_of

    try:
        stage_of(name)
        return True
    except ValueError:
        return False


def stage_key(stage: str, round_number: int | None) -> str:
    """The output a stage writes (its first), in round `round_number`: `train`, 3 -> r03/checkpoint."""
    from rl_assets.core.paths import round_prefix
    from rl_assets.core.stage_table import STAGE_TABLE

    key = STAGE_TABLE[stage].outputs[0]
    return key.replace("rNN", round_prefix(round_number)) if round_number is not None else key


def printed(params: Params):
    """The reporter of a step run by hand: each output's path and scalar metadata as JSON on stdout."""

    @contextlib.contextmanager
    def session():
        yield lambda output: print(json.dumps({"output": str(output.path), "key": output.key, **{
            k: v for k, v in output.metadata.items() if not isinstance(v, dict)}}, indent=2, default=str), flush=True)

    return session()


def run(args: argparse.Namespace, params: Params, reporter=printed, launched: bool = False) -> int:
    """Write the outputs asked for and hand each, as rank 0 wrote it, to `reporter`'s session on the reporting rank.

    The one loop of every compute child: by hand (`printed`), or under Dagster (`pipelines.launch.pipes_child`, whose
    reporter opens a Pipes session). `reporter(params)` is a context manager yielding `report(output)`. `launched`: an
    orchestrator started this process (then its lowest rank reports: rl_assets.run.process.reporting_rank).
    """
    from rl_assets.eval.output_guards import evaluate_guards
    from rl_assets.run.process import as_on_rank_0, quiet_step, reporting_rank, start_distributed, stop_distributed
    from rl_assets.run.resident import Output, write_outputs
    from rl_assets.run.stages import run_stage

    quiet_step()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    rank = start_distributed(params)
    reporting = rank == reporting_rank(launched)  # a collective: before any stage's, on every machine of the step alike
    if args.stage is not None:  # as an Output, as write_outputs gives them (it runs no guards: a stage by name is unguarded)
        outputs = iter([Output(stage_key(args.stage, args.round), *run_stage(args.stage, params, args.round, Path(".")))])
    else:
        outputs = write_outputs(args.outputs, params)
    if reporting:
        with reporter(params) as report:  # an exception inside is the reporter's to report too (Pipes: the run's event log)
            for output in as_on_rank_0(outputs):  # each as soon as it is written
                if rank != 0 and args.stage is None:  # rank 0 may be another machine's, which ran the guards: run them here
                    output.guards = evaluate_guards(output.key, params)
                report(output)
    else:
        for _ in as_on_rank_0(outputs):  # the same collectives as the reporting rank
            pass
    stop_distributed()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one step, or several outputs resident; the reporting rank prints each output path and its scalar metadata."""
    from rl_assets.run.preflight import check_user_code
    from rl_assets.run.process import exit_with_launcher

    exit_with_launcher()  # under torchrun: a rank whose agent was killed stops too
    args, params = parse_args(argv)
    check_user_code(params, args.params)  # the preflight of a run; under Dagster `rl-assets run` took it before the step
    return run(args, params)


if __name__ == "__main__":
    sys.exit(main())
