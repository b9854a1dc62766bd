"""Retention: keep the round checkpoints that matter, retire the others from disk, DVC's cache and (by option) the remote.

    rl-assets retire --keep 2 [--dry-run] [--from-remote]      (storage.keep_rounds: after every run)

Kept: r00 (every chain's root and the KL reference), the last N rounds, every model in the promotion history (rollback
can restore it), and the best by sampled held-out accuracy. A PPO round's value model goes with its round. A retired
checkpoint keeps its folder with its lineage card and RETIRED.json (its id, the DVC hash its files had, the remote that
holds them), so `lineage` says "retired", not "missing", and `rl-assets run` counts it as made: when a step must read
it again, the run first pulls it from the remote, or makes it again when no remote holds it (the same id: runs are
deterministic on one machine). DVC objects that a kept output shares (a tokenizer file) stay. Tables are small: kept.

Only the default experiment's outputs are DVC-tracked (dvc.yaml is the graph of params.yaml): retention works on those.
`dvc status` names a retired output as modified (its files are gone); `dvc repro` would make it again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from rl_assets.core.checkpoints import LINEAGE_FILE, RETIRED_FILE, read_lineage, read_retired
from rl_assets.core.config import Params
from rl_assets.core.paths import DATA, checkpoint_key, dvc_stage_name, output_path, round_prefix
from rl_assets.core.storage import atomic_path

CACHE = Path(".dvc") / "cache" / "files" / "md5"


def kept_checkpoints(params: Params, keep: int, data: Path = DATA, models: Path = Path("models")) -> tuple[dict[str, str], list[str]]:
    """({output key: why it is kept}, [output keys to retire]) among the round checkpoints (and value models) on disk."""
    from rl_assets.eval.promotion import history, promoted_stack, read_card

    on_disk = {n: checkpoint_key(n) for n in range(params.rounds + 1)
               if (output_path(checkpoint_key(n), data) / LINEAGE_FILE).is_file() and read_retired(output_path(checkpoint_key(n), data)) is None}
    if not on_disk:
        return {}, []
    last = max(on_disk)
    ids = {n: read_lineage(output_path(key, data))["checkpoint_id"] for n, key in on_disk.items()}
    promoted = set()
    for version in promoted_stack(history(models)):
        card = read_card(models / "versions" / version) or {}
        promoted |= {version, (card.get("merged_from_adapters") or {}).get("checkpoint_id")}
    best = best_checkpoint(data)
    why: dict[str, str] = {}
    for n, key in on_disk.items():
        reasons = (["r00: the root of every round"] if n == 0 else []) + ([f"one of the last {keep} rounds"] if n > last - keep else []) \
            + (["promoted (or in the rollback history)"] if ids[n] in promoted else []) + (["best sampled held-out accuracy"] if key == best else [])
        if reasons:
            why[key] = ", ".join(reasons)
    retire = [key for n, key in sorted(on_disk.items()) if key not in why]
    retire += [f"{round_prefix(n)}/critic" for n in on_disk if checkpoint_key(n) in retire
               and (output_path(f"{round_prefix(n)}/critic", data) / LINEAGE_FILE).is_file()]
    return why, retire


def best_checkpoint(data: Path = DATA) -> str | None:
    """The checkpoint with the best sampled accuracy in the evaluation table (None without one)."""
    import pyarrow.parquet as pq

    path = output_path("evaluation", data)
    if not path.is_file():
        return None
    rows = [row for row in pq.read_table(path, columns=["checkpoint", "mode", "accuracy"]).to_pylist() if row["mode"] == "sampled"]
    return max(rows, key=lambda row: (row["accuracy"], row["checkpoint"]))["checkpoint"] if rows else None


def _lock_outs() -> dict[str, dict]:
    """{output path: its dvc.lock entry (md5, size, nfiles)} of every stage in dvc.lock."""
    import yaml

    lock = yaml.safe_load(Path("dvc.lock").read_text()) if Path("dvc.lock").is_file() else {}
    return {out["path"]: out for entry in (lock or {}).get("stages", {}).values() for out in entry.get("outs", [])}


def objects_of(md5: str) -> set[str]:
    """The DVC object ids an output's hash names: a file's own, or a folder's .dir and every file listed in it."""
    if not md5.endswith(".dir"):
        return {md5}
    manifest = CACHE / md5[:2] / md5[2:]
    return {md5} | ({entry["md5"] for entry in json.loads(manifest.read_text())} if manifest.is_file() else set())


def disk_use(paths: list[Path]) -> int:
    """Bytes under `paths` (files counted once)."""
    return sum(f.stat().st_size for path in paths if path.exists() for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file())


def retire(params: Params, keep: int, dry_run: bool = False, from_remote: bool = False, instance=None, say=print) -> dict:
    """Retire what `kept_checkpoints` leaves out; what it did (or, with `dry_run`, would do)."""
    from pipelines.storage import remote

    models = Path(params.promotion.directory)
    if params.experiment != "default":
        raise ValueError("retention works on the default experiment's outputs (params.yaml), the ones DVC tracks")
    kept, retiring = kept_checkpoints(params, keep, DATA, models)
    outs = _lock_outs()
    not_in_lock = [key for key in retiring if output_path(key, DATA).as_posix() not in outs]
    retiring = [key for key in retiring if key not in not_in_lock]
    for key in not_in_lock:
        say(f"kept {key}: not in dvc.lock (`rl-assets run` records it)")
    shared = set().union(*[objects_of(out["md5"]) for path, out in outs.items() if "md5" in out and path not in
                           {output_path(k, DATA).as_posix() for k in retiring} and read_retired(Path(path)) is None] or [set()])
    gone = {key: objects_of(outs[output_path(key, DATA).as_posix()]["md5"]) - shared for key in retiring}
    freed = disk_use([output_path(key, DATA) for key in retiring]) + sum(
        (CACHE / h[:2] / h[2:]).stat().st_size for objects in gone.values() for h in objects if (CACHE / h[:2] / h[2:]).is_file())
    report = {"kept": kept, "retired": retiring, "bytes_freed": freed, "dry_run": dry_run}
    for key, why in kept.items():
        say(f"keep   {key}: {why}")
    for key in retiring:
        say(f"{'would retire' if dry_run else 'retire'} {key}")
    if dry_run or not retiring:
        return report
    url = None
    if instance is not None and (pushed := remote.push(instance, params, wait=True)) is not None:
        if pushed["failed"]:
            raise RuntimeError(f"the push before retiring failed ({'; '.join(pushed['failed'])}): nothing was retired")
        url = pushed["url"]
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for key in retiring:
        path = output_path(key, DATA)
        entry = outs[path.as_posix()]
        note = {"output": key, "checkpoint_id": read_lineage(path)["checkpoint_id"], "dvc_hash": entry["md5"], "bytes": entry.get("size"),
                "remote": None if from_remote else url, "retired_at": stamp, "stage": dvc_stage_name(key)}
        for item in path.iterdir():
            if item.name != LINEAGE_FILE:
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        with atomic_path(path / RETIRED_FILE) as tmp:
            tmp.write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")
        for h in gone[key]:
            (CACHE / h[:2] / h[2:]).unlink(missing_ok=True)
    if from_remote and (name := remote.remote_name(params.storage)) is not None:
        removed = remote._helper({"action": "remove", "remote": name, "hashes": sorted(set().union(*gone.values()))})["removed"]
        report["removed_from_remote"] = removed
        say(f"removed {removed} objects from the remote")
    if instance is not None:
        remote.push(instance, params, wait=True)  # the retired cards go up, so a pulled project knows them
    say(f"retired {len(retiring)} outputs, {freed / 2**20:.1f} MiB freed on this disk")
    return report


def restore(key: str, params: Params, say=print) -> bool:
    """Bring a retired output's files back from the remote; whether they are back, as recorded."""
    from pipelines.storage import remote
    from pipelines.records.dvc import dvc_executable, dvc_message
    from rl_assets.core.verify import changed

    path = output_path(key, DATA)
    note = read_retired(path)
    name = remote.remote_name(params.storage) if note and note.get("remote") else None
    if note is None or name is None or dvc_executable() is None:
        return False
    (path / RETIRED_FILE).unlink()
    done = subprocess.run([dvc_executable(), "pull", "--force", "-r", name, note["stage"]], capture_output=True, text=True)
    if done.returncode == 0 and changed(path, note["checkpoint_id"]) is None:
        say(f"restored {key} from {note['remote']} (it was retired)")
        return True
    with atomic_path(path / RETIRED_FILE) as tmp:
        tmp.write_text(json.dumps(note, indent=2, sort_keys=True) + "\n")
    say(f"warning: {key} could not be restored from {note['remote']} ({dvc_message(done) if done.returncode else 'not the recorded files'})")
    return False


def needed_again(reasons: dict, specs, params: Params, say=print) -> dict:
    """`reasons` (pipelines/records/outdated.py) plus every retired output a step that runs reads, restored from the remote where one
    holds it, else made again."""
    from rl_assets.core.paths import flow_order, output_key

    by_key = {spec.key: spec for spec in specs}
    added: dict = {}
    pending = list(reasons)
    while pending:
        key = pending.pop()
        for dep in by_key[key].deps if key in by_key else []:
            name = output_key(dep.asset_key.path)
            if dep.asset_key in reasons or dep.asset_key in added or dep.asset_key not in by_key or not output_path(name, DATA).is_dir():
                continue
            if read_retired(output_path(name, DATA)) is None or restore(name, params, say):
                continue
            added[dep.asset_key] = f"retired and on no remote, and {output_key(key.path)} reads it: made again"
            pending.append(dep.asset_key)
    by_name = {output_key(key.path): key for key in added}
    return {**{by_name[name]: added[by_name[name]] for name in flow_order(list(by_name))}, **reasons}  # upstream first
