"""Programs judged per second by the code_execution reward, sandboxed, vs the same programs run bare.

    .venv/bin/python bench/code_execution.py [--programs 48] [--workers 1 2 4]

Each program is one rollout's completion with three test cases: two asserts (judged by the two
sandboxes of judge.py: the program's and the judge's) and one stdin/stdout case (one more sandbox).
The bare baseline runs the same work the way a harness without a sandbox would: one `python3 -I`
with the program and its asserts, one with the program on the stdin case. Both sides use the same
interpreter (the system's python3) and `workers` threads, and both must give the same scores.
"""

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_assets.rewards.code_execution import code_execution, extract_program  # noqa: E402
from rl_assets.core.sandbox import sandbox_python  # noqa: E402

TESTS = ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", {"input": "20 22\n", "output": "42"}]
PROGRAMS = [  # right, wrong, crashing: what a batch of rollouts holds
    "```python\ndef add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n```",
    "```python\ndef add(a, b):\n    return a - b\nif __name__ == '__main__':\n    print(add(*map(int, input().split())))\n```",
    "```python\ndef add(a, b):\n    return sum([a, b])\nprint(add(*map(int, input().split())))\n```",
    "def add(a, b):\n    raise NotImplementedError\n",
]


def bare(completion: str) -> float:
    python, program = sandbox_python(), extract_program(completion)
    asserts = subprocess.run([python, "-I", "-c", program.replace("__name__ == '__main__'", "False") + "\n" + "\n".join(TESTS[:2])],
                             capture_output=True, stdin=subprocess.DEVNULL, timeout=10).returncode == 0
    printed = subprocess.run([python, "-I", "-c", program], input=TESTS[2]["input"], capture_output=True, text=True, timeout=10)
    io = printed.returncode == 0 and printed.stdout.strip() == TESTS[2]["output"]
    return (2 * asserts + io) / 3  # a failing assert stops the rest: bare harnesses rarely score asserts one by one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=48)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    completions = [PROGRAMS[i % len(PROGRAMS)] for i in range(args.programs)]
    code_execution(completions[:2], tests=[TESTS] * 2)  # warm up: the one-time sandbox probe, page cache
    results = []
    for workers in args.workers:
        started = time.perf_counter()
        sandboxed = code_execution(completions, tests=[TESTS] * len(completions), workers=workers)
        sandboxed_s = time.perf_counter() - started
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            baseline = list(pool.map(bare, completions))
        bare_s = time.perf_counter() - started
        results.append({"workers": workers, "programs": len(completions), "sandboxed_per_s": round(len(completions) / sandboxed_s, 1),
                        "bare_per_s": round(len(completions) / bare_s, 1), "ms_per_program_sandboxed": round(1000 * sandboxed_s / len(completions), 1),
                        "ms_per_program_bare": round(1000 * bare_s / len(completions), 1), "ratio": round(sandboxed_s / bare_s, 2),
                        "same_scores": sandboxed == baseline})
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
