"""Code execution: run the program in a completion against its test cases, judged outside the program's process.

Test cases reach the reward as the `tests` keyword (a key of the data set's `extra` column): per row a
list whose items are any of

- a Python statement, usually an `assert` (`"assert add(1, 2) == 3"`; a HumanEval `check` function
  plus its call works too). The statements run, in order and sharing one namespace, in a judge
  process of their own (`judge.py`) that never runs the program: each name the program defines is
  a plain value or a handle through which the judge calls into the program's process;
- `{"call": name, "args": [...], "kwargs": {...}, "output": value}`: the judge calls the program's
  function and compares the result (tuples as lists) with the JSON `output`;
- `{"input": str, "output": str}`: the program runs with that stdin and must print that stdout
  (trailing whitespace of lines and of the whole output ignored); the host compares.

The program is the last fenced code block of the completion (```python ... ```), or the whole
completion when it has none; it runs with `__name__ == "solution"` for the first two kinds and as a
script for the third. Everything runs in the bubblewrap sandbox of `rl_assets/core/sandbox.py` (no sandbox: an
error, never a bare run). The score is the share of test cases passed; a row without tests scores
None. A crash, a timeout or a blown limit fails the tests not yet passed.

What a program cannot do to fake a pass, and why:
- print or forge a pass marker, tamper with the harness (`__main__`, the test list), `os._exit(0)`,
  `sys.exit(0)`/`SystemExit`, patch builtins or `operator`, monkey-patch comparisons: verdicts are
  written by the judge's process, which the program cannot reach; its builtins are its own;
- return an object that claims to equal everything (`__eq__` always True, an `int` subclass that
  does): values cross as plain data and compare with the judge's `==`; other objects are handles
  that equal only themselves;
- read the expected values: the tests' source is only in the judge's sandbox, and the program is
  only sent the arguments of its calls.

What the test itself must do (the program can still win these honestly-looking ways):
- a test whose passing value is implied by its shape passes a constant: `assert is_prime(7)` alone
  is passed by `return True` (pair positive and negative cases);
- a name the test does not define or import is the program's: `assert isclose(f(1), 0.5)` with the
  program's own `isclose` lets the program decide (import it in the test); stdlib modules the program
  imported are the judge's own, built-in names are always the judge's;
- an expected value built by the program (`assert f(1) == Point(1, 2)`) would be the program's to
  decide, so handles compare by identity and such a test fails even for a right program: expected
  values should be plain data;
- stdin/stdout tests see only the output text: a program that knows the answer can print it.

tests/rl_assets/core/test_sandbox_hostile.py holds a program for each trick above, each scoring 0.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rl_assets.core.sandbox import Limits, Sandbox, require_sandbox, run_sandboxed, sandbox_python

_FENCED = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
JUDGE = Path(__file__).with_name("judge.py")


def extract_program(completion: str) -> str:
    """The last fenced code block of a completion, or the whole completion.

    >>> extract_program("Here:\\n```python\\nprint(1)\\n```\\nand\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_program("print(3)")
    'print(3)'
    """
    blocks = _FENCED.findall(completion)
    return blocks[-1] if blocks else completion


def _kind(test) -> str:
    """'statement', 'call' or 'io'; anything else is an error in the data set."""
    if isinstance(test, str):
        return "statement"
    if isinstance(test, dict) and set(test) == {"input", "output"} and all(isinstance(v, str) for v in test.values()):
        return "io"
    if (isinstance(test, dict) and {"call", "args", "output"} <= set(test) <= {"call", "args", "kwargs", "output"}
            and isinstance(test["call"], str) and isinstance(test["args"], list) and isinstance(test.get("kwargs", {}), dict)):
        return "call"
    raise ValueError("code_execution: a test case is a statement, {'input': str, 'output': str} or "
                     f"{{'call': name, 'args': [...], 'kwargs'?: {{...}}, 'output': value}}, got {test!r}")


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def run_tests(program: str, tests: list, limits: Limits = Limits()) -> float:
    """The share of `tests` (statements, calls and input/output pairs) the program passes, each run sandboxed."""
    kinds = [_kind(test) for test in tests]
    judged = [{"code": test} if kind == "statement" else test for test, kind in zip(tests, kinds) if kind != "io"]
    passed = judge_program(program, judged, limits) if judged else 0
    for test, kind in zip(tests, kinds):
        if kind == "io":
            outcome = run_sandboxed({"solution.py": program}, ["solution.py"], test["input"], limits)
            passed += not outcome.timed_out and outcome.returncode == 0 and _normalized(outcome.stdout) == _normalized(test["output"])
    return passed / len(tests)


def judge_program(program: str, tests: list[dict], limits: Limits = Limits()) -> int:
    """How many of `tests` ({"code": statement} or call dicts) the program passes: program and judge in two sandboxes, joined by pipes."""
    python, source = sandbox_python(), JUDGE.read_text()
    requests, replies = os.pipe(), os.pipe()  # (read, write) each: judge -> program, program -> judge
    open_fds = {*requests, *replies}
    try:
        with Sandbox({"judge.py": source, "solution.py": program}, [python, "-I", "judge.py", "serve", str(requests[0]), str(replies[1])],
                     limits, pass_fds=(requests[0], replies[1])), \
             Sandbox({"judge.py": source, "tests.json": json.dumps(tests)}, [python, "-I", "-S", "judge.py", "judge", str(replies[0]), str(requests[1])],
                     limits, pass_fds=(replies[0], requests[1])) as judging:
            for fd in open_fds:  # only the two sandboxes hold the pipes now, so each sees EOF when the other ends
                os.close(fd)
            open_fds.clear()
            judging.wait()
            judging.kill()
            verdicts = judging.outcome().stdout
    finally:
        for fd in open_fds:
            os.close(fd)
    passed = set()
    for line in verdicts.splitlines():
        index, _, verdict = line.partition(" ")
        if index.isdigit() and verdict == "1":
            passed.add(int(index))
    return len(passed & set(range(len(tests))))


def code_execution(completions: list[str], tests: list[list | None] | None = None, *, cpu_seconds: int = 5, memory_mb: int = 1024,
                   wall_seconds: float = 10.0, workers: int = 4, **kwargs) -> list[float | None]:
    """The share of each row's test cases that the completion's program passes (None: the row has no tests).

    Each program runs in fresh bubblewrap sandboxes (see `rl_assets/core/sandbox.py`), `workers` rows at a time.

    >>> code_execution(["```python\\ndef add(a, b):\\n    return a + b\\n```", "def add(a, b): return a - b", "x"],
    ...                tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 0"]] * 2 + [None])
    [1.0, 0.5, None]
    >>> code_execution(["print(int(input()) * 2)"], tests=[[{"input": "21\\n", "output": "42\\n"}]])
    [1.0]
    """
    tests = tests if tests is not None else [None] * len(completions)
    limits = Limits(cpu_seconds=cpu_seconds, memory_mb=memory_mb, wall_seconds=wall_seconds)
    if any(tests):
        require_sandbox()  # here, so a machine without one stops with the reason rather than inside a worker

    def score(row: int) -> float | None:
        return run_tests(extract_program(completions[row]), tests[row], limits) if tests[row] else None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(score, range(len(completions))))
