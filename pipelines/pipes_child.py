"""A compute step as a Dagster Pipes child process (what the compute assets launch).

    python -m pipelines.pipes_child STAGE [--round N] [--params params.yaml] [--set k=v]
    python -m torch.distributed.run --standalone --nproc_per_node=N -m pipelines.pipes_child train --round 1

Rank 0 opens the Pipes session and reports the step's metadata and its output's content hash as the
data version; other ranks only compute. Imports dagster_pipes (no Dagster), so the child stays light.
"""

import sys
from pathlib import Path

from dagster_pipes import open_dagster_pipes

from rl_assets import compute
from rl_assets.storage import content_hash


def main(argv: list[str] | None = None) -> int:
    args, params = compute.parse_args(argv, prog="python -m pipelines.pipes_child")
    if compute.start_distributed(params) == 0:
        with open_dagster_pipes() as pipes:
            metadata, output = compute.run_stage(args.stage, params, args.round, Path("."))
            pipes.report_asset_materialization(metadata=metadata, data_version=content_hash(output))
    else:
        compute.run_stage(args.stage, params, args.round, Path("."))
    compute.stop_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
