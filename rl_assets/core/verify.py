"""Is an output on disk still what was recorded for it? Checked before a run trusts it as up to date, and when a step reads it.

What was recorded is the output's data version: a checkpoint's id (the hash of its weights, written in its
lineage card when it was saved), else the file's MD5 (what DVC records). Hashing every output before every
run would cost seconds on a real model, so each output's signature (its files' sizes and mtimes) is cached in
`.rl_assets/verified.json` with the hash it had: an untouched output is checked by `stat` alone, a touched
one (truncated, overwritten, copied over) is hashed again.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl_assets.core.checkpoints import LINEAGE_FILE, read_retired, retired_words, weights_hash
from rl_assets.core.storage import atomic_path, file_hash

CACHE = Path(".rl_assets") / "verified.json"


class CorruptOutput(RuntimeError):
    """An output that is not what was recorded for it: stale, to be made again."""


def _files(path: Path) -> list[Path]:
    """The files whose bytes make the data version: a checkpoint's weights, or the file itself."""
    return sorted(path.glob("*.safetensors")) if path.is_dir() else [path]


def _signature(path: Path) -> list:
    return [[f.name, (s := f.stat()).st_size, s.st_mtime_ns] for f in _files(path)]


def current_hash(path: Path) -> str:
    """The data version the output on disk has now: a checkpoint's weights hash, else the file's MD5."""
    return weights_hash(path) if path.is_dir() else file_hash(path)


def changed(path: Path, recorded: str, root: Path = Path(".")) -> str | None:
    """Why the output at `path` is not the one recorded as `recorded` (None when it is), in words that name the file.

    >>> changed(Path("no/such/output.parquet"), "abc")
    'no/such/output.parquet is missing'
    """
    if not path.exists():
        return f"{path} is missing"
    if path.is_dir():
        if (note := read_retired(path)) is not None:  # a run that needs it restores it first (pipelines/storage/retention.py)
            return f"{path} was {retired_words(note)}"
        card = path / LINEAGE_FILE
        if not card.is_file():
            return f"{card} is missing"
        try:
            carded = json.loads(card.read_text())["checkpoint_id"]
        except (ValueError, KeyError) as error:
            return f"{card} is unreadable ({type(error).__name__})"
        if carded != recorded:
            return f"{card} names checkpoint {carded[:12]}, not the recorded {recorded[:12]}"
        if not _files(path):
            return f"{path} holds no weights (*.safetensors)"
    cache = _read_cache(root)
    signature = _signature(path)
    entry = cache.get(str(path))
    if entry is not None and entry["signature"] == signature:
        now = entry["hash"]
    else:
        now = current_hash(path)
        cache[str(path)] = {"signature": signature, "hash": now}
        _write_cache(cache, root)
    if now == recorded:
        return None
    sizes = ", ".join(f"{name}: {size:,} bytes" for name, size, _ in signature)
    return f"{path} changed since it was recorded (hash {now[:12]}, recorded {recorded[:12]}; {sizes})"


def check(path: Path, recorded: str, root: Path = Path(".")) -> None:
    """Raise CorruptOutput naming the file when the output at `path` is not the one recorded as `recorded`."""
    if why := changed(path, recorded, root):
        raise CorruptOutput(f"{why}: `rl-assets run` makes it again, with what depends on it")


def _read_cache(root: Path) -> dict:
    try:
        return json.loads((root / CACHE).read_text())
    except (OSError, ValueError):  # none yet, or cut off: hashing again is always right
        return {}


def _write_cache(cache: dict, root: Path) -> None:
    try:
        with atomic_path(root / CACHE) as tmp:
            tmp.write_text(json.dumps(cache, sort_keys=True))
    except OSError:  # a read-only project still verifies, only slower
        pass


def checkpoint_intact(path: str | Path, root: Path = Path(".")) -> None:
    """Raise CorruptOutput when a checkpoint folder's weights are not those its lineage card names (read before loading it)."""
    from rl_assets.core.checkpoints import read_lineage

    path = Path(path)
    if (path / LINEAGE_FILE).is_file():
        check(path, read_lineage(path)["checkpoint_id"], root)

