"""DVC records the Dagster graph: `dvc.yaml` is generated from the asset graph, one stage per asset.

Each stage's command materializes that asset through Dagster, so `dvc repro`, the UI and a schedule
run the same code. When an asset is materialized outside `dvc repro` (UI, `make run`), the asset
itself runs `dvc commit` for its stage so that `dvc status` stays clean (the compute step for each output
as it is reported, and writes dvc.lock once for all of them at its end: `JournalFollower`). DVC lives in its own tool environment (its hydra dependency pins an antlr
runtime that breaks Dagster's selection parser), so it is always called as a command, never imported:
`dvc` itself, or pipelines/records/dvc_commit.py under DVC's Python.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import yaml
from dagster import AssetKey

from rl_assets.core.config import ParamsError
from rl_assets.core.paths import DATA, EVALUATION_METRICS, EVALUATION_PLOT, dvc_stage_name, output_key, output_path
from rl_assets.core.storage import atomic_path
from rl_assets.eval.curves import ROUND_PLOTS

PYTHON = ".venv/bin/python"


def dvc_executable() -> str | None:
    """$RL_ASSETS_DVC, the project's `.venv-dvc/bin/dvc`, or `dvc` on PATH."""
    candidates = [os.environ.get("RL_ASSETS_DVC"), ".venv-dvc/bin/dvc", shutil.which("dvc")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


# `dvc commit` costs CPU per stage. Beside a training process at equal priority it takes a core from torch's OpenMP
# threads, which then wait for each other at every barrier; at nice 19 it runs in the CPU training leaves idle.
LOW_PRIORITY = ["nice", "-n", "19"] if shutil.which("nice") else []
SYNC = "run `rl-assets dvc-sync` (or `make dvc-sync`) to regenerate it from the graph"
STAGE_FIELDS = ("cmd", "deps", "params", "outs", "metrics", "plots")


def record_in_dvc(context, key: str, params_file: str = "params.yaml", overrides: list[str] | tuple[str, ...] = (),
                  later: bool = False, experiment: str = "default", spec: str = "") -> str | None:
    """Commit the stage of `key` to dvc.lock after a materialization DVC did not drive, with the params it ran with.

    Only when dvc.yaml's stage is the one the asset graph generates now: committing a stale stage
    (rounds or sources changed since `dvc-sync`) would record deps this run did not use, so the
    warning names the difference and the command that fixes it. A failed commit is reported with
    DVC's own message.

    `dvc commit` records the values in params.yaml, the file DVC reads. When the run used another
    params file, `--set` overrides or ${VAR} values, the stage's params in dvc.lock are then replaced
    by the values the run used (see `effective_dvc_params`: from the run's `spec` when it has one, so a
    stage journaled now and recorded later still gets them), so `dvc status` reports the difference
    from params.yaml instead of calling the outputs up to date.

    With `later`, the stage goes into the journal of stages still to record (`JOURNAL`), and
    `record_journal` commits all of them at once: the compute step does so at its end. A kill before
    that leaves the journal, which the next `rl-assets run` records before it starts. Returns the
    stage journaled, else None. Another experiment than the default is never recorded: its outputs are in
    data/experiments/<experiment>/, not those of dvc.yaml (the graph of params.yaml).
    """
    if not recording_enabled():
        return None  # dvc repro is running this stage and records it itself
    if experiment != "default":
        return None
    if not _is_dvc_stage(context, key):
        return  # promoted_model: a decision with a history, not a reproducible output
    if not Path("dvc.yaml").is_file():
        return
    stage = dvc_stage_name(key)
    written = (load_yaml(Path("dvc.yaml")) or {}).get("stages", {})
    if stage not in written:
        context.log.warning(f"dvc.yaml is out of date (rounds or sources changed since it was written): it has no stage {stage!r}, "
                            f"so dvc.lock was not updated; {SYNC}")
        return
    expected = asset_stage(context, key)
    if expected is not None and written[stage] != expected:
        context.log.warning(f"dvc.yaml is out of date (rounds or sources changed since it was written): its stage {stage!r} differs "
                            f"from the asset graph ({stage_difference(written[stage], expected)}), so dvc.lock was not updated; {SYNC}")
        return
    dvc = dvc_executable()
    if dvc is None:
        context.log.warning("dvc not found (make setup installs it in .venv-dvc); dvc.lock not updated")
        return
    entry = {"stage": stage, "params": [k for k in written[stage].get("params", []) if isinstance(k, str)],
             "params_file": params_file, "overrides": list(overrides), "spec": spec}
    with _dvc_lock_held():
        if later:
            _write_journal([*_read_journal(), entry])
            return stage
        commit_stages(context.log, [entry], dvc)
    return None


# Stages whose outputs a step wrote and reported, not yet in dvc.lock (`record_in_dvc(..., later=True)`).
JOURNAL = Path(".dvc") / "tmp" / "rl-assets-unrecorded.json"
HELPER = Path(__file__).with_name("dvc_commit.py")


def record_journal(log, follower: JournalFollower | None = None) -> list[str]:
    """Commit every stage in the journal at once, then clear it; the stages recorded.

    A `dvc commit` per stage ran beside the training child, which it slowed; the
    compute step now records its outputs at its end, all in one commit (pipelines/records/dvc_commit.py). With `follower`,
    the stages it committed while the step ran are only written to dvc.lock.
    """
    try:
        if not recording_enabled() or not JOURNAL.is_file() or (dvc := dvc_executable()) is None:
            return []
        with _dvc_lock_held():
            entries = _read_journal()
            recorded = commit_stages(log, entries, dvc, follower) if entries else []
            JOURNAL.unlink(missing_ok=True)
        return recorded
    finally:
        if follower is not None:
            follower.stop()


def recording_enabled() -> bool:
    """False under `dvc repro` (DVC records its stages itself) and with RL_ASSETS_DVC_COMMIT=0."""
    return not os.environ.get("DVC_STAGE") and os.environ.get("RL_ASSETS_DVC_COMMIT", "1") != "0"


class JournalFollower:
    """DVC's Python at nice 19, committing each stage the compute step journals while the step still runs.

    Committing every stage at the step's end held the step after its child was done; this helper (dvc_commit.py --follow) does them as they come, in the CPU the child leaves idle, and
    at the end only writes dvc.lock. Stages already in the journal (raw_data and prompts of this run, an earlier
    run's) go first. A step killed before `record_journal` leaves dvc.lock as it was and the journal for the next run.
    """

    def __init__(self, pushes: bool = False) -> None:
        self.process: subprocess.Popen | None = None
        self.sent: list[str] = []
        self.pushes = pushes  # `push` lines: the helper writes dvc.lock and pushes what it committed (pipelines/storage/remote.py)
        self._stderr = None
        self._writing = threading.Lock()  # `push` also comes from pipelines.storage.remote.SnapshotWatcher's thread

    def send(self, stage: str) -> None:
        if self.process is None and not self._start():
            return
        for name in ([entry["stage"] for entry in _read_journal()] if not self.sent else []) + [stage]:
            if name in self.sent:
                continue
            if not self._write(name):
                return
            self.sent.append(name)

    def _write(self, line: str) -> bool:
        try:
            with self._writing:
                self.process.stdin.write(line + "\n")
                self.process.stdin.flush()
        except (OSError, ValueError):  # the helper died (`finish` reports why), or stdin was closed by `finish`
            return False
        return True

    def push(self, request: dict) -> bool:
        """With `pushes`: write dvc.lock and push what the helper committed so far, and the state (pipelines/records/dvc_remote.py).

        Stdin is one stream, so every stage sent before is committed by then: nothing to wait for here."""
        return self.pushes and self.process is not None and self._write("PUSH " + json.dumps(request))

    def _start(self) -> bool:
        python = dvc_python(dvc) if recording_enabled() and Path("dvc.yaml").is_file() and (dvc := dvc_executable()) else None
        if python is None:
            return False
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen([*LOW_PRIORITY, python, "-I", str(HELPER), "--follow", *(["--push"] if self.pushes else [])],
                                        stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        return True

    @property
    def running(self) -> bool:
        return self.process is not None

    def finish(self, stages: list[str]) -> dict:
        """Send what it has not had of `stages`, then END; {stage: None, or why its commit failed} once dvc.lock is written."""
        for stage in stages:
            if stage not in self.sent:
                self.send(stage)
        try:
            out, _ = self.process.communicate("END\n")
        except OSError:  # the helper died before END: its exit status and error output say why
            out = ""
            self.process.wait()
        self._stderr.seek(0)
        done = subprocess.CompletedProcess(self.process.args, self.process.returncode, out, self._stderr.read())
        return _helper_errors(done, stages)

    def stop(self) -> None:
        """End the helper if `finish` did not: stdin closed without END, so it writes nothing."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        if self._stderr is not None:
            self._stderr.close()


def _helper_errors(done: subprocess.CompletedProcess, stages: list[str]) -> dict:
    """dvc_commit.py's {stage: error} line, or every stage with the reason it gave none."""
    try:
        errors = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (IndexError, ValueError):
        errors = None
    if not isinstance(errors, dict):
        return dict.fromkeys(stages, dvc_message(done))
    return {stage: errors.get(stage, "not committed (the helper did not report it)") for stage in stages}


def _read_journal() -> list[dict]:
    try:
        return json.loads(JOURNAL.read_text()) if JOURNAL.is_file() else []
    except ValueError:  # a write cut short cannot happen (atomic), but a hand-edited file can
        return []


def _write_journal(entries: list[dict]) -> None:
    latest = {entry["stage"]: entry for entry in entries}  # one entry per stage: the latest run's params
    with atomic_path(JOURNAL) as tmp:
        tmp.write_text(json.dumps(list(latest.values())))


def commit_stages(log, entries: list[dict], dvc: str, follower: JournalFollower | None = None) -> list[str]:
    """`dvc commit --force` each entry's stage (several in one commit where DVC's Python can run the helper, or by
    `follower` when it runs); the stages recorded. A stage whose commit failed is named with DVC's message; one that
    ran with other params than params.yaml gets them in dvc.lock (`record_run_params`). Call with `_dvc_lock_held`."""
    stages = [entry["stage"] for entry in entries]
    python = dvc_python(dvc)
    if follower is not None and follower.running:
        errors = follower.finish(stages)
    elif python is not None:  # also for one stage: `dvc commit` would fill DVC's run cache (see dvc_commit.py)
        # -I: not the script's folder on sys.path, where pipelines/records/dvc.py would shadow the dvc package
        done = subprocess.run([*LOW_PRIORITY, python, "-I", str(HELPER), *stages], capture_output=True, text=True)
        errors = _helper_errors(done, stages)
    else:
        errors = {}
        for stage in stages:
            # Not --quiet: DVC's quiet mode drops its error message as well, which left the warning empty.
            done = subprocess.run([*LOW_PRIORITY, dvc, "commit", "--force", stage], capture_output=True, text=True)
            errors[stage] = dvc_message(done) if done.returncode else None
    recorded, run_values = [], {}
    for entry in entries:
        stage = entry["stage"]
        if errors.get(stage):
            log.warning(f"dvc commit {stage} failed: {errors[stage]}")
            continue
        recorded.append(stage)
        try:
            values = effective_dvc_params(entry["params"], entry["params_file"], entry["overrides"], entry.get("spec", "")) \
                if entry["params"] else {}
        except (OSError, ParamsError) as error:  # a killed run's params file, since moved or broken: keep what DVC recorded
            log.warning(f"dvc.lock: stage {stage} keeps params.yaml's values; the params its run used cannot be read ({error})")
            continue
        if values:
            run_values[stage] = values
    for stage in record_run_params(run_values):
        entry = next(entry for entry in entries if entry["stage"] == stage)
        overrides = entry["overrides"]
        log.info(f"dvc.lock: stage {stage} records the params this run used ({entry['params_file']}"
                 f"{' with --set ' + ' '.join(overrides) if overrides else ''}), which differ from params.yaml")
    return recorded


def dvc_python(dvc: str) -> str | None:
    """The Python interpreter that runs the `dvc` executable (from its #! line), or None when it is not one."""
    try:
        first = Path(dvc).read_bytes()[:512].split(b"\n", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        return None
    words = first[2:].split() if first.startswith("#!") else []
    return words[0] if words and Path(words[0]).name.startswith("python") and Path(words[0]).is_file() else None


@contextlib.contextmanager
def _dvc_lock_held():
    """One `dvc commit` + dvc.lock rewrite at a time across the run's step processes."""
    lock_dir = Path(".dvc") / "tmp"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "rl-assets-commit.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def effective_dvc_params(keys: list[str], params_file: str, overrides: list[str] | tuple[str, ...] = (), spec: str = "") -> dict:
    """The values of a stage's params keys (`train`, `model.name_or_path`) as the run used them, typed as validated.

    The file as written, ${VAR} interpolated and `--set` applied (as the run's `spec` holds them, else read again); each
    value keeps the file's shape (only the keys written in it, as DVC records them), with leaves replaced by the
    validated values so `1e-4` is a float as DVC reads it.
    """
    from rl_assets.core.params_file import parse_params, read_params_file, resolved_raw
    from rl_assets.core.run_spec import read_run_spec

    if spec and Path(spec).is_file():
        run = read_run_spec(spec)
        raw, validated = run.written, run.params.model_dump(mode="json")
    else:  # a run without a spec (launched from the UI), or one whose spec is gone: the file as it is now
        written = read_params_file(params_file)
        raw = resolved_raw(copy.deepcopy(written), params_file, overrides)
        validated = parse_params(written, params_file, overrides).model_dump(mode="json")
    values = {}
    for key in keys:
        found, typed = dotted(raw, key), dotted(validated, key)
        if found is not MISSING:
            values[key] = _typed_like(found, typed)
    return values


MISSING = object()


def dotted(mapping, key: str):
    for part in key.split("."):
        if not isinstance(mapping, dict) or part not in mapping:
            return MISSING
        mapping = mapping[part]
    return mapping


def _typed_like(raw, validated):
    """`raw`'s structure with each leaf taken from `validated` where it has one (YAML 1.1 reads 1e-4 as text; DVC as a float)."""
    if isinstance(raw, dict):
        return {k: _typed_like(v, validated.get(k, MISSING) if isinstance(validated, dict) else MISSING) for k, v in raw.items()}
    if isinstance(raw, list):
        others = validated if isinstance(validated, list) and len(validated) == len(raw) else [MISSING] * len(raw)
        return [_typed_like(v, o) for v, o in zip(raw, others)]
    return raw if validated is MISSING or isinstance(validated, (dict, list)) else validated


def record_run_params(values_by_stage: dict[str, dict]) -> list[str]:
    """Replace each stage's params.yaml values in dvc.lock by the values given where they differ; the stages replaced.

    dvc.lock's format (schema 2.0, `stages.<stage>.params.<file>.<key>`) is DVC's documented lock file. It is read and
    written once for all the stages, not once per stage.
    """
    lock_path = Path("dvc.lock")
    if not values_by_stage or not lock_path.is_file():
        return []
    lock = load_yaml(lock_path) or {}
    replaced = []
    for stage, values in values_by_stage.items():
        entry = lock.get("stages", {}).get(stage)
        if entry is None or (entry.get("params") or {}).get("params.yaml", {}) == values:
            continue
        entry["params"] = {**(entry.get("params") or {}), "params.yaml": values}
        replaced.append(stage)
    if replaced:
        write_lock(lock, lock_path)
    return replaced


def prune_lock(stages: set[str] | list[str], lock_path: Path = Path("dvc.lock")) -> list[str]:
    """Drop dvc.lock's entries of stages that dvc.yaml no longer has (fewer rounds after `dvc-sync`); the stages dropped.

    DVC keeps them, and then `dvc pull` or `dvc checkout` of a stage list taken from the lock fails on a name dvc.yaml
    lacks ("does not exist as an output or a stage name"), on this machine or on a fresh one that pulls the lock.
    """
    if not lock_path.is_file():
        return []
    with _dvc_lock_held():
        lock = load_yaml(lock_path) or {}
        gone = [stage for stage in lock.get("stages", {}) if stage not in stages]
        for stage in gone:
            del lock["stages"][stage]
        if gone:
            write_lock(lock, lock_path)
    return gone


def write_lock(lock: dict, lock_path: Path) -> None:
    """dvc.lock written whole (a temporary sibling renamed over it), through libyaml when PyYAML has it."""
    with atomic_path(lock_path) as tmp:
        tmp.write_text(yaml.dump(lock, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, width=120))


def load_yaml(path: Path):
    """`yaml.safe_load` of a file, through libyaml when PyYAML has it (much faster on dvc.lock)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def dvc_message(done: subprocess.CompletedProcess) -> str:
    """What a failed DVC command said: its ERROR lines, else everything it printed, else its exit status."""
    text = "\n".join(part.strip() for part in (done.stderr, done.stdout) if part and part.strip())
    errors = [line.removeprefix("ERROR:").strip() for line in text.splitlines() if line.startswith("ERROR:")]
    return "; ".join(errors) or text or f"exit status {done.returncode} and no output"


def _is_dvc_stage(context, key: str) -> bool:
    """Whether the running asset's spec declares DVC deps (`rl_assets/params`); True when there is no spec to ask."""
    try:
        spec = context.assets_def.specs_by_key[AssetKey.from_user_string(key)]
    except Exception:  # a context without an assets definition (an asset body called directly)
        return True
    return "rl_assets/params" in spec.metadata


def asset_stage(context, key: str) -> dict | None:
    """The stage `dvc-sync` would write for `key` now, from the running asset's own spec (None outside a run)."""
    try:
        spec = context.assets_def.specs_by_key[AssetKey.from_user_string(key)]
    except Exception:  # a context without an assets definition (an asset body called directly)
        return None
    return spec_stage(spec)


def spec_stage(spec) -> dict | None:
    """The stage `dvc-sync` writes for an asset spec of the default experiment (None: not a DVC stage)."""
    metadata = {name: getattr(value, "value", value) for name, value in spec.metadata.items()}
    return graph_stage(output_key(spec.key.path), metadata, [dep.asset_key.to_user_string() for dep in spec.deps])


def stage_difference(written: dict, expected: dict) -> str:
    """What differs between dvc.yaml's stage and the generated one, field by field.

    >>> stage_difference({"deps": ["a", "data/r03/checkpoint"], "outs": ["o"]}, {"deps": ["a"], "outs": ["o"]})
    'deps: data/r03/checkpoint not in the graph'
    """
    def entries(value) -> list[str]:
        items = value if isinstance(value, list) else [] if value is None else [value]
        return [item if isinstance(item, str) else json.dumps(item, sort_keys=True) for item in items]

    fields = [f for f in STAGE_FIELDS if f in written or f in expected] + sorted((set(written) | set(expected)) - set(STAGE_FIELDS))
    parts = []
    for field in fields:
        have, want = entries(written.get(field)), entries(expected.get(field))
        if have != want:
            missing, extra = [w for w in want if w not in have], [h for h in have if h not in want]
            words = ([f"{', '.join(missing)} missing"] if missing else []) + ([f"{', '.join(extra)} not in the graph"] if extra else [])
            parts.append(f"{field}: {'; '.join(words) or 'order differs'}")
    return "; ".join(parts)


def graph_stage(key: str, metadata: dict, parents: list[str]) -> dict | None:
    """The stage of one asset from its `rl_assets/*` metadata and upstream keys (None: not a DVC stage)."""
    if "rl_assets/params" not in metadata:
        return None  # not a reproducible output (promoted_model)
    return stage_spec(key, upstream=sorted(parents), params_sections=list(metadata["rl_assets/params"]),
                      code=list(metadata["rl_assets/code"]), extra_deps=list(metadata.get("rl_assets/inputs", [])),
                      extra_outs=list(metadata.get("rl_assets/outputs", [])))


def stage_spec(key: str, upstream: list[str], params_sections: list[str], code: list[str], extra_deps: list[str],
               extra_outs: list[str] = ()) -> dict:
    """One DVC stage: materialize `key` through Dagster; deps are upstream outputs, code and inputs; outs its output and `extra_outs`."""
    outs = [output_path(key, DATA).as_posix(), *extra_outs]  # dvc.yaml is the graph of params.yaml, the default experiment
    stage = {
        "cmd": f"{PYTHON} -m pipelines materialize {key}",
        "deps": sorted(set(code + extra_deps)) + [output_path(u, DATA).as_posix() for u in upstream],
        "params": params_sections,
        "outs": outs,
    }
    if key == "evaluation":  # cached like every output: data/ is not in git, so only DVC's cache and remote carry them
        stage["metrics"] = [(DATA / EVALUATION_METRICS).as_posix()]
        stage["plots"] = [(DATA / EVALUATION_PLOT).as_posix(), {(DATA / ROUND_PLOTS).as_posix(): {"x": "round", "y": "value"}}]
    return stage


def dvc_yaml_text(asset_graph) -> str:
    """The full dvc.yaml for an asset graph whose nodes carry `rl_assets/params` and `rl_assets/code`."""
    stages = {}
    for asset_key in asset_graph.toposorted_asset_keys:
        node = asset_graph.get(asset_key)
        key = output_key(asset_key.path)
        metadata = {name: getattr(value, "value", value) for name, value in node.metadata.items()}
        stage = graph_stage(key, metadata, [output_key(parent.path) for parent in node.parent_keys])
        if stage is not None:
            stages[dvc_stage_name(key)] = stage
    header = "# Generated from the Dagster asset graph by `rl-assets dvc-sync`; do not edit by hand.\n"
    return header + yaml.safe_dump({"stages": stages}, sort_keys=False, width=120)
