"""Outputs DVC recorded that Dagster never saw made (a plain `dvc pull`, `dvc checkout`): reported as made when DVC says so.

`rl-assets pull` brings Dagster's own record of each output with it. A plain `dvc pull` brings only the files and
dvc.lock, and Dagster would call every output "never materialized" and make it again. Such an output counts as made
when all of this holds, and is then reported to Dagster as a runless materialization tagged `rl_assets/adopted`:

- its stage in dvc.yaml is the one the asset graph generates now (the same deps, params sections and outs);
- `dvc status` finds the stage up to date: its code, params and inputs are the ones dvc.lock records, and the file on
  disk has the hash recorded for it;
- each of its inputs is made (recorded by Dagster, or adopted just before it, in flow order);
- its blocking guards pass on the file as it is (a corrupt or incomplete output is never "up to date").

The tags are those a run would have written: the code version of the asset now (DVC vouches that its code and params
did not change), its content hash as data version, and its inputs' data versions.
"""

from __future__ import annotations

import json
import subprocess
from graphlib import TopologicalSorter
from pathlib import Path

from dagster import AssetCheckEvaluation, AssetKey, AssetMaterialization, AssetSpec, DagsterInstance

from pipelines.records.dvc import dvc_executable, dvc_message, load_yaml, spec_stage
from pipelines.records.outdated import CODE_VERSION, DATA_VERSION, INPUT_DATA_VERSION
from rl_assets.core.paths import dvc_stage_name, output_key, output_path

ADOPTED_TAG = "rl_assets/adopted"


def adopt_dvc_outputs(instance: DagsterInstance, specs: list[AssetSpec], params, data: Path, say=print) -> list[str]:
    """Report each output of the default experiment that DVC records as up to date, and Dagster never saw made, as made;
    the output keys reported. Costs one `dvc status` when there is such an output, nothing otherwise."""
    from rl_assets.core.verify import current_hash
    from rl_assets.eval.output_guards import evaluate_guards

    if params.experiment != "default" or not Path("dvc.lock").is_file() or not Path("dvc.yaml").is_file():
        return []
    by_key = {spec.key: spec for spec in specs}
    events = instance.get_latest_materialization_events(list(by_key))
    current = {key: e.asset_materialization.tags.get(DATA_VERSION) for key, e in events.items() if e and e.asset_materialization}
    locked = (load_yaml(Path("dvc.lock")) or {}).get("stages", {})
    written = (load_yaml(Path("dvc.yaml")) or {}).get("stages", {})
    candidates = {key: stage for key in by_key if key not in current and (stage := _stage(by_key[key], written, locked, data))}
    if not candidates or (dvc := dvc_executable()) is None:
        return []
    done = subprocess.run([dvc, "status", "--json", *candidates.values()], capture_output=True, text=True)
    if done.returncode != 0:
        say(f"warning: dvc status: {dvc_message(done)}; outputs DVC recorded are made again")
        return []
    changed = set(json.loads(done.stdout or "{}"))
    adopted = []
    order = TopologicalSorter({key: [d.asset_key for d in spec.deps if d.asset_key in by_key] for key, spec in by_key.items()}).static_order()
    for key in order:
        spec = by_key[key]
        inputs = [d.asset_key for d in spec.deps]
        if key not in candidates or candidates[key] in changed or any(current.get(i) is None for i in inputs):
            continue
        name = output_key(key.path)
        results = evaluate_guards(name, params)
        if any(r.blocking and not r.passed for r in results):
            continue
        version = current_hash(output_path(name, data))
        tags = {CODE_VERSION: spec.code_version, DATA_VERSION: version, ADOPTED_TAG: "true",
                **{f"{INPUT_DATA_VERSION}/{i.to_user_string()}": current[i] for i in inputs}}
        instance.report_runless_asset_event(AssetMaterialization(
            asset_key=key, tags=tags, metadata={"path": str(output_path(name, data)), "recorded by": f"dvc.lock, stage {candidates[key]}"}))
        for result in results:
            instance.report_runless_asset_event(AssetCheckEvaluation(asset_key=key, check_name=result.name, passed=result.passed,
                                                                     metadata={"adopted from": "dvc.lock"}))
        current[key] = version
        adopted.append(name)
    if adopted:
        say(f"dvc.lock: {len(adopted)} outputs on disk are the ones DVC recorded, with the same code and params: counted as made "
            f"({', '.join(adopted)})")
    return adopted


def _stage(spec: AssetSpec, written: dict, locked: dict, data: Path) -> str | None:
    """The DVC stage of `spec` when dvc.yaml has it as the graph makes it now, dvc.lock records it and its output exists."""
    name = output_key(spec.key.path)
    expected = spec_stage(spec)
    stage = dvc_stage_name(name)
    if expected is None or stage not in locked or not output_path(name, data).exists():
        return None
    return stage if written.get(stage) == expected else None
