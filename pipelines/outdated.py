"""Which assets a run must materialize: those missing, stale or unguarded, and everything downstream of them.

`rl-assets run` materializes only these (`--all` every asset), so a rerun with nothing changed
does nothing, and a run that died continues from the first asset it did not finish. "Stale" is
Dagster's own verdict (code version: the stage's code and params; data version: an upstream
output changed since), the same change `dvc status` sees through dvc.lock. Two more reasons come
from outside Dagster's view: an output deleted or changed on disk since it was recorded (a truncated
checkpoint, a table overwritten; rl_assets.verify), and an asset whose blocking guard never
passed on its latest materialization (the run stopped there, or died before the check ran). And
one from the run state: a round that must train continues its parent's carried optimizer moments
(train.carry_optimizer_state); when those are gone, the parent round trains again to recreate them.
"""

from __future__ import annotations

from pathlib import Path

from dagster import AssetKey, DagsterInstance
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._time import get_current_datetime

from rl_assets.paths import output_path


def changed_outputs(instance: DagsterInstance, rounds: int, root: Path = Path("."), models: Path = Path("models")) -> dict[str, str]:
    """{output: why} for every materialized output of the flow that is no longer what its latest materialization recorded
    (what `rl-assets status` reports; `run` makes them again)."""
    from rl_assets.paths import checkpoint_key, round_prefix

    names = ["raw_data", "prompts", checkpoint_key(0), *(f"{round_prefix(n)}/{stage}" for n in range(1, rounds + 1)
                                                         for stage in ("rollouts", "rewards", "checkpoint")), "evaluation"]
    events = instance.get_latest_materialization_events([AssetKey(name.split("/")) for name in names])
    return {key.to_user_string(): why for key, event in events.items()
            if event is not None and (why := _changed_on_disk(key, event, root, models))}


def _changed_on_disk(key: AssetKey, event, root: Path, promoted: Path) -> str | None:
    """Why the output on disk is not the one the latest materialization recorded (None when it is)."""
    from rl_assets.verify import changed

    name = key.to_user_string()
    if name == "promoted_model":  # a decision with a history (models/), not a reproducible output
        return None if (promoted / "promoted").is_dir() else "its output is missing on disk"
    recorded = event.asset_materialization.tags.get("dagster/data_version") if event.asset_materialization else None
    path = output_path(name, root)
    if recorded is None:
        return None if path.exists() else "its output is missing on disk"
    return changed(path, recorded, root)


def outdated_assets(instance: DagsterInstance, asset_graph, root: Path = Path("."), models: Path = Path("models"),
                    carry_optimizer_state: bool = False) -> dict[AssetKey, str]:
    """{asset key: why it must run}, in flow order, for every executable asset that is not up to date."""
    forced: dict[AssetKey, str] = {}
    while True:
        reasons = _outdated(instance, asset_graph, root, models, forced)
        lost = _parents_with_lost_moments(reasons, root) if carry_optimizer_state else {}
        if not lost:
            return reasons
        forced.update(lost)


def _parents_with_lost_moments(reasons: dict[AssetKey, str], root: Path) -> dict[AssetKey, str]:
    """Checkpoints not due to run whose carried moments are gone while the next round's checkpoint must train."""
    from rl_assets.paths import checkpoint_key
    from rl_assets.train_state import lost_moments

    lost = {}
    for key in reasons:
        parts = key.path
        if len(parts) == 2 and parts[1] == "checkpoint" and parts[0] != "r00":
            parent = AssetKey(checkpoint_key(int(parts[0][1:]) - 1).split("/"))
            if parent not in reasons and lost_moments(int(parts[0][1:]) - 1, root):
                lost[parent] = (f"its carried optimizer moments are gone from data/run_state and {key.to_user_string()} "
                                "continues them (train.carry_optimizer_state)")
    return lost


def _outdated(instance: DagsterInstance, asset_graph, root: Path, models: Path, forced: dict[AssetKey, str]) -> dict[AssetKey, str]:
    view = AssetGraphView(temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
                          instance=instance, asset_graph=asset_graph)
    resolver = CachingStaleStatusResolver(instance=instance, asset_graph=asset_graph, loading_context=view)
    checks_of: dict[AssetKey, list] = {}
    for check_key in asset_graph.asset_check_keys:
        if asset_graph.get_check_spec(check_key).blocking:
            checks_of.setdefault(check_key.asset_key, []).append(check_key)
    latest_checks = instance.event_log_storage.get_latest_asset_check_execution_by_key([k for ks in checks_of.values() for k in ks])

    reasons: dict[AssetKey, str] = {}
    for key in asset_graph.toposorted_asset_keys:
        node = asset_graph.get(key)
        if not node.is_materializable or not node.is_executable:
            continue
        upstream = [parent for parent in node.parent_keys if parent in reasons]
        event = instance.get_latest_materialization_event(key)
        if key in forced:
            reasons[key] = forced[key]
        elif event is None:
            reasons[key] = "never materialized"
        elif why := _changed_on_disk(key, event, root, models):
            reasons[key] = why
        elif upstream:
            reasons[key] = f"{upstream[0].to_user_string()} runs first"
        elif resolver.get_status(key) == StaleStatus.STALE:
            causes = resolver.get_stale_causes(key)
            reasons[key] = f"stale: {causes[0].reason}" if causes else "stale"
        else:
            for check_key in checks_of.get(key, []):
                record = latest_checks.get(check_key)
                if record is None or record.run_id != event.run_id or record.status != AssetCheckExecutionRecordStatus.SUCCEEDED:
                    reasons[key] = f"its blocking check {check_key.name} did not pass on its latest materialization"
                    break
    return reasons
