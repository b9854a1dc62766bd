"""Commit several DVC stages with one read of dvc.yaml and one rewrite of dvc.lock; run by the DVC venv's Python.

    .venv-dvc/bin/python pipelines/dvc_commit.py r01-rollouts r01-rewards r01-checkpoint

`dvc commit --force A B C` reads both files and rewrites dvc.lock once per stage: ~1 s of CPU each for this
project's 22 stages, almost all of it DVC's YAML round trip. This does what that command does for each stage
(DVC's own `Stage.save` and `Stage.commit`, as in `dvc.repo.commit`) and writes dvc.lock once for all of them:
5 stages took 1.3 s in one run (22: ~3 s, estimated from its parts). Prints {stage: null, or the error that stopped its commit} as one JSON line.

It imports dvc, so it runs only in DVC's environment and imports nothing of this project (see pipelines/dvc.py).
"""

import json
import sys

from dvc.repo import Repo


def commit(names: list[str]) -> dict[str, str | None]:
    errors: dict[str, str | None] = {}
    with Repo(".") as repo, repo.lock:
        stages = {stage.name: stage for stage in repo.index.stages}
        done = []
        for name in names:
            stage = stages.get(name)
            if stage is None:
                errors[name] = f"dvc.yaml has no stage {name!r}"
                continue
            try:
                stage.save()
                stage.commit(relink=True)
            except Exception as error:  # noqa: BLE001 - DVC's errors (a missing output) are reported per stage
                errors[name] = f"failed to commit {name} - {error}"
                continue
            errors[name] = None
            done.append(stage)
        if done:
            done[0].dvcfile.dump_stages(done, update_pipeline=False)
    return errors


if __name__ == "__main__":
    print(json.dumps(commit(sys.argv[1:])))
