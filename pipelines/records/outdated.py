"""Which assets a run must materialize: those missing, stale or unguarded, and everything downstream of them.

`rl-assets run` materializes only these (`--all` every asset), so a rerun with nothing changed
does nothing, and a run that died continues from the first asset it did not finish. "Stale" is
Dagster's own verdict (code version: the stage's code and params; data version: an upstream
output changed since), the same change `dvc status` sees through dvc.lock. Two more reasons come
from outside Dagster's view: an output deleted or changed on disk since it was recorded (a truncated
checkpoint, a table overwritten; rl_assets.core.verify), and an asset whose blocking guard never
passed on its latest materialization (the run stopped there, or died before the check ran). And
one from the run state: a round that must sample or train continues from its parent's carried optimizer moments
(train.carry_optimizer_state) or, for a compact checkpoint, its float32 weights (train.checkpoint_dtype); when those are
gone, the parent round trains again to recreate them.

Staleness is read from what Dagster records on each materialization (the tags `dagster/code_version`,
`dagster/data_version` and `dagster/input_data_version/<key>`, shown on every materialization in the UI)
against the specs of the code location now, with public APIs only: the same verdict as Dagster's "stale"
badge for this graph (every asset has a code version and a data version), without its private resolver.
"""

from __future__ import annotations

import functools
import json
from graphlib import TopologicalSorter
from pathlib import Path

from dagster import AssetKey, AssetSpec, DagsterEventType, DagsterInstance

from rl_assets.core.paths import output_key, output_path

CODE_VERSION, DATA_VERSION, INPUT_DATA_VERSION = "dagster/code_version", "dagster/data_version", "dagster/input_data_version"


def changed_outputs(instance: DagsterInstance, rounds: int, experiment: str = "default", data: Path = Path("data"),
                    models: Path = Path("models")) -> dict[str, str]:
    """{output: why} for every materialized output of the flow in the data folder `data` (paths.data_dir) that is no longer
    what its latest materialization recorded (what `rl-assets status` reports; `run` makes them again)."""
    from rl_assets.core.paths import ROUND_OUTPUTS, asset_key_path, checkpoint_key, round_prefix

    names = ["raw_data", "prompts", checkpoint_key(0), *(f"{round_prefix(n)}/{stage}" for n in range(1, rounds + 1)
                                                         for stage in ROUND_OUTPUTS), "evaluation"]
    events = instance.get_latest_materialization_events([AssetKey(asset_key_path(name, experiment)) for name in names])
    return {output_key(key.path): why for key, event in events.items()
            if event is not None and (why := _changed_on_disk(key, event, data, models))}


def _changed_on_disk(key: AssetKey, event, data: Path, promoted: Path) -> str | None:
    """Why the output on disk is not the one the latest materialization recorded (None when it is)."""
    recorded = event.asset_materialization.tags.get(DATA_VERSION) if event.asset_materialization else None
    return changed_from(output_key(key.path), recorded, data, promoted)


def changed_from(name: str, recorded: str | None, data: Path, promoted: Path) -> str | None:
    """Why output `name` on disk is not the one with data version `recorded` (None when it is). A retired checkpoint
    (pipelines/storage/retention.py) counts as the one recorded: a run that needs its files restores them first."""
    from rl_assets.core.checkpoints import read_retired
    from rl_assets.core.verify import changed

    if name == "promoted_model":  # a decision with a history (models/), not a reproducible output
        return None if (promoted / "promoted").is_dir() else "its output is missing on disk"
    path = output_path(name, data)
    if recorded is None:
        return None if path.exists() else "its output is missing on disk"
    if (note := read_retired(path)) is not None and note.get("checkpoint_id") == recorded:
        return None
    return changed(path, recorded)


def missed_guards(instance: DagsterInstance, key: AssetKey, event, passed_in=None) -> list[str]:
    """The blocking guards of `key` that did not pass in the run of its materialization `event` (`passed_in`: a cached
    `passed_checks`)."""
    from rl_assets.eval.output_guards import guard_table

    passed = (passed_in or functools.partial(passed_checks, instance))(event.run_id)
    return [name for name, (blocks, _) in guard_table(output_key(key.path)).items() if blocks and (key, name) not in passed]


def passed_checks(instance: DagsterInstance, run_id: str) -> set[tuple[AssetKey, str]]:
    """(asset key, check name) of every check that passed in run `run_id`."""
    return {(e.dagster_event.event_specific_data.asset_key, e.dagster_event.event_specific_data.check_name)
            for e in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
            if e.dagster_event.event_specific_data.passed}


def outdated_assets(instance: DagsterInstance, specs: list[AssetSpec], data: Path = Path("data"), models: Path = Path("models"),
                    run_state: bool = False, params=None) -> dict[AssetKey, str]:
    """{asset key: why it must run}, in flow order, for every asset of `specs` (`Definitions.resolve_all_asset_specs`)
    whose output in the data folder `data` (paths.data_dir) is not up to date. With the `params` the specs were made
    from, a changed code version names the params keys and code files that changed (`what_changed`)."""
    forced: dict[AssetKey, str] = {}
    while True:
        reasons = _outdated(instance, specs, data, models, forced, params)
        lost = _parents_with_lost_run_state(reasons, data) if run_state else {}
        if not lost:
            return reasons
        forced.update(lost)


def _parents_with_lost_run_state(reasons: dict[AssetKey, str], data: Path) -> dict[AssetKey, str]:
    """Checkpoints not due to run whose run state is gone (carried moments, a compact checkpoint's float32 weights) while the
    next round, which continues from it, must sample or train."""
    from rl_assets.core.paths import checkpoint_key
    from rl_assets.train.train_state import lost_run_state

    lost = {}
    for key in reasons:
        parts = output_key(key.path).split("/")
        if len(parts) == 2 and parts[1] in ("checkpoint", "rollouts") and parts[0] != "r00":
            parent_round = int(parts[0][1:]) - 1
            parent = AssetKey([*key.path[:-2], *checkpoint_key(parent_round).split("/")])  # the same experiment's
            why = None if parent in reasons else lost_run_state(parent_round, data, moments=parts[1] == "checkpoint")
            if why:
                lost[parent] = f"{why} and {output_key(key.path)} continues from it"
    return lost


def stale_reason(spec: AssetSpec, tags: dict[str, str], current: dict[AssetKey, str | None], changed=None) -> str | None:
    """Why the materialization with `tags` is stale for `spec` now (None when it is not): its code version changed, or an
    input's data version is not the one it was made from. `current`: each asset's latest data version (None: never made).
    `changed()`: what changed when the code version did, in words (`what_changed`); None leaves the two hashes.

    >>> spec = AssetSpec("b", deps=["a"], code_version="v2")
    >>> made = {"dagster/code_version": "v2", "dagster/input_data_version/a": "x"}
    >>> stale_reason(spec, made, {AssetKey("a"): "x"}), stale_reason(spec, made, {AssetKey("a"): "y"})
    (None, 'stale: a has a new data version since')
    >>> stale_reason(spec, {**made, "dagster/code_version": "v1"}, {AssetKey("a"): "x"})
    'stale: its code version changed (v1 -> v2)'
    """
    if spec.code_version is not None and tags.get(CODE_VERSION) != spec.code_version:
        if changed is not None and (what := changed()):
            return f"stale: {what}"
        return f"stale: its code version changed ({tags.get(CODE_VERSION)} -> {spec.code_version})"
    for dep in spec.deps:
        used, now = tags.get(f"{INPUT_DATA_VERSION}/{dep.asset_key.to_user_string()}"), current.get(dep.asset_key)
        if now is not None and used != now:
            return f"stale: {output_key(dep.asset_key.path)} {'has a new data version since' if used else 'is a new input'}"
    return None


def what_changed(name: str, params, data: Path) -> str | None:
    """The params keys and code files of output `name` whose values differ from those its output on disk recorded when it was
    made (`stage_table.stage_lineage`: the same two things the code version hashes), in words; None when the output recorded
    none (raw_data, prompts) or nothing differs.

    Read after `_changed_on_disk`: the output on disk is the one the latest materialization made.
    """
    from rl_assets.core.paths import stage_of
    from rl_assets.core.stage_table import stage_lineage

    try:
        stage = stage_of(name)[0]
        recorded = _recorded_lineage(output_path(name, data))
    except (ValueError, OSError):  # not a compute stage's output, or an unreadable record: the hashes say what is known
        return None
    if not isinstance(recorded.get("params"), dict) or not isinstance(recorded.get("code"), dict):
        return None
    now = stage_lineage(stage, params)
    keys = _differences(recorded["params"], now["params"])
    before, after = recorded["code"].get(stage, {}), now["code"][stage]
    files = [path for path in sorted(set(before) | set(after)) if before.get(path) != after.get(path)]
    parts = ([f"params changed ({_listed(keys)})"] if keys else []) + ([f"code changed ({_listed(files)})"] if files else [])
    return " and ".join(parts) or None


def _recorded_lineage(path: Path) -> dict:
    """What the output at `path` recorded about how it was made: a model folder's lineage card, a table's file metadata."""
    from rl_assets.core.schemas import table_lineage

    if path.is_dir():
        from rl_assets.core.checkpoints import read_lineage

        return read_lineage(path)
    return table_lineage(path) if path.is_file() else {}


_ABSENT = object()


def _differences(before, after, path: str = "") -> list[str]:
    """`key: old -> new` for every leaf where two params mappings differ.

    >>> _differences({"train": {"learning_rate": 1e-05, "epochs": 2}, "seed": 0}, {"train": {"learning_rate": 0.0001, "epochs": 2}, "seed": 0})
    ['train.learning_rate: 1e-05 -> 0.0001']
    >>> _differences({"rewards": {"functions": [{"name": "a", "weight": 1.0}]}}, {"rewards": {"functions": [{"name": "a", "weight": 2.0}]}})
    ['rewards.functions[0].weight: 1.0 -> 2.0']
    """
    if isinstance(before, dict) and isinstance(after, dict):
        return [change for key in sorted(set(before) | set(after))
                for change in _differences(before.get(key, _ABSENT), after.get(key, _ABSENT), f"{path}.{key}" if path else key)]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):  # rewards.functions[0].weight
        return [change for i, (old, new) in enumerate(zip(before, after)) for change in _differences(old, new, f"{path}[{i}]")]
    if before == after:
        return []
    shown = lambda value: "unset" if value is _ABSENT else _short(json.dumps(value))  # noqa: E731
    return [f"{path}: {shown(before)} -> {shown(after)}"]


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _listed(items: list[str], shown: int = 3) -> str:
    return "; ".join(items[:shown]) + (f"; and {len(items) - shown} more" if len(items) > shown else "")


def _outdated(instance: DagsterInstance, specs: list[AssetSpec], data: Path, models: Path, forced: dict[AssetKey, str],
              params=None) -> dict[AssetKey, str]:
    by_key = {spec.key: spec for spec in specs}
    order = TopologicalSorter({spec.key: [d.asset_key for d in spec.deps if d.asset_key in by_key] for spec in specs}).static_order()
    events = instance.get_latest_materialization_events(list(by_key))
    current = {key: event.asset_materialization.tags.get(DATA_VERSION) if event and event.asset_materialization else None
               for key, event in events.items()}
    passed_in = functools.cache(functools.partial(passed_checks, instance))
    reasons: dict[AssetKey, str] = {}
    for key in order:
        spec, event = by_key[key], events.get(key)
        upstream = [dep.asset_key for dep in spec.deps if dep.asset_key in reasons]
        if key in forced:
            reasons[key] = forced[key]
        elif event is None:
            reasons[key] = "never materialized"
        elif why := _changed_on_disk(key, event, data, models):
            reasons[key] = why
        elif upstream:
            reasons[key] = f"{output_key(upstream[0].path)} runs first"
        elif why := stale_reason(spec, dict(event.asset_materialization.tags or {}), current,
                                 functools.partial(what_changed, output_key(key.path), params, data) if params is not None else None):
            reasons[key] = why
        elif output_key(key.path) == "raw_data" and (why := raw_sources_changed(data)):
            reasons[key] = why
        elif missed := missed_guards(instance, key, event, passed_in):
            reasons[key] = f"its blocking check {missed[0]} did not pass on its latest materialization"
    return reasons


def raw_sources_changed(data: Path) -> str | None:
    """Why raw_data is stale: a raw source it read no longer has the hash its rows recorded (an edited JSONL, a generator's
    module). None when every source matches; a missing or unreadable table is `_changed_on_disk`'s to report."""
    from rl_assets.core.paths import output_path
    from rl_assets.core.schemas import read_table
    from rl_assets.eval.guards import sources_match_files

    try:
        table = read_table(output_path("raw_data", data), "raw_data")
    except (FileNotFoundError, ValueError):
        return None
    passed, description, _ = sources_match_files(table, Path("."))
    return None if passed else f"stale: raw sources {description}"
