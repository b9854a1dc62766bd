"""Move the project to and from its DVC remote; run by the DVC venv's Python, one JSON request on stdin, one JSON line out.

    .venv-dvc/bin/python -I pipelines/records/dvc_remote.py < request.json

Requests (`action`):
    configure  {name, url, endpoint_url}       the remote in .dvc/config.local, as `dvc remote add --local -f` would
    push       {remote, ledger, files: {patterns, beside}, record, wait}
               every DVC-tracked output in dvc.lock whose objects are in the cache (content-addressed: an object already on the
               remote is not sent again), then the project files outside DVC (`files`: run state, mid-round training states,
               promoted model versions, retired checkpoints' cards) under <remote>/rl-assets/files/, then the state (dvc.lock and
               Dagster's record of each output, the `ledger` file: pipelines/storage/remote.py) as <remote>/rl-assets/state.json, last, so a state never
               names what is not there yet.
    get-state  {remote}                        the state as pushed, or null
    get-files  {remote}                        the files of the last push, into the project (a state folder's json last)
    remove     {remote, hashes}                delete objects (an output's .dir and its files) from the remote (retention)

Pushes take <record>.lock, so two never run at once; a background push (`wait`: false) that finds another already
waiting for it exits: that one reads the newest state when its turn comes. The DVC repository lock is not held while
objects are sent (DVC's `push` holds it throughout, which would fail the step's `dvc commit` beside a long upload): the
objects come from the cache, which only grows while a run writes.

It imports dvc, so it runs only in DVC's environment and imports nothing of this project (see pipelines/records/dvc.py).
"""

import fcntl
import io
import json
import os
import sys
import time
from pathlib import Path

from dvc.repo import Repo
from dvc_data.hashfile.hash_info import HashInfo

PREFIX = "rl-assets"
LAST_FILES = ("trainer_state.json", "RETIRED.json", "model_card.json")  # what marks a folder complete goes up (and down) last


def configure(name: str, url: str, endpoint_url: str = "") -> dict:
    with Repo(".") as repo, repo.config.edit("local") as conf:
        remote = conf["remote"].setdefault(name, {})  # what `dvc remote modify --local` added (a region, a profile) stays
        remote["url"] = url
        if endpoint_url:
            remote["endpointurl"] = endpoint_url
        else:
            remote.pop("endpointurl", None)
    return {"configured": name}


def _remote(repo, name: str | None):
    remote = repo.cloud.get_remote(name or None)
    return remote, remote.fs.join(remote.path, PREFIX)


def _output_hashes(repo) -> tuple[list, list[str]]:
    """The hash of every output in dvc.lock whose objects are in the cache, and the outputs left out (not committed, retired)."""
    objects, left_out = [], []
    for stage in repo.index.stages:
        for out in stage.outs:
            if not out.use_cache:
                continue
            if out.hash_info is None or not out.hash_info.value:
                left_out.append(f"{out} (not in dvc.lock)")
            elif (Path(out.fs_path) / "RETIRED.json").is_file():
                continue  # retired: its card travels as a file, its objects stay where retention left them
            elif not out.cache.exists(out.hash_info.value):
                left_out.append(f"{out} (not in the cache)")
            else:
                objects += out_objects(out)
    return objects, left_out


def out_objects(out) -> list:
    """A committed output's objects: its hash, and a folder's files too (a push of the .dir alone is shallow)."""
    objects = [out.hash_info]
    if out.hash_info.isdir:
        manifest = json.loads(Path(out.cache.oid_to_path(out.hash_info.value)).read_text())
        objects += [HashInfo(out.hash_info.name, entry["md5"]) for entry in manifest]
    return objects


def _expand(files: dict) -> list[str]:
    """The files the globs `patterns` name now (and, beside a file named in `beside`, the files it lists), hidden ones left out."""
    found = {path for pattern in files["patterns"] for path in Path(".").glob(pattern)}
    found |= {path.parent / other for path in list(found) for other in files.get("beside", {}).get(path.name, [])}
    return sorted({p.as_posix() for p in found if p.is_file() and not any(part.startswith(".") for part in p.parts)})


def _ordered(paths: list[str]) -> list[str]:
    return sorted(paths, key=lambda p: (Path(p).name in LAST_FILES, p))


def _put(fs, local: str | None, remote: str, data: bytes | None = None) -> None:
    """One file up, whole or not at all: a directory remote gets a temporary file renamed over the old one (DVC's `put_file`
    does so for a path or a file object; `pipe_file` writes in place, and a killed push left a truncated listing there).
    An object store's PUT is whole anyway."""
    fs.makedirs(fs.parent(remote), exist_ok=True)
    fs.put_file(local if data is None else io.BytesIO(data), remote)


def _signature(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _push_files(fs, root: str, files: dict, record: dict) -> tuple[int, list[str]]:
    """Upload the files whose size or mtime differs from what this machine last sent; delete remote ones no longer here."""
    sent, failed = 0, []
    sent_before = record.get("files", {})
    now = {}
    for relative in _ordered(_expand(files)):
        path = Path(relative)
        if not path.is_file():
            continue
        signature = _signature(path)
        if sent_before.get(relative) != signature:
            try:
                _put(fs, str(path), fs.join(root, "files", relative))
            except Exception as error:  # noqa: BLE001 - one file's failure is reported, the others go on
                failed.append(f"{relative}: {error}")
                continue
            sent += 1
        now[relative] = signature
    for relative in set(sent_before) - set(now):
        try:
            fs.rm_file(fs.join(root, "files", relative))
        except FileNotFoundError:
            pass
    record["files"] = now
    _put(fs, None, fs.join(root, "files.json"), json.dumps(sorted(now)).encode())
    return sent, failed


def push(remote: str | None, ledger: str, files: dict, record: str, wait: bool, repo=None, objects=None) -> dict:
    """Push (see the module's docstring). `repo` and `objects`: an open Repo and the objects to send, from dvc_commit.py's
    follower, which commits each output and pushes what it committed without reading the project again."""
    if repo is None:
        with Repo(".") as repo:
            return push(remote, ledger, files, record, wait, repo=repo)
    record_path = Path(record)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    pending = open(f"{record}.pending", "w")
    if not wait:
        try:
            fcntl.flock(pending, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {"skipped": "another push is waiting and will send this"}
    with open(f"{record}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pending.close()
        started = time.time()
        previous = json.loads(record_path.read_text()) if record_path.is_file() else {}
        with repo.lock:  # only while dvc.yaml and dvc.lock are read
            left_out = []
            if objects is None:
                objects, left_out = _output_hashes(repo)
            lock_text = Path("dvc.lock").read_text() if Path("dvc.lock").is_file() else ""  # what `objects` came from
        target, root = _remote(repo, remote)
        result = repo.cloud.push(objects, remote=target.name)
        sent, failed_files = _push_files(target.fs, root, files, previous)
        failed = sorted(str(h) for h in result.failed) + failed_files
        state_pushed = not failed and Path(ledger).is_file()
        if state_pushed:
            state = {"dvc_lock": lock_text, "ledger": json.loads(Path(ledger).read_text()),
                     "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            _put(target.fs, None, target.fs.join(root, "state.json"), json.dumps(state).encode())
        url = target.fs.unstrip_protocol(target.path)
        summary = {"remote": target.name, "url": url, "objects": len(result.transferred), "files": sent, "failed": failed,
                   "not_pushed": left_out, "state_pushed": state_pushed, "at": started,
                   "seconds": round(time.time() - started, 2)}
        tmp = record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**previous, "last": summary}))
        os.replace(tmp, record_path)
    return summary


def get_state(remote: str | None) -> dict:
    with Repo(".") as repo:
        target, root = _remote(repo, remote)
        path = target.fs.join(root, "state.json")
        url = target.fs.unstrip_protocol(target.path)
        if not target.fs.exists(path):
            return {"state": None, "url": url, "remote": target.name}
        return {"state": json.loads(target.fs.cat_file(path)), "url": url, "remote": target.name}


def get_files(remote: str | None) -> dict:
    with Repo(".") as repo:
        target, root = _remote(repo, remote)
        listing = target.fs.join(root, "files.json")
        files = json.loads(target.fs.cat_file(listing)) if target.fs.exists(listing) else []
        got = 0
        for relative in _ordered(files):
            destination = Path(relative)
            destination.parent.mkdir(parents=True, exist_ok=True)
            tmp = destination.with_name(f".{destination.name}.pulling")
            target.fs.get_file(target.fs.join(root, "files", relative), str(tmp))
            os.replace(tmp, destination)
            got += 1
    return {"files": got}


def remove(remote: str | None, hashes: list[str]) -> dict:
    with Repo(".") as repo:
        target, _ = _remote(repo, remote)
        odb, removed = target.odb, 0
        for value in hashes:
            path = odb.oid_to_path(value)
            if odb.fs.exists(path):
                odb.fs.rm_file(path)
                removed += 1
    return {"removed": removed}


if __name__ == "__main__":
    request = json.load(sys.stdin)
    action = request.pop("action")
    try:
        answer = {"configure": configure, "push": push, "get-state": get_state, "get-files": get_files, "remove": remove}[action](**request)
    except Exception as error:  # noqa: BLE001 - DVC's and the storage's own words, for the caller to report
        answer = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps(answer))
