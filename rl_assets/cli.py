"""The `rl-assets` command.

    rl-assets run [--set section.key=value ...]   the whole graph through Dagster (what `make run` does)
    rl-assets materialize r01/rewards             one asset through Dagster (what each DVC stage runs)
    rl-assets dvc-sync [--check]                  write dvc.yaml from the Dagster asset graph
    rl-assets lineage data/r02/checkpoint         walk a checkpoint back to its raw data
    rl-assets report                              the evaluation table
    rl-assets query "select round, avg(reward) from rewards group by round"   (views over every table)
    rl-assets status                              JSON health summary (latest run, round, metrics, promoted model)
    rl-assets generate --checkpoint promoted "7*8="   sample from any checkpoint (id, rNN, folder, promoted)
    rl-assets rollback                            restore the previously promoted model

Orchestration commands hand over to `python -m pipelines` in a new process, so this library never
imports Dagster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb

ORCHESTRATION = {"run", "materialize", "dvc-sync", "status"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ORCHESTRATION:
        return subprocess.call([sys.executable, "-m", "pipelines", *argv])

    parser = argparse.ArgumentParser(prog="rl-assets", description="RL post-training as versioned assets.",
                                     epilog="also: run, materialize KEY, dvc-sync, status (through Dagster)")
    commands = parser.add_subparsers(dest="command", required=True)
    lineage = commands.add_parser("lineage", help="walk a checkpoint back to its raw data")
    lineage.add_argument("checkpoint", help="checkpoint folder, e.g. data/r02/checkpoint")
    lineage.add_argument("--json", action="store_true", help="print the trace as JSON")
    commands.add_parser("report", help="print the evaluation table")
    query = commands.add_parser("query", help="run SQL with DuckDB over views of every table (raw_data, prompts, rollouts, "
                                "rewards, evaluation, checkpoints, promotions) or read_parquet('data/...')")
    query.add_argument("sql")
    generate = commands.add_parser("generate", help="sample completions from a checkpoint")
    generate.add_argument("prompts", nargs="+")
    generate.add_argument("--checkpoint", default="promoted", help="promoted, rNN, a checkpoint folder or id (prefix)")
    generate.add_argument("--samples", type=int, default=1, help="completions per prompt")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    generate.add_argument("--max-new-tokens", type=int, default=16)
    generate.add_argument("--seed", type=int, default=0)
    commands.add_parser("rollback", help="restore the model promoted before the current one")
    args = parser.parse_args(argv)

    try:
        if args.command == "lineage":
            from rl_assets.lineage import format_trace, trace_checkpoint

            steps = trace_checkpoint(args.checkpoint, Path("."))
            print(json.dumps(steps, indent=2, default=str) if args.json else format_trace(steps))
        elif args.command == "report":
            from rl_assets.evaluation import summary_text

            print(summary_text(Path(".")))
        elif args.command == "query":
            from rl_assets.lineage import connect_tables

            print(connect_tables(Path(".")).sql(args.sql))
        elif args.command == "generate":
            from rl_assets.generate import resolve_checkpoint, sample

            path = resolve_checkpoint(args.checkpoint, _params().promotion)
            print(f"# {path}", file=sys.stderr)
            for row in sample(path, args.prompts, args.samples, args.temperature, args.max_new_tokens, args.seed):
                print(json.dumps(row))
        elif args.command == "rollback":
            from rl_assets.promotion import models_dir, rollback

            print(json.dumps(rollback(models_dir(_params().promotion))))
    except (FileNotFoundError, ValueError, duckdb.Error) as error:
        print(f"rl-assets {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


def _params():
    from rl_assets.config import load_params

    return load_params(os.environ.get("RL_ASSETS_PARAMS", "params.yaml"))


if __name__ == "__main__":
    sys.exit(main())
