"""A remote for everything a run makes, so a lost machine loses nothing and a fresh one continues or serves.

What goes to the remote (`storage.remote`, or DVC's default remote), by pipelines/records/dvc_remote.py under DVC's Python:
- every DVC-tracked output in dvc.lock, as DVC's content-addressed objects (`dvc pull` reads them; nothing is sent twice);
- the files a run needs beside them: carried optimizer moments (data/run_state), training states saved mid-round
  (data/rNN/*_state, train.save_steps), promoted model versions and their history (models/), retired checkpoints' cards;
- the state: dvc.lock and, per output, what Dagster recorded when it was made (data version, code version, input data
  versions, the blocking guards that passed). A fresh machine's Dagster instance is empty; `pull` reports each output it
  restored as that materialization again (`report_runless_asset_event`, tag `rl_assets/pulled`), so `rl-assets run`
  finds what is up to date and continues from the first output that is not, with the same checkpoint ids.

A run pushes in the background (nice 19) after each output (`storage.push: output`), each round's checkpoint (`round`)
or only at its end (`run`), and always once more, waiting, at its end: the run's summary says what is not on the remote.
Only the default experiment's outputs (params.yaml, the graph dvc.yaml records) are DVC-tracked, so only they travel.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import threading
from pathlib import Path

from dagster import AssetKey

from rl_assets.core.config import Params
from rl_assets.core.graph import unroll
from rl_assets.core.run_params import StorageParams
from rl_assets.core.paths import DATA, asset_key_path, output_key
from rl_assets.core.storage import atomic_path

NAME = "storage"  # the DVC remote that `storage.remote` configures
FOLDER = Path(".rl_assets") / "remote"
LEDGER = FOLDER / "ledger.json"  # what Dagster recorded of each output, for the next push (written by the run's processes)
RECORD = FOLDER / "pushed.json"  # the last push's summary and the files this machine sent (pipelines/records/dvc_remote.py)
HELPER = Path(__file__).parents[1] / "records" / "dvc_remote.py"
PULLED_TAG = "rl_assets/pulled"


class RemoteError(RuntimeError):
    """The remote could not be reached, or DVC's environment is missing."""


def dvc_config(path: Path) -> dict[str, dict[str, str]]:
    """DVC's config file (configobj's INI) as {section: {key: value}}: enough to find the remotes.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "config"
    >>> _ = p.write_text("[core]\\n    remote = storage\\n['remote \\"storage\\"']\\n    url = s3://b/p\\n")
    >>> dvc_config(p)
    {'core': {'remote': 'storage'}, 'remote "storage"': {'url': 's3://b/p'}}
    """
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in path.read_text().splitlines() if path.is_file() else []:
        if found := re.fullmatch(r"\s*\[\s*'?(.*?)'?\s*\]\s*", line):
            current = sections.setdefault(found.group(1), {})
        elif current is not None and (found := re.fullmatch(r"\s*([\w.-]+)\s*=\s*(.*?)\s*", line)):
            current[found.group(1)] = found.group(2)
    return sections


def _configured() -> dict[str, dict[str, str]]:
    merged: dict[str, dict[str, str]] = {}
    for path in (Path(".dvc") / "config", Path(".dvc") / "config.local"):
        for section, values in dvc_config(path).items():
            merged.setdefault(section, {}).update(values)
    return merged


def remote_url(storage: StorageParams) -> str:
    """`storage.remote` as DVC writes it: a directory is made absolute (DVC reads a relative one from .dvc/)."""
    url = storage.remote
    return url if "://" in url else str(Path(url).expanduser().resolve())


def remote_name(storage: StorageParams) -> str | None:
    """The DVC remote the project pushes to: `storage` (configured here from params when they name one), DVC's default
    remote, or None (nothing is pushed)."""
    config = _configured()
    if storage.remote:
        wanted = {"url": remote_url(storage), **({"endpointurl": storage.endpoint_url} if storage.endpoint_url else {})}
        have = config.get(f'remote "{NAME}"', {})
        if any(have.get(k) != v for k, v in wanted.items()) or ("endpointurl" in have and not storage.endpoint_url):
            _helper({"action": "configure", "name": NAME, "url": wanted["url"], "endpoint_url": storage.endpoint_url})
        return NAME
    return config.get("core", {}).get("remote") or None


def _helper_python() -> str:
    from pipelines.records.dvc import dvc_executable, dvc_python

    python = dvc_python(dvc) if (dvc := dvc_executable()) else None
    if python is None:
        raise RemoteError("DVC's environment is missing (`make setup` installs it in .venv-dvc): nothing can be pushed or pulled")
    return python


def _helper(request: dict, background: bool = False) -> dict:
    """Run pipelines/records/dvc_remote.py with `request`; its answer, or (background) nothing, leaving it to run at nice 19."""
    from pipelines.records.dvc import LOW_PRIORITY

    # -I: not the script's folder on sys.path, where pipelines/records/dvc.py would shadow the dvc package
    command = [*LOW_PRIORITY, _helper_python(), "-I", str(HELPER)]
    if background:
        FOLDER.mkdir(parents=True, exist_ok=True)
        with open(FOLDER / "background.log", "a") as log:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log, text=True, start_new_session=True)
            process.stdin.write(json.dumps(request))
            process.stdin.close()
        return {}
    done = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise RemoteError(f"pipelines/records/dvc_remote.py failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}") from None
    if "error" in answer:
        raise RemoteError(answer["error"])
    return answer


# ---- what a push sends beside DVC's outputs ---------------------------------------------------------------------------

def project_files(data: Path = DATA, models: Path = Path("models")) -> dict:
    """The files outside DVC a fresh machine needs, as globs the push expands when its turn comes: run state, mid-round
    training states, promoted versions and history (models/promoted is restored from its version), and retired
    checkpoints' notes with their lineage cards."""
    from rl_assets.core.checkpoints import LINEAGE_FILE, RETIRED_FILE

    return {"patterns": [f"{data}/run_state/**/*", f"{data}/r[0-9][0-9]/*_state/**/*", f"{models}/versions/**/*", f"{models}/history.jsonl",
                         f"{data}/r[0-9][0-9]/*/{RETIRED_FILE}"],
            "beside": {RETIRED_FILE: [LINEAGE_FILE]}}


def ledger(instance, keys) -> dict[str, dict]:
    """{output key: what Dagster recorded of its latest materialization} for the outputs of `keys` whose blocking guards
    passed (one whose guards did not is made again wherever the run continues)."""
    from pipelines.records.outdated import missed_guards, passed_checks
    from rl_assets.eval.output_guards import guard_table

    events = instance.get_latest_materialization_events(list(keys))
    passed_in = functools.cache(functools.partial(passed_checks, instance))  # most outputs come from one run
    entries = {}
    for key, event in events.items():
        if event is None or event.asset_materialization is None or missed_guards(instance, key, event, passed_in):
            continue
        passed = passed_in(event.run_id)
        metadata = {name: value.value for name, value in event.asset_materialization.metadata.items()
                    if isinstance(value.value, (int, float, bool)) or (isinstance(value.value, str) and len(value.value) < 300)}
        entries[output_key(key.path)] = {"tags": dict(event.asset_materialization.tags or {}), "metadata": metadata,
                                         "checks": sorted(name for name in guard_table(output_key(key.path)) if (key, name) in passed),
                                         "run_id": event.run_id}
    return entries


def write_ledger(instance, params: Params) -> None:
    """The ledger of the default experiment's graph (dvc.yaml's): every output of `params`'s stage graph."""
    keys = [AssetKey(asset_key_path(output.key, "default")) for output in unroll(params)]
    with atomic_path(LEDGER) as tmp:
        tmp.write_text(json.dumps(ledger(instance, keys), sort_keys=True))


def _request(name: str, params: Params, wait: bool) -> dict:
    return {"action": "push", "remote": name, "ledger": str(LEDGER), "files": project_files(models=Path(params.promotion.directory)),
            "record": str(RECORD), "wait": wait}


def push(instance, params: Params, wait: bool = True, follower=None) -> dict | None:
    """Send what the remote lacks: waiting (the run's end, `rl-assets push`) or in the background (by the compute step's
    DVC `follower` when it runs, which pushes what it committed; else a helper at nice 19); None without a remote.

    The state goes up only after every object and file it names went up.
    """
    if params.experiment != "default":
        return None
    name = remote_name(params.storage)
    if name is None:
        return None
    write_ledger(instance, params)
    if not wait and follower is not None and follower.push(_request(name, params, wait=True)):
        return {}
    return _helper(_request(name, params, wait), background=not wait)


def push_files(params: Params, follower=None) -> None:
    """A push in the background that brings the state files up to date (a training state saved mid-round)."""
    if params.experiment == "default" and (name := remote_name(params.storage)) is not None:
        if follower is None or not follower.push(_request(name, params, wait=True)):
            _helper(_request(name, params, wait=False), background=True)


def pushes_during_run(params: Params) -> bool:
    """Whether a run's steps push as they go (storage.push output or round, a remote, DVC recording the run)."""
    from pipelines.records.dvc import recording_enabled

    try:
        return (params.experiment == "default" and params.storage.push in ("output", "round") and recording_enabled()
                and remote_name(params.storage) is not None)
    except RemoteError:
        return False


class SnapshotWatcher:
    """While a compute step runs: when a training state saved mid-round (train.save_steps) or carried moments appear,
    push them in the background, so a machine lost mid-round resumes elsewhere from its last state."""

    def __init__(self, params: Params, follower=None, interval: float = 0.5) -> None:
        self.params, self.follower, self.interval = params, follower, interval
        self._stop = threading.Event()
        self._seen = self._signature()
        self._thread = threading.Thread(target=self._watch, name="rl-assets-snapshots", daemon=True)
        self._thread.start()

    def _signature(self) -> list[str]:
        return sorted(str(p) for p in (*DATA.glob("r[0-9][0-9]/*_state/step-*/trainer_state.json"), *DATA.glob("run_state/optimizer/*.pt")))

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            now = self._signature()
            if set(now) - set(self._seen):
                try:
                    push_files(self.params, self.follower)
                except RemoteError:
                    return
            self._seen = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def last_push() -> dict | None:
    """The last push's summary (`rl-assets status`): remote, url, when, objects and files sent, what failed or is not there."""
    try:
        return json.loads(RECORD.read_text()).get("last") if RECORD.is_file() else None
    except ValueError:
        return None


def summary(pushed: dict | None) -> str:
    """One line for the run's end: where it went, what is not there."""
    if pushed is None:
        return "storage: no remote (storage.remote in params, or `dvc remote add -d`): outputs are on this machine only"
    missing = pushed["failed"] + pushed["not_pushed"]
    line = (f"storage: pushed to {pushed['url']} in {pushed['seconds']:.1f} s ({pushed['objects']} new objects, "
            f"{pushed['files']} state files)")
    return line + (f"; NOT on the remote: {'; '.join(missing)}" if missing else "; every output and run state is on the remote")


# ---- pull ---------------------------------------------------------------------------------------------------------------

def pull(instance, params: Params, say=print) -> dict:
    """Make this project what the remote holds: dvc.lock, the outputs, run state and promoted models, and Dagster's record
    of each output (so `rl-assets run` continues where the pushing machine stopped)."""
    from pipelines.records.dvc import dvc_executable, dvc_message, load_yaml, prune_lock

    name = remote_name(params.storage)
    if name is None:
        raise RemoteError("no remote: set storage.remote in params, or add one with `dvc remote add -d NAME URL`")
    answer = _helper({"action": "get-state", "remote": name})
    state, url = answer["state"], answer["url"]
    if state is None:
        raise RemoteError(f"{url} holds no rl-assets state: push from the machine that ran (`rl-assets push`) first")
    lock = Path("dvc.lock")
    if not lock.is_file() or lock.read_text() != state["dvc_lock"]:
        with atomic_path(lock) as tmp:
            tmp.write_text(state["dvc_lock"])
        say(f"dvc.lock: the remote's (pushed {state['pushed_at']})")
    graph = set((load_yaml(Path("dvc.yaml")) or {}).get("stages", {})) if Path("dvc.yaml").is_file() else set()
    if dropped := prune_lock(graph):  # pushed before a `dvc-sync` to fewer rounds: this project's dvc.yaml has no such stage
        say(f"dvc.lock: left out {len(dropped)} stages this project's dvc.yaml does not have ({', '.join(dropped)})")
    files = _helper({"action": "get-files", "remote": name})["files"]
    from rl_assets.core.checkpoints import RETIRED_FILE

    retired = {note.parent.as_posix() for note in DATA.glob(f"r[0-9][0-9]/*/{RETIRED_FILE}")}
    stages = [stage for stage, entry in _lock_outputs(lock.read_text()).items() if not set(entry) & retired]
    done = subprocess.run([dvc_executable(), "pull", "--force", "-r", name, *stages], capture_output=True, text=True)
    if done.returncode != 0:
        say(f"warning: dvc pull: {dvc_message(done)}")
    from rl_assets.eval.promotion import restore_promoted

    models = Path(params.promotion.directory)
    restored = restore_promoted(models)
    imported = import_ledger(instance, state["ledger"], url, models)
    say(f"pulled from {url}: {len(stages)} DVC stages, {files} state files"
        + (f", promoted model {restored[:12]}" if restored else "") + f"; Dagster now records {len(imported)} outputs as made")
    return {"url": url, "stages": stages, "files": files, "imported": imported, "dvc_pull_ok": done.returncode == 0}


def _lock_outputs(text: str) -> dict[str, list[str]]:
    import yaml

    stages = (yaml.safe_load(text) or {}).get("stages", {})
    return {stage: [out["path"] for out in entry.get("outs", [])] for stage, entry in stages.items()}


def import_ledger(instance, entries: dict[str, dict], url: str, models: Path) -> list[str]:
    """Report each output of `entries` that is on disk as recorded, and not already Dagster's latest, as made again; the
    outputs reported. One not on disk (not pushed, a failed pull) stays unmade here: `rl-assets run` makes it."""
    from dagster import AssetCheckEvaluation, AssetKey, AssetMaterialization

    from pipelines.records.outdated import DATA_VERSION, changed_from
    from rl_assets.core.paths import asset_key_path

    imported = []
    for name, entry in entries.items():
        key = AssetKey(asset_key_path(name, "default"))
        recorded = entry["tags"].get(DATA_VERSION)
        if changed_from(name, recorded, DATA, models) is not None:
            continue
        latest = instance.get_latest_materialization_events([key]).get(key)
        if latest is not None and latest.asset_materialization.tags.get(DATA_VERSION) == recorded:
            continue
        instance.report_runless_asset_event(AssetMaterialization(
            asset_key=key, tags={**entry["tags"], PULLED_TAG: "true"},
            metadata={**entry["metadata"], "pulled from": url, "made in run": entry["run_id"]}))
        for check in entry["checks"]:
            instance.report_runless_asset_event(AssetCheckEvaluation(asset_key=key, check_name=check, passed=True,
                                                                     metadata={"pulled from": url}))
        imported.append(name)
    return imported

