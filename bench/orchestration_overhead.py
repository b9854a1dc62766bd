"""Orchestration overhead: the Dagster pipeline vs the same library calls in one plain Python process.

    .venv/bin/python bench/orchestration_overhead.py [--params params.yaml] [--repeats 3] [--dvc]
    .venv/bin/python bench/orchestration_overhead.py --params examples/smollm2/params.yaml --repeats 1   # after make real-model

Both runs use the same params in fresh copies of the project and produce the same outputs; the
plain run is the loop a team would write by hand (one process, models kept loaded), so the ratio
(pipeline / plain) is what Dagster, its step processes and Pipes cost on top. With `--dvc` the
pipeline's copy is also a DVC project, so each output is recorded in dvc.lock as `make run` does
(the plain loop records nothing); without it the copies have no dvc.yaml and nothing is recorded.
Both sides are measured in the same invocation; with `--repeats` they alternate which goes first,
and the median ratio is the figure (one pair on a shared 2-core machine varies by ~0.1). Each pair also gives
the seconds each side spent outside its stages (start-up, orchestration, records; the stages' own durations
come from `.rl_assets/steps.jsonl`), and the summary the pipeline's median extra: the fixed cost, without the
stages' noise (it leaves out any slowdown of the stages themselves, which the ratio includes).
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPY = ["rl_assets", "pipelines", "data/raw", "dagster.yaml", "workspace.yaml"]


DVC_FILES = [".dvcignore", ".dvc/config", ".dvc/.gitignore"]


def make_project(params: Path, dvc: bool = False) -> Path:
    root = Path(tempfile.mkdtemp(prefix="rl-assets-bench-"))
    for item in COPY + (DVC_FILES if dvc else []):
        source, target = REPO / item, root / item
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    shutil.copy(params, root / "params.yaml")
    for shared in ("examples", "base_models"):  # what an example's params name by relative path (its data, an imported model)
        if (REPO / shared).is_dir() and f"{shared}/" in params.read_text():
            (root / shared).symlink_to(REPO / shared)
    if dvc:  # a DVC project as the repo is one: git, the DVC venv, dvc.yaml generated for these params
        (root / ".venv-dvc").symlink_to(REPO / ".venv-dvc")
        subprocess.run(["git", "init", "--quiet"], cwd=root, check=True)
        subprocess.run([str(REPO / ".venv/bin/python"), "-m", "pipelines", "dvc-sync"], cwd=root, check=True, capture_output=True)
    return root


# A hand-written loop over the same library calls: one process, the models kept in memory from round to round.
PLAIN = """
from pathlib import Path
from rl_assets.core.params_file import load_params
from rl_assets.run.loaded import Loaded
from rl_assets.core.paths import data_dir, output_path
from rl_assets.data.prompts import build_prompts
from rl_assets.data.raw_data import load_raw_data
from rl_assets.core.schemas import PROMPTS, RAW_DATA, write_table
from rl_assets.run.stages import run_stage
from rl_assets.core.tokenizer import load_tokenizer

params, root, loaded = load_params("params.yaml"), Path("."), Loaded()
raw, _ = load_raw_data(params.raw_data, params.seed)
write_table(raw, output_path("raw_data", data_dir(params.experiment)), RAW_DATA, "raw_data")
prompts, _ = build_prompts(raw, params.prompts, load_tokenizer(params.model))
write_table(prompts, output_path("prompts", data_dir(params.experiment)), PROMPTS, "prompts")
run_stage("sft", params, None, root, loaded)
for n in range(1, params.rounds + 1):
    for stage in ("rollouts", "rewards", "train"):
        run_stage(stage, params, n, root, loaded)
run_stage("evaluation", params, None, root, loaded)
run_stage("promote", params, None, root, loaded)
"""


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(cwd / ".dagster"),
                                                                                    "HOME": str(cwd), "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode:
        sys.exit(f"{' '.join(command[:4])} failed in {cwd}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def stage_seconds(root: Path) -> float:
    """Seconds the stages themselves took (`.rl_assets/steps.jsonl`, written by both sides): the same work on each side, so
    a side's wall time minus this is what it spent outside them (start-up, orchestration, records), a figure far less
    noisy than the wall times on a shared machine."""
    rows = [json.loads(line) for line in (root / ".rl_assets" / "steps.jsonl").read_text().splitlines() if line.strip()]
    return sum(row["seconds"] for row in rows)


def checkpoint_ids(root: Path) -> list[str]:
    return [json.loads(card.read_text())["checkpoint_id"] for card in sorted(root.glob("data/r*/checkpoint/lineage.json"))]


def promoted_id(root: Path) -> str | None:
    """The checkpoint id of the promoted model, None when none was promoted."""
    card = root / "models/promoted/model_card.json"
    return json.loads(card.read_text())["checkpoint_id"] if card.is_file() else None


def recorded_stages(root: Path) -> int:
    """How many stages the project's dvc.lock records."""
    import yaml

    lock = root / "dvc.lock"
    return len((yaml.safe_load(lock.read_text()) or {}).get("stages", {})) if lock.is_file() else 0


def measure_pair(params: Path, dvc: bool, plain_first: bool) -> dict:
    """One plain run and one pipeline run of `params`, in fresh copies, in the order asked."""
    python = str(REPO / ".venv/bin/python")
    plain_root, pipeline_root = make_project(params), make_project(params, dvc)
    sides = {"plain": ([python, "-c", PLAIN], plain_root), "pipeline": ([python, "-m", "pipelines", "run"], pipeline_root)}
    try:
        seconds = {side: timed(*sides[side]) for side in (("plain", "pipeline") if plain_first else ("pipeline", "plain"))}
        same = [json.loads((root / "data/evaluation.json").read_text()) for root in (plain_root, pipeline_root)]
        promoted = [promoted_id(root) for root in (plain_root, pipeline_root)]
        return {"first": "plain" if plain_first else "pipeline", "plain_python_s": round(seconds["plain"], 1),
                "dagster_pipeline_s": round(seconds["pipeline"], 1), "overhead_ratio": round(seconds["pipeline"] / seconds["plain"], 3),
                "outside_stages_s": {side: round(seconds[side] - stage_seconds(root), 1) for side, root in
                                     (("plain", plain_root), ("pipeline", pipeline_root))},
                "same_evaluation": same[0] == same[1], "same_checkpoints": checkpoint_ids(plain_root) == checkpoint_ids(pipeline_root),
                "same_promoted": promoted[0] == promoted[1],
                **({"dvc_lock_stages": recorded_stages(pipeline_root)} if dvc else {})}
    finally:
        shutil.rmtree(plain_root, ignore_errors=True)
        shutil.rmtree(pipeline_root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--repeats", type=int, default=1, help="pairs to measure, alternating which side goes first (default 1)")
    parser.add_argument("--dvc", action="store_true", help="the pipeline records each output in dvc.lock, as `make run` does")
    args = parser.parse_args()
    pairs = []
    for n in range(args.repeats):
        pairs.append(measure_pair(args.params, args.dvc, plain_first=n % 2 == 0))
        print(json.dumps(pairs[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"params": str(args.params), "dvc": args.dvc, "pairs": pairs,
                      "overhead_ratio": round(statistics.median(p["overhead_ratio"] for p in pairs), 2),
                      "extra_outside_stages_s": round(statistics.median(p["outside_stages_s"]["pipeline"] - p["outside_stages_s"]["plain"]
                                                                        for p in pairs), 1),
                      "same_evaluation": all(p["same_evaluation"] for p in pairs),
                      "same_checkpoints": all(p["same_checkpoints"] for p in pairs),
                      "same_promoted": all(p["same_promoted"] for p in pairs)}, indent=2))


if __name__ == "__main__":
    main()
