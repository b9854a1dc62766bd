"""Code execution: run the program in a completion against its test cases, each run in the sandbox.

Test cases reach the reward as the `tests` keyword (a key of the data set's `extra` column): per row a
list whose items are either

- a Python statement (usually an `assert`), run after the program in the same interpreter, or
- `{"input": str, "output": str}`: the program runs with that stdin and must print that stdout
  (trailing whitespace of lines and of the whole output ignored).

The program is the last fenced code block of the completion (```python ... ```), or the whole
completion when it has none. The score is the share of test cases passed; a row without tests
scores None. A crash, a timeout, a blown limit or a forbidden action just fails the tests.
"""

from __future__ import annotations

import re
import secrets
from concurrent.futures import ThreadPoolExecutor

from rl_assets.rewards.sandbox import Limits, run_sandboxed

_FENCED = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)

# Runs the program, then each statement test; prints "<nonce> <i>" for every one that passes. The
# nonce comes on stdin, read before the program runs, so `exit(0)` or a stray print cannot fake a pass.
HARNESS = '''import os, sys
if os.environ.get("RL_ASSETS_SANDBOX_BLOCK_NETWORK"):
    def _refuse(event, args):
        if event.startswith("socket."):
            raise PermissionError("network access is blocked in the sandbox")
    sys.addaudithook(_refuse)
_nonce = sys.stdin.readline().strip() if sys.argv[1] == "asserts" else ""
_tests = [open(name).read() for name in sys.argv[2:]]
_namespace = {"__name__": "__main__"}
exec(compile(open("solution.py").read(), "solution.py", "exec"), _namespace)
for _index, _test in enumerate(_tests):
    try:
        exec(compile(_test, f"test_{_index}.py", "exec"), _namespace)
    except BaseException:
        continue
    sys.stdout.flush()
    print(f"\\n{_nonce} {_index}", flush=True)
'''


def extract_program(completion: str) -> str:
    """The last fenced code block of a completion, or the whole completion.

    >>> extract_program("Here:\\n```python\\nprint(1)\\n```\\nand\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_program("print(3)")
    'print(3)'
    """
    blocks = _FENCED.findall(completion)
    return blocks[-1] if blocks else completion


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def run_tests(program: str, tests: list, limits: Limits = Limits()) -> float:
    """The share of `tests` (statements and input/output pairs) the program passes, each run sandboxed."""
    statements = [t for t in tests if isinstance(t, str)]
    pairs = [t for t in tests if not isinstance(t, str)]
    passed = 0
    if statements:
        nonce = secrets.token_hex(16)
        files = {"solution.py": program, "harness.py": HARNESS, **{f"test_{i}.py": t for i, t in enumerate(statements)}}
        outcome = run_sandboxed(files, ["harness.py", "asserts", *(f"test_{i}.py" for i in range(len(statements)))], f"{nonce}\n", limits)
        if not outcome.timed_out and outcome.returncode == 0:
            passed += len({line for line in outcome.stdout.splitlines() if line.startswith(f"{nonce} ")})
    for pair in pairs:
        if not isinstance(pair, dict) or set(pair) != {"input", "output"}:
            raise ValueError(f"code_execution: a test case is a statement or {{'input': ..., 'output': ...}}, got {pair!r}")
        outcome = run_sandboxed({"solution.py": program, "harness.py": HARNESS}, ["harness.py", "io"], pair["input"], limits)
        if not outcome.timed_out and outcome.returncode == 0 and _normalized(outcome.stdout) == _normalized(pair["output"]):
            passed += 1
    return passed / len(tests)


def code_execution(completions: list[str], tests: list[list | None] | None = None, *, cpu_seconds: int = 5, memory_mb: int = 1024,
                   wall_seconds: float = 10.0, workers: int = 4, **kwargs) -> list[float | None]:
    """The share of each row's test cases that the completion's program passes (None: the row has no tests).

    Each program runs in a fresh sandboxed process (see `sandbox.py`), `workers` at a time.

    >>> code_execution(["```python\\ndef add(a, b):\\n    return a + b\\n```", "def add(a, b): return a - b", "x"],
    ...                tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 0"]] * 2 + [None])
    [1.0, 0.5, None]
    >>> code_execution(["print(int(input()) * 2)"], tests=[[{"input": "21\\n", "output": "42\\n"}]])
    [1.0]
    """
    tests = tests if tests is not None else [None] * len(completions)
    limits = Limits(cpu_seconds=cpu_seconds, memory_mb=memory_mb, wall_seconds=wall_seconds)

    def score(row: int) -> float | None:
        return run_tests(extract_program(completions[row]), tests[row], limits) if tests[row] else None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(score, range(len(completions))))
