"""Commit several DVC stages with one read of dvc.yaml and one rewrite of dvc.lock; run by the DVC venv's Python.

    .venv-dvc/bin/python pipelines/records/dvc_commit.py r01-rollouts r01-rewards r01-checkpoint
    .venv-dvc/bin/python pipelines/records/dvc_commit.py --follow     stage names on stdin, one a line, then END

`dvc commit --force A B C` reads both files and rewrites dvc.lock once per stage, almost all of its CPU DVC's
YAML round trip. This does what that command does for each stage
(DVC's own `Stage.save` and `Stage.commit`, as in `dvc.repo.commit`) and writes dvc.lock once for all of them.

With --follow it commits each stage the moment its name arrives, while the step that wrote it still runs, and writes
dvc.lock once, after END; stdin closing without END (the step was killed) leaves dvc.lock as it was. With --follow --push
(a run that pushes to a remote as it goes: pipelines/storage/remote.py), a line `PUSH <request>` writes the stages committed so
far into dvc.lock, then pushes their objects, the project's state files and the state (pipelines/records/dvc_remote.py's push),
in this process: no second DVC start per push, and the stage names before it on stdin are committed by then. Outputs are
not relinked from the cache (`dvc commit --no-relink`): the step's child may be reading them, and with the default
copy cache a relink rewrote every file. Prints {stage: null, or the error that stopped its commit} as one JSON line.

Nothing goes into DVC's run cache (`stage.save(run_cache=False)`). `Stage.save` keys a run-cache entry by the params in
params.yaml, but a run with `--set` or another params file made these outputs with other values: such an entry told a
later `dvc repro` "Stage is cached - skipping run" and checked out outputs that other params made, recording params.yaml's
values beside them. Without it, `dvc repro` runs a stage whose recorded params differ, as it should.

It imports dvc, so it runs only in DVC's environment and imports nothing of this project (see pipelines/records/dvc.py).
"""

import json
import sys
from pathlib import Path

from dvc.repo import Repo


def commit(names, follow: bool = False, pushes: bool = False) -> dict[str, str | None] | None:
    """Commit each stage of `names` (a list, or with `follow` the lines arriving on stdin up to END), then write dvc.lock once.

    With `follow`, None when `names` ends without END: nothing is written.
    """
    errors: dict[str, str | None] = {}
    with Repo(".") as repo:
        stages = {stage.name: stage for stage in repo.index.stages}
        done, ended, committed, undumped = [], False, [], []
        for name in names:
            if name == "END":
                ended = True
                break
            if name.startswith("PUSH ") and pushes:
                if undumped:
                    with repo.lock:
                        undumped[0].dvcfile.dump_stages(undumped, update_pipeline=False)
                    undumped.clear()
                # stderr (a file), not stdout (a pipe read only at the end, which many pushes would fill)
                print(json.dumps({"pushed": _push(json.loads(name[5:]), repo, committed)}), file=sys.stderr, flush=True)
                continue
            stage = stages.get(name)
            if stage is None:
                errors[name] = f"dvc.yaml has no stage {name!r}"
                continue
            try:
                with repo.lock:  # per stage: a `dvc status` run meanwhile waits at most one stage
                    stage.save(run_cache=False)  # see above: the run cache would record params.yaml, not the run's params
                    stage.commit(relink=False)
            except Exception as error:  # noqa: BLE001 - DVC's errors (a missing output) are reported per stage
                errors[name] = f"failed to commit {name} - {error}"
                continue
            errors[name] = None
            done.append(stage)
            if pushes:
                undumped.append(stage)
                committed += [obj for out in stage.outs if out.use_cache for obj in _remote_helper().out_objects(out)]
        if follow and not ended:
            return None
        if done:
            with repo.lock:
                done[0].dvcfile.dump_stages(done, update_pipeline=False)
    return errors


def _remote_helper():
    """pipelines/records/dvc_remote.py, loaded by path: this script runs with -I, so its folder is not on sys.path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rl_assets_dvc_remote", Path(__file__).with_name("dvc_remote.py"))
    module = sys.modules.get(spec.name)
    if module is None:
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _push(request: dict, repo, committed: list) -> dict:
    request.pop("action", None)
    try:
        answer = _remote_helper().push(**request, repo=repo, objects=list(committed))
        if not answer.get("failed"):
            committed.clear()  # on the remote now; a failed push sends them again with the next one
        return answer
    except Exception as error:  # noqa: BLE001 - a push that fails is reported; the commits go on
        return {"error": f"{type(error).__name__}: {error}"}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--follow"]:
        errors = commit((line.strip() for line in sys.stdin if line.strip()), follow=True, pushes="--push" in sys.argv)
        if errors is None:
            sys.exit("stdin closed before END: dvc.lock not written")
        print(json.dumps(errors))
    else:
        print(json.dumps(commit(sys.argv[1:])))
