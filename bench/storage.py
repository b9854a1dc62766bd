"""Object storage: what pushing each output costs a run, and what retention gives back on disk.

    .venv/bin/python bench/storage.py [--params params.yaml] [--pairs 1] [--keep 2] [--set section.key=value]

Each pair is the whole pipeline (`python -m pipelines run`) twice, in fresh copies of the project (bench/vs_trl.py's
make_project, with DVC set up as `make setup` leaves it): once without a remote, once pushing each output to an S3 server
on 127.0.0.1 (moto's, the S3 wire protocol; `storage.push: output`), the two runs back to back on this machine. The
ratio of their seconds per round (from Dagster's event log, round 1 to the last) is the push's cost. Then, on the
pushing copy, the disk use of data/ and DVC's cache before and after `rl-assets retire --keep N`. Prints JSON lines,
then the summary.

    .venv/bin/python bench/storage.py --compact     # train.checkpoint_dtype: float32 vs bfloat16, both pushing

runs the pipeline twice instead, each pushing each output: round checkpoints saved in float32, then in bf16, and gives
each side's data/, run state, DVC cache and remote sizes, its seconds per round and its held-out accuracy curve.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import REPO, child_env, make_project, pipeline_curve, round_seconds  # noqa: E402

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def dvc_project(params: Path, overrides: list[str]) -> Path:
    """A fresh copy set up as `make setup` leaves the project: DVC initialised, dvc.yaml generated, a git repository."""
    root = make_project(params, overrides)
    for name in (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    for venv in (".venv", ".venv-dvc"):
        (root / venv).symlink_to(REPO / venv)
    subprocess.run(["git", "init", "--quiet"], cwd=root, check=True)
    command(root, ["-m", "pipelines", "dvc-sync"])
    return root


def command(root: Path, args: list[str], log: Path | None = None) -> dict:
    started = time.perf_counter()
    with (log.open("w") if log else open(os.devnull, "w")) as out:
        done = subprocess.run([str(REPO / ".venv/bin/python"), *args], cwd=root, stdout=out, stderr=subprocess.STDOUT,
                              env={**child_env(root), **CREDENTIALS})
    if done.returncode:
        sys.exit(f"{' '.join(args)} failed in {root}" + (f"; last lines of {log}:\n{log.read_text()[-4000:]}" if log else ""))
    return {"wall_s": round(time.perf_counter() - started, 1), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()[:2]]}


def mib(paths) -> float:
    """MiB of the regular files among `paths` (links not followed: the venvs are links)."""
    return round(sum(f.stat().st_size for f in paths if f.is_file() and not f.is_symlink()) / 2**20, 1)


def disk_mib(root: Path) -> dict:
    return {"data_mib": mib((root / "data").rglob("*")), "dvc_cache_mib": mib((root / ".dvc" / "cache").rglob("*"))}


def run_side(params: Path, overrides: list[str], remote: str | None, endpoint: str | None, push: str = "output") -> tuple[dict, Path]:
    storage = ([f"storage.remote={remote}", f"storage.push={push}"] + ([f"storage.endpoint_url={endpoint}"] if endpoint else [])) if remote else []
    root = dvc_project(params, overrides + storage)
    process = command(root, ["-m", "pipelines", "run"], root / "pipeline.log")
    curve = pipeline_curve(root)["curve"]
    last = (root / "pipeline.log").read_text().splitlines()
    return {"remote": remote, "push": push if remote else None, "process": process, "seconds_per_round": round_seconds(curve)["later_rounds_s"],
            "storage_line": next((line for line in last if line.startswith("storage:")), None)}, root


def remote_mib(endpoint: str, prefix: str) -> float:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in CREDENTIALS.items() if k != "AWS_DEFAULT_REGION"},
                      region_name=CREDENTIALS["AWS_DEFAULT_REGION"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="rl-assets", Prefix=prefix)
    return round(sum(o["Size"] for page in pages for o in page.get("Contents", [])) / 2**20, 1)


def compact_sides(args, s3: str, roots: list[Path]) -> None:
    sides = {}
    for dtype in ("float32", "bfloat16"):
        result, root = run_side(args.params, args.overrides + [f"train.checkpoint_dtype={dtype}"], f"s3://rl-assets/{dtype}", s3)
        roots.append(root)
        curve = pipeline_curve(root)["curve"]
        sides[dtype] = {**result, **disk_mib(root), "run_state_mib": mib((root / "data" / "run_state").rglob("*")),
                        "checkpoints_mib": mib(f for n in range(1, 100) for f in (root / "data" / f"r{n:02d}" / "checkpoint").glob("*")),
                        "remote_mib": remote_mib(s3, dtype), "sampled_accuracy": [point["sampled_accuracy"] for point in curve]}
        print(json.dumps({dtype: sides[dtype]}), flush=True)
    ratio = {key: round(sides["bfloat16"][key] / sides["float32"][key], 3)
             for key in ("data_mib", "dvc_cache_mib", "checkpoints_mib", "remote_mib", "seconds_per_round") if sides["float32"][key]}
    print(json.dumps({"summary": {"bfloat16_vs_float32": ratio}}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--keep", type=int, default=2, help="retention: rl-assets retire --keep N")
    parser.add_argument("--remote", choices=["s3", "dir"], default="s3", help="moto's S3 on loopback, or a directory")
    parser.add_argument("--push", choices=["output", "round", "run"], default="output", help="storage.push of the pushing side")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--compact", action="store_true", help="float32 vs bfloat16 round checkpoints (train.checkpoint_dtype), both pushing")
    args = parser.parse_args()
    import logging
    import tempfile

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs a line per request otherwise

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=s3, aws_access_key_id="bench", aws_secret_access_key="bench",
                 region_name="us-east-1").create_bucket(Bucket="rl-assets")
    ratios, roots = [], []
    try:
        if args.compact:
            return compact_sides(args, s3, roots)
        for pair in range(args.pairs):
            plain, plain_root = run_side(args.params, args.overrides, None, None)
            remote = f"s3://rl-assets/pair{pair}" if args.remote == "s3" else tempfile.mkdtemp(prefix="rl-assets-remote-")
            pushed, pushed_root = run_side(args.params, args.overrides, remote, s3 if args.remote == "s3" else None, args.push)
            roots += [plain_root, pushed_root]
            ratio = round(pushed["seconds_per_round"] / plain["seconds_per_round"], 3)
            ratios.append(ratio)
            print(json.dumps({"pair": pair, "without_remote": plain, "pushing_each_output": pushed, "ratio_seconds_per_round": ratio}), flush=True)
        before = disk_mib(pushed_root)
        retired = command(pushed_root, ["-m", "pipelines", "retire", "--keep", str(args.keep)], pushed_root / "retire.log")
        after = disk_mib(pushed_root)
        retire_log = (pushed_root / "retire.log").read_text().splitlines()
        print(json.dumps({"summary": {"pairs": args.pairs, "ratio_seconds_per_round": ratios,
                                      "median_ratio": statistics.median(ratios), "target": "<= 1.05",
                                      "retention": {"keep": args.keep, "before": before, "after": after, "wall_s": retired["wall_s"],
                                                    "retired": [line.split()[-1] for line in retire_log if line.startswith("retire ")]}}},
                         indent=2))
    finally:
        server.stop()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
