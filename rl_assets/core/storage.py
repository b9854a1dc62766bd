"""Atomic writes and content hashes for every output (tables and checkpoint folders).

A killed step must never leave a half-written file where a reader would take it for a finished
one, so everything is written to a temporary sibling and renamed into place. Hashes are MD5 of the
bytes, the same hash DVC records for a file, so Dagster data versions and `dvc.lock` agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


REMEMBERED_SIZE = 64 << 20  # files this large (a model's weights) are hashed once per process while unchanged
_remembered: dict[tuple[int, ...], str] = {}


def file_hash(path: str | Path) -> str:
    """MD5 of a file's bytes (what DVC stores for a file output).

    A process hashes a large file once while it is unchanged: a checkpoint's weights are hashed when saved (its id)
    and again by the guard that checks that id right after. The key is the file's identity and change times, ctime
    included: any write changes it and no call sets it back, so a file changed since is read again (file times tick
    every few milliseconds; a run's check of its outputs at the start is another process's, which reads them anew).
    """
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if key in _remembered:
        return _remembered[key]
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if info.st_size >= REMEMBERED_SIZE:
        _remembered[key] = digest.hexdigest()
    return digest.hexdigest()


def dir_hash(path: str | Path, exclude: tuple[str, ...] = ()) -> str:
    """Hash of a folder: MD5 over its files' relative paths and MD5s, in sorted order."""
    root = Path(path)
    digest = hashlib.md5()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = file.relative_to(root).as_posix()
        if relative in exclude:
            continue
        digest.update(f"{relative}\0{file_hash(file)}\n".encode())
    return digest.hexdigest()


def content_hash(path: str | Path) -> str:
    """`file_hash` for a file, `dir_hash` for a folder."""
    path = Path(path)
    if path.is_dir():
        return dir_hash(path)
    if path.is_file():
        return file_hash(path)
    raise FileNotFoundError(f"{path}: no such file or folder to hash")


def _readable_by_all(path: Path) -> None:
    """mkstemp/mkdtemp create owner-only entries; give outputs the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_path(final: str | Path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `final`; on success it replaces `final`, on error it is removed.

    For folders the old content is moved aside first and deleted only after the new one is in
    place, so a reader sees either the old or the new folder, never a mix.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        _readable_by_all(tmp)
        if is_dir and final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
