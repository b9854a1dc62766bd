"""Commit several DVC stages with one read of dvc.yaml and one rewrite of dvc.lock; run by the DVC venv's Python.

    .venv-dvc/bin/python pipelines/dvc_commit.py r01-rollouts r01-rewards r01-checkpoint
    .venv-dvc/bin/python pipelines/dvc_commit.py --follow     stage names on stdin, one a line, then END

`dvc commit --force A B C` reads both files and rewrites dvc.lock once per stage: ~1 s of CPU each for this
project's 22 stages, almost all of it DVC's YAML round trip. This does what that command does for each stage
(DVC's own `Stage.save` and `Stage.commit`, as in `dvc.repo.commit`) and writes dvc.lock once for all of them:
20 stages took 1.6 s (0.4 s reading the project, 0.85 s the commits, 0.35 s writing dvc.lock).

With --follow it commits each stage the moment its name arrives, while the step that wrote it still runs, and writes
dvc.lock once, after END; stdin closing without END (the step was killed) leaves dvc.lock as it was. With --follow
--dump-each (a run that pushes each output to a remote: pipelines/remote.py) it also writes each stage into dvc.lock as
it is committed and prints {"committed": stage} then, so the push that follows finds it there. Outputs are
not relinked from the cache (`dvc commit --no-relink`): the step's child may be reading them, and with the default
copy cache a relink rewrote every file. Prints {stage: null, or the error that stopped its commit} as one JSON line.

Nothing goes into DVC's run cache (`stage.save(run_cache=False)`). `Stage.save` keys a run-cache entry by the params in
params.yaml, but a run with `--set` or another params file made these outputs with other values: such an entry told a
later `dvc repro` "Stage is cached - skipping run" and checked out outputs that other params made, recording params.yaml's
values beside them. Without it, `dvc repro` runs a stage whose recorded params differ, as it should.

It imports dvc, so it runs only in DVC's environment and imports nothing of this project (see pipelines/dvc.py).
"""

import json
import sys

from dvc.repo import Repo


def commit(names, follow: bool = False, dump_each: bool = False) -> dict[str, str | None] | None:
    """Commit each stage of `names` (a list, or with `follow` the lines arriving on stdin up to END), then write dvc.lock once.

    With `follow`, None when `names` ends without END: nothing is written.
    """
    errors: dict[str, str | None] = {}
    with Repo(".") as repo:
        stages = {stage.name: stage for stage in repo.index.stages}
        done, ended = [], False
        for name in names:
            if name == "END":
                ended = True
                break
            stage = stages.get(name)
            if stage is None:
                errors[name] = f"dvc.yaml has no stage {name!r}"
                if dump_each:
                    print(json.dumps({"committed": name, "error": errors[name]}), flush=True)
                continue
            try:
                with repo.lock:  # per stage: a `dvc status` run meanwhile waits at most one stage
                    stage.save(run_cache=False)  # see above: the run cache would record params.yaml, not the run's params
                    stage.commit(relink=False)
            except Exception as error:  # noqa: BLE001 - DVC's errors (a missing output) are reported per stage
                errors[name] = f"failed to commit {name} - {error}"
                if dump_each:
                    print(json.dumps({"committed": name, "error": errors[name]}), flush=True)
                continue
            errors[name] = None
            done.append(stage)
            if dump_each:
                with repo.lock:
                    stage.dvcfile.dump_stages([stage], update_pipeline=False)
                print(json.dumps({"committed": name}), flush=True)
        if follow and not ended:
            return None
        if done:
            with repo.lock:
                done[0].dvcfile.dump_stages(done, update_pipeline=False)
    return errors


if __name__ == "__main__":
    if sys.argv[1:2] == ["--follow"]:
        errors = commit((line.strip() for line in sys.stdin if line.strip()), follow=True, dump_each="--dump-each" in sys.argv)
        if errors is None:
            sys.exit("stdin closed before END: dvc.lock not written")
        print(json.dumps(errors))
    else:
        print(json.dumps(commit(sys.argv[1:])))
