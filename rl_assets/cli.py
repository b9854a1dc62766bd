"""The `rl-assets` command.

    rl-assets run [--set section.key=value ...]   the whole graph through Dagster (what `make run` does)
    rl-assets materialize r01/rewards             one asset through Dagster (what each DVC stage runs)
    rl-assets dvc-sync [--check]                  write dvc.yaml from the Dagster asset graph
    rl-assets lineage data/r02/checkpoint         walk a checkpoint back to its raw data
    rl-assets report                              the evaluation table
    rl-assets query "select ... from read_parquet('data/r*/rewards.parquet')"

Orchestration commands hand over to `python -m pipelines` in a new process, so this library never
imports Dagster.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import duckdb

ORCHESTRATION = {"run", "materialize", "dvc-sync"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ORCHESTRATION:
        return subprocess.call([sys.executable, "-m", "pipelines", *argv])

    parser = argparse.ArgumentParser(prog="rl-assets", description="RL post-training as versioned assets.",
                                     epilog="also: run, materialize KEY, dvc-sync (through Dagster)")
    commands = parser.add_subparsers(dest="command", required=True)
    lineage = commands.add_parser("lineage", help="walk a checkpoint back to its raw data")
    lineage.add_argument("checkpoint", help="checkpoint folder, e.g. data/r02/checkpoint")
    lineage.add_argument("--json", action="store_true", help="print the trace as JSON")
    commands.add_parser("report", help="print the evaluation table")
    query = commands.add_parser("query", help="run SQL over the Parquet tables with DuckDB")
    query.add_argument("sql")
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
            print(duckdb.sql(args.sql))
    except (FileNotFoundError, ValueError, duckdb.Error) as error:
        print(f"rl-assets {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
