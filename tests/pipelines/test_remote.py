"""Object storage (issue 30): push to a real S3 API on loopback and to a directory, pull on a fresh project, continue, retire.

The S3 server is moto's (`ThreadedMotoServer`, the S3 wire protocol over HTTP on 127.0.0.1); DVC reaches it through its
own S3 remote (dvc-s3, boto), as it would reach AWS or MinIO.
"""

from __future__ import annotations

import fcntl
import json
import signal
import subprocess

import pytest
import yaml

from conftest import DVC, PYTHON, REPO, copy_project, project_env, python
from faults import fault_project, interrupted, kill_group_when, resumed
from rl_assets.core.checkpoints import checkpoint_id, read_lineage, read_retired

pytestmark = pytest.mark.e2e  # make test installs .venv-dvc (make setup): no skip that would hide a broken set-up

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3():
    """An S3 endpoint on 127.0.0.1 with one bucket; its URL."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    boto3 = pytest.importorskip("boto3")
    server = pytest.importorskip("moto.server").ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url, **{k.lower(): v for k, v in CREDENTIALS.items() if k != "AWS_DEFAULT_REGION"},
                 region_name="us-east-1").create_bucket(Bucket="rl-assets")
    yield url
    server.stop()


def with_storage(project, **storage):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["storage"] = storage
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)
    return project


def set_rounds(project, rounds: int):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["rounds"] = rounds
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    python(["-m", "pipelines", "dvc-sync"], project, timeout=180)


def rl(project, *args, timeout=900, check=True):
    return python(["-m", "pipelines", *args], project, timeout=timeout, check=check, **CREDENTIALS)


def run_with_a_new_evaluation(project):
    """`rl-assets run` after an evaluation param changed: the evaluation runs again and reads every checkpoint."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["evaluation"]["samples_per_prompt"] = 3
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return rl(project, "run")


def compact(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["train"]["checkpoint_dtype"] = "bfloat16"
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return project


@pytest.fixture(scope="module")
def four_rounds(micro_template, tmp_path_factory):
    """The micro project after one 4-round run with no remote: the retention and fewer-rounds tests start from copies."""
    project = copy_project(micro_template, tmp_path_factory.mktemp("remote") / "four-rounds")
    set_rounds(project, 4)
    rl(project, "run")
    return project


def four_rounds_copy(four_rounds, tmp_path, remote=None):
    """A copy of the 4-round project; with `remote`, a directory, pushed there (`rl-assets push`) as a run would have."""
    project = copy_project(four_rounds, tmp_path / "p")
    if remote is not None:
        with_storage(project, remote=str(remote))
        pushed = rl(project, "push")
        assert "every output and run state is on the remote" in pushed.stderr, pushed.stderr[-3000:]
    return project


def retired_keys(done) -> list[str]:
    return [line.split()[-1] for line in done.stderr.splitlines() if line.startswith("retire ")]


def test_a_fresh_machine_pulls_from_s3_and_continues_to_the_same_checkpoints(micro_template, tmp_path, s3):
    """Machine A runs one round and pushes to S3; machine B (a copy of the project with no outputs, no Dagster instance)
    pulls: nothing to do, the promoted model is there; then both run a second round, and B's is A's, bit for bit.

    Checkpoints are saved compact (train.checkpoint_dtype: bfloat16): the float32 weights round 2 continues from are run
    state, pushed and pulled with it (the default float32 checkpoints are pulled and continued in the lost-machine test)."""
    storage = {"remote": "s3://rl-assets/continue", "endpoint_url": s3}
    first, fresh = (with_storage(compact(copy_project(micro_template, tmp_path / name)), **storage) for name in ("a", "b"))
    done = rl(first, "run")
    assert "storage: pushed to s3://rl-assets/continue" in done.stderr and "every output and run state is on the remote" in done.stderr

    pulled = rl(fresh, "pull")
    assert "dvc.lock: the remote's" in pulled.stderr, pulled.stderr
    assert (fresh / "dvc.lock").read_text() == (first / "dvc.lock").read_text()
    for key in ("r00/checkpoint", "r01/checkpoint"):
        assert checkpoint_id(fresh / "data" / key) == checkpoint_id(first / "data" / key)
    r01 = checkpoint_id(fresh / "data/r01/checkpoint")
    assert read_lineage(fresh / "data/r01/checkpoint")["checkpoint_dtype"] == "bfloat16"
    assert (fresh / "data/run_state/weights" / f"{r01}.safetensors").is_file(), "the float32 weights came with the pull"
    assert json.loads((fresh / "models/promoted/model_card.json").read_text())["checkpoint_id"] == \
        json.loads((first / "models/promoted/model_card.json").read_text())["checkpoint_id"]
    assert list((fresh / "data/run_state/optimizer").glob("*.pt")), "the carried moments came with the pull"
    again = rl(fresh, "run")
    assert "nothing to do" in again.stderr, again.stderr[-3000:]
    assert python(["-m", "pipelines", "lineage", "models/promoted"], fresh, timeout=300).returncode == 0
    sampled = [python(["-m", "pipelines", "generate", "--checkpoint", "promoted", "7*8=", "sum of 4 and 5?"], project, timeout=300).stdout
               for project in (first, fresh)]
    assert sampled[0] == sampled[1] and sampled[0].strip(), "the pulled promoted model answers as the pushing machine's does"

    for project in (first, fresh):
        set_rounds(project, 2)
    continued = rl(fresh, "run")
    assert "running" in continued.stderr and "r00/checkpoint:" not in continued.stderr
    assert "materialized r02/checkpoint" in continued.stderr and "materialized r01/checkpoint" not in continued.stderr, continued.stderr[-3000:]
    rl(first, "run")
    assert checkpoint_id(fresh / "data/r02/checkpoint") == checkpoint_id(first / "data/r02/checkpoint")


def test_a_pull_without_a_push_names_the_remote(micro_template, tmp_path):
    project = with_storage(copy_project(micro_template, tmp_path / "p"), remote=str(tmp_path / "empty-remote"))
    (tmp_path / "empty-remote").mkdir()
    done = rl(project, "pull", check=False)
    assert done.returncode == 1 and "holds no rl-assets state" in done.stderr and "empty-remote" in done.stderr


def test_retire_keeps_the_last_promoted_and_best_and_a_run_restores_what_it_needs(four_rounds, tmp_path):
    """Four rounds pushed to a directory remote; keep 1: r00, r04 and the promoted/best stay, the others' files leave the disk and
    DVC's cache; lineage says retired; a run has nothing to do; an evaluation that must run again pulls them back."""
    remote = tmp_path / "remote"
    project = four_rounds_copy(four_rounds, tmp_path, remote)
    before = sorted(p.name for p in (project / ".dvc/cache/files/md5").rglob("*") if p.is_file())

    dry = rl(project, "retire", "--keep", "1", "--dry-run")
    retiring = [line.split()[-1] for line in dry.stderr.splitlines() if line.startswith("would retire")]
    assert retiring and "r00/checkpoint" not in retiring and "r04/checkpoint" not in retiring, dry.stderr
    assert not list((project / "data").glob("r*/checkpoint/RETIRED.json")), "a dry run changes nothing"
    ids = {key: checkpoint_id(project / "data" / key) for key in retiring}

    done = rl(project, "retire", "--keep", "1")
    after = sorted(p.name for p in (project / ".dvc/cache/files/md5").rglob("*") if p.is_file())
    assert len(after) < len(before)
    for key in retiring:
        note = read_retired(project / "data" / key)
        assert note["checkpoint_id"] == ids[key] and note["remote"] == str(remote)
        assert sorted(p.name for p in (project / "data" / key).iterdir()) == ["RETIRED.json", "lineage.json"]
    trace = python(["-m", "pipelines", "lineage", "data/r04/checkpoint"], project, timeout=300)
    assert "retired" in trace.stdout and "missing" not in trace.stdout, trace.stdout
    assert "nothing to do" in rl(project, "run").stderr

    again = run_with_a_new_evaluation(project)
    assert f"restored {retiring[0]}" in again.stderr, again.stderr[-3000:]
    assert all(read_retired(project / "data" / key) is None and checkpoint_id(project / "data" / key) == ids[key] for key in retiring)
    assert done.returncode == 0


def test_a_retired_checkpoint_on_no_remote_is_made_again_with_the_same_id(four_rounds, tmp_path):
    """Four rounds, keep 1: of r01-r03 the promoted and the best stay, so at least one is retired."""
    project = four_rounds_copy(four_rounds, tmp_path)
    ids = {f"r0{n}/checkpoint": checkpoint_id(project / f"data/r0{n}/checkpoint") for n in range(1, 4)}
    key = retired_keys(rl(project, "retire", "--keep", "1"))[0]
    assert read_retired(project / "data" / key)["remote"] is None
    again = run_with_a_new_evaluation(project)
    assert any(key in line and "retired and on no remote" in line for line in again.stderr.splitlines()), again.stderr[-3000:]
    assert checkpoint_id(project / "data" / key) == ids[key]


def test_no_remote_is_said_once_and_changes_nothing(micro_template, tmp_path):
    project = copy_project(micro_template, tmp_path / "p")
    done = rl(project, "push", check=False)
    assert done.returncode == 1 and "no remote" in done.stderr
    assert not (project / ".dvc/config.local").exists()



def wait_for_background_pushes(project):
    """A push the step started in the background holds this lock until it is done (pipelines/records/dvc_remote.py)."""
    lock = project / ".rl_assets/remote/pushed.json.lock"
    if lock.exists():
        with open(lock) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)


def test_a_machine_lost_mid_run_continues_on_a_fresh_one_from_what_it_pushed(micro_template, fault_reference, tmp_path):
    """Each output is pushed as it is recorded (storage.push: output). The run is SIGKILLed in round 2 (its process group,
    as a lost machine); a fresh project pulls and finishes it without making round 1 again, to the uninterrupted run's ids
    (a remote changes no output: the reference ran without one)."""
    ids, calls = fault_reference["ids"], fault_reference["calls"]
    lost = fault_project(micro_template, tmp_path / "lost")
    set_rounds(with_storage(lost, remote=str(tmp_path / "remote")), 2)
    code, log = interrupted(lost, f"hold:{calls}", "kill-group")  # the last reward call: r02's held-out evaluation
    assert code != 0 and "materialized r01/checkpoint" in log
    wait_for_background_pushes(lost)

    fresh = fault_project(micro_template, tmp_path / "fresh")
    set_rounds(with_storage(fresh, remote=str(tmp_path / "remote")), 2)
    pulled = rl(fresh, "pull")
    assert "r01/checkpoint" in json.loads((tmp_path / "remote/rl-assets/state.json").read_text())["ledger"], pulled.stderr
    done = resumed(fresh)
    assert "materialized r01/checkpoint" not in done.stderr and "materialized r02/checkpoint" in done.stderr, done.stderr[-3000:]
    assert {key: checkpoint_id(fresh / "data" / key) for key in ids} == ids


def test_fewer_rounds_after_a_push_and_a_fresh_machine_still_pulls(micro_template, four_rounds, tmp_path):
    """Machine A ran four rounds and pushed; the project then goes down to one round (`dvc-sync`). A fresh clone's dvc.yaml
    has no r02-r04 stages: its pull leaves the remote lock's entries for them out instead of failing on them, and A's own
    dvc.lock drops them at `dvc-sync`, so what it pushes next names only stages dvc.yaml has."""
    remote = tmp_path / "remote"
    first = four_rounds_copy(four_rounds, tmp_path, remote)
    later = [f"r{n:02d}-{stage}" for n in (2, 3, 4) for stage in ("rollouts", "rewards", "checkpoint")]
    fresh = with_storage(copy_project(micro_template, tmp_path / "b"), remote=str(remote))  # its dvc.yaml: one round
    pulled = rl(fresh, "pull")
    assert f"dvc.lock: left out 9 stages this project's dvc.yaml does not have ({', '.join(later)})" in pulled.stderr, pulled.stderr
    assert "does not exist" not in pulled.stderr and "warning: dvc pull" not in pulled.stderr
    assert not set(later) & set(yaml.safe_load((fresh / "dvc.lock").read_text())["stages"])
    continued = rl(fresh, "run").stderr  # the rounds it has are made; only what reads `rounds` is stale
    assert "running 2 of 8 assets, from evaluation (stale: params changed (rounds: 4 -> 1))" in continued, continued[-3000:]

    params = yaml.safe_load((first / "params.yaml").read_text())
    (first / "params.yaml").write_text(yaml.safe_dump({**params, "rounds": 1}, sort_keys=False))
    synced = python(["-m", "pipelines", "dvc-sync"], first, timeout=180)
    assert f"dvc.lock: dropped 9 stages dvc.yaml no longer has ({', '.join(later)})" in synced.stdout
    lock = yaml.safe_load((first / "dvc.lock").read_text())["stages"]
    assert not set(later) & set(lock) and "r01-checkpoint" in lock
    status = subprocess.run([str(DVC), "status", "--json"], cwd=first, capture_output=True, text=True, env=project_env(first))
    assert json.loads(status.stdout or "{}") == {"evaluation": [{"changed deps": {"params.yaml": {"rounds": "modified"}}}]}


def test_a_training_state_saved_mid_round_is_pushed_and_a_fresh_machine_resumes_from_it(micro_template, tmp_path):
    """train.save_steps states go to the remote while the round trains; a fresh machine resumes from the last one pushed."""
    settings = {"minibatch_size": 2, "epochs": 200, "save_steps": 200, "keep_last": 2}  # 3,200 steps: ~10 s to push in
    projects = {}
    for name in ("whole", "lost", "fresh"):
        project = with_storage(copy_project(micro_template, tmp_path / name), remote=str(tmp_path / f"remote-{'whole' if name == 'whole' else 'lost'}"))
        params = yaml.safe_load((project / "params.yaml").read_text())
        params["train"].update(settings)
        (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        projects[name] = project
    python(["-m", "pipelines", "run"], projects["whole"], timeout=900, OMP_NUM_THREADS="1")  # one thread in all three: the same sums
    listing = tmp_path / "remote-lost/rl-assets/files.json"
    process = subprocess.Popen([PYTHON, "-m", "pipelines", "run"], cwd=projects["lost"], env=project_env(projects["lost"], OMP_NUM_THREADS="1"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def state_pushed() -> bool:
        # A push writes the listing, then state.json (what `pull` reads): a kill between the two, which a busy machine
        # makes likely, would leave a remote that holds the training state but no state to pull.
        try:  # the listing is renamed into place whole (see the last test); absent until the first push
            listed = any("train_state/step-" in f and f.endswith("trainer_state.json") for f in json.loads(listing.read_text()))
        except FileNotFoundError:
            return False
        return listed and (listing.parent / "state.json").is_file()

    kill_group_when(process, state_pushed)
    assert process.wait(timeout=60) == -signal.SIGKILL, f"the run ended before a training state was pushed: {process.stderr.read()[-3000:]}"
    wait_for_background_pushes(projects["lost"])

    rl(projects["fresh"], "pull")
    assert list((projects["fresh"] / "data/r01/train_state").glob("step-*/trainer_state.json"))
    python(["-m", "pipelines", "run"], projects["fresh"], timeout=900, OMP_NUM_THREADS="1")
    card = read_lineage(projects["fresh"] / "data/r01/checkpoint")
    assert card["metrics"]["resumed_from_step"] > 0
    assert card["checkpoint_id"] == read_lineage(projects["whole"] / "data/r01/checkpoint")["checkpoint_id"]


def test_retiring_from_the_remote_deletes_its_objects_there_and_a_run_makes_it_again(four_rounds, tmp_path):
    remote = tmp_path / "remote"
    project = four_rounds_copy(four_rounds, tmp_path, remote)  # of r01-r03 the promoted and the best stay: at least one is retired
    ids = {f"r0{n}/checkpoint": checkpoint_id(project / f"data/r0{n}/checkpoint") for n in range(1, 4)}
    done = rl(project, "retire", "--keep", "1", "--from-remote")
    key = retired_keys(done)[0]
    note = read_retired(project / "data" / key)
    assert note["remote"] is None and "objects from the remote" in done.stderr
    assert not (remote / "files/md5" / note["dvc_hash"][:2] / note["dvc_hash"][2:]).exists()
    assert (remote / "files/md5").is_dir() and any((remote / "files/md5").rglob("*")), "what is kept stays on the remote"
    again = run_with_a_new_evaluation(project)
    assert any(key in line and "retired and on no remote" in line for line in again.stderr.splitlines()), again.stderr[-3000:]
    assert checkpoint_id(project / "data" / key) == ids[key]


PUT_OVER = """
import json, sys
from pathlib import Path
from dvc_objects.fs.local import LocalFileSystem
sys.path.append("pipelines/records")  # after DVC itself: pipelines/records/dvc.py is not `dvc`
from dvc_remote import _put

remote, local = Path(sys.argv[1]), Path(sys.argv[2])
seen = []
for source, data in ((None, b'["new listing"]'), (str(local), None)):
    remote.write_text('["old"]')
    with remote.open() as before:  # a reader, or a push killed mid-write, still has the old file whole
        _put(LocalFileSystem(), source, str(remote), data)
        seen.append([before.read(), remote.read_text()])
print(json.dumps(seen))
"""


def test_a_directory_remote_file_is_replaced_whole_never_rewritten_in_place(tmp_path):
    """A push writes the listing, the state and each file to a temporary name and renames it over the old one: a push killed
    mid-write leaves the old file whole (a listing written in place was once read half written by a pull: JSONDecodeError)."""
    local = tmp_path / "trainer_state.json"
    local.write_text('{"global_step": 200}')
    done = subprocess.run([str(DVC.parent / "python"), "-I", "-c", PUT_OVER, str(tmp_path / "files.json"), str(local)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [['["old"]', '["new listing"]'], ['["old"]', '{"global_step": 200}']]
