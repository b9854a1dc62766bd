"""Code-location load time: `import pipelines.definitions.code_location` vs a bare `import dagster` baseline.

    .venv/bin/python bench/import_time.py [--repeat 5]

Every UI reload and schedule tick loads the code location, so it must stay close to Dagster's own
import cost (the target is under 1.5 s on a 2-core laptop, i.e. no torch/transformers/trl import).
Each sample is a fresh interpreter; the median of each is reported with the ratio. Bytecode is written
and a first sample of each is discarded, so both sides load from `.pyc` files as an installed
Dagster and a user's code location do (with PYTHONDONTWRITEBYTECODE set, only the project's own
modules would be compiled again on every load).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def sample(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], cwd=REPO, check=True, capture_output=True, env=ENV)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for statement in ("import dagster", "import pipelines.definitions.code_location"):  # warm: bytecode written, files in the page cache
        sample(statement)
    baseline = statistics.median(sample("import dagster") for _ in range(args.repeat))
    definitions = statistics.median(sample("import pipelines.definitions.code_location") for _ in range(args.repeat))
    heavy = subprocess.run([sys.executable, "-c", "import sys, pipelines.definitions.code_location; print([m for m in ('torch', 'transformers', 'trl') if m in sys.modules])"],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()
    print(json.dumps({"import_dagster_s": round(baseline, 2), "import_definitions_s": round(definitions, 2),
                      "ratio": round(definitions / baseline, 2), "heavy_modules_loaded": heavy}, indent=2))


if __name__ == "__main__":
    main()
