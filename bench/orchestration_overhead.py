"""Orchestration overhead: the Dagster pipeline vs the same library calls in one plain Python process.

    .venv/bin/python bench/orchestration_overhead.py [--params params.yaml]

Both runs use the same params in fresh copies of the project and produce the same outputs; the
plain run is the loop a team would write by hand (one process, models kept loaded), so the ratio
(pipeline / plain) is what Dagster, its step processes, Pipes and DVC's records cost on top.
Both are measured in the same invocation, so the machine's load affects both.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPY = ["rl_assets", "pipelines", "data/raw", "dagster.yaml", "workspace.yaml"]


def make_project(params: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="rl-assets-bench-"))
    for item in COPY:
        source = REPO / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / item)
    shutil.copy(params, root / "params.yaml")
    return root


# A hand-written loop over the same library calls: one process, the models kept in memory from round to round.
PLAIN = """
from pathlib import Path
from rl_assets.config import load_params
from rl_assets.loaded import Loaded
from rl_assets.models import load_tokenizer
from rl_assets.paths import output_path
from rl_assets.prompts import build_prompts
from rl_assets.raw_data import load_raw_data
from rl_assets.schemas import PROMPTS, RAW_DATA, write_table
from rl_assets.stages import run_stage

params, root, loaded = load_params("params.yaml"), Path("."), Loaded()
raw, _ = load_raw_data(params.raw_data, params.seed)
write_table(raw, output_path("raw_data"), RAW_DATA, "raw_data")
prompts, _ = build_prompts(raw, params.prompts, load_tokenizer(params.model))
write_table(prompts, output_path("prompts"), PROMPTS, "prompts")
run_stage("sft", params, None, root, loaded)
for n in range(1, params.rounds + 1):
    for stage in ("rollouts", "rewards", "train"):
        run_stage(stage, params, n, root, loaded)
run_stage("evaluation", params, None, root, loaded)
"""


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(cwd / ".dagster"),
                                                                                    "HOME": str(cwd), "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode:
        sys.exit(f"{' '.join(command[:4])} failed in {cwd}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def checkpoint_ids(root: Path) -> list[str]:
    return [json.loads(card.read_text())["checkpoint_id"] for card in sorted(root.glob("data/r*/checkpoint/lineage.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    args = parser.parse_args()
    python = str(REPO / ".venv/bin/python")
    plain_root, pipeline_root = make_project(args.params), make_project(args.params)
    try:
        plain = timed([python, "-c", PLAIN], plain_root)
        pipeline = timed([python, "-m", "pipelines", "run"], pipeline_root)
        same = [json.loads((root / "data/evaluation.json").read_text()) for root in (plain_root, pipeline_root)]
        print(json.dumps({"params": str(args.params), "plain_python_s": round(plain, 1), "dagster_pipeline_s": round(pipeline, 1),
                          "overhead_ratio": round(pipeline / plain, 2), "same_evaluation": same[0] == same[1],
                          "same_checkpoints": checkpoint_ids(plain_root) == checkpoint_ids(pipeline_root)}, indent=2))
    finally:
        shutil.rmtree(plain_root, ignore_errors=True)
        shutil.rmtree(pipeline_root, ignore_errors=True)


if __name__ == "__main__":
    main()
