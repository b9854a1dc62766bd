"""Exact resume under every fault: a 2-round micro run stopped at each boundary, by each signal, then rerun.

    .venv/bin/python bench/fault_matrix.py [--signals kill-group,term-cli] [--faults after,hold,reward] [--limit N] [--staleness K]

Faults (tests/faults.py): `after:KEY` right after the CLI logs each output; `hold:N` at each reward call once
everything before it is reported (a stop between reports, inside rewards and held-out evaluations); `reward:N`
the reward call itself sends the signal (a crash mid-stage). Each case is a fresh copy of the micro project,
one interrupted run and one rerun; the rerun must end with the uninterrupted run's checkpoint ids. About 25 s
a case here (2 cores), ~50 cases in all. Prints one line a case and a summary; exit code 1 when any differs.
`tests/pipelines/test_fault_matrix.py` runs a few of these cases in `make test`. `--staleness 1` runs the same with
`rollouts.staleness: 1` and `compute.overlap: true`, where r02's sampling runs beside r01's training (two compute
children at once); there the reward calls of the two lanes interleave, so `after` is the fault that names a moment
unambiguously.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pytest  # noqa: E402
from conftest import make_micro_project, with_params  # noqa: E402
from faults import OUTPUTS, SIGNALS, checkpoint_ids, fault_project, interrupted, resumed, uninterrupted  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", default=",".join(SIGNALS))
    parser.add_argument("--faults", default="after,hold,reward")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many cases")
    parser.add_argument("--staleness", type=int, default=0, help="rollouts.staleness of every run (1: overlapped rounds)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    try:
        template = make_micro_project(work / "template")
        if args.staleness:
            def overlapped(params):
                params["rollouts"]["staleness"], params["compute"]["overlap"] = args.staleness, True

            with_params(template, overlapped)
        reference_ids, calls = uninterrupted(fault_project(template, work / "reference"))
        kinds = args.faults.split(",")
        faults = [f"after:{key}" for key in OUTPUTS if "after" in kinds]
        faults += [f"{kind}:{n}" for kind in ("hold", "reward") if kind in kinds for n in range(1, calls + 1)]
        cases = [(fault, how) for fault in faults for how in args.signals.split(",")][: args.limit]
        bad = []
        for index, (fault, how) in enumerate(cases):
            project = fault_project(template, work / f"case-{index}")
            started = time.perf_counter()
            try:
                code, _ = interrupted(project, fault, how)
                resumed(project)
                same = checkpoint_ids(project) == reference_ids
                verdict = "same checkpoints" if same else f"DIFFERENT: {checkpoint_ids(project)}"
            except (Exception, pytest.fail.Exception) as error:  # a run that ended before the fault, or a rerun that failed
                same, verdict, code = False, f"ERROR: {str(error)[-300:]}", None
            print(f"{fault:>22} {how:<10} exit {code!s:>4}  {verdict}  ({time.perf_counter() - started:.0f} s)", flush=True)
            if not same:
                bad.append((fault, how))
            shutil.rmtree(project, ignore_errors=True)
        print(f"{len(cases) - len(bad)} of {len(cases)} cases resumed to the uninterrupted run's checkpoints"
              + (f"; not: {bad}" if bad else ""))
        return 1 if bad else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
