"""storage.py: atomic replacement of files and folders, and the MD5 hashes DVC also records."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from rl_assets.core.storage import atomic_path, content_hash, dir_hash, file_hash


class Boom(Exception):
    pass


def names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- hashes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 10, (1 << 20) + 17])  # the last spans more than one read block
def test_file_hash_is_md5_of_the_bytes(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert file_hash(path) == hashlib.md5(data).hexdigest()


def test_a_large_file_is_hashed_once_while_unchanged_and_again_after_any_write(tmp_path, monkeypatch):
    """Weights are hashed when saved and checked right after: the second hash is remembered; a write in place that keeps
    the size and puts the old mtime back still changes the ctime, so the corrupted file is read again."""
    import rl_assets.core.storage as storage

    monkeypatch.setattr(storage, "REMEMBERED_SIZE", 1024)
    monkeypatch.setattr(storage, "_remembered", {})
    path, data = tmp_path / "model.safetensors", os.urandom(4096)
    path.write_bytes(data)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert file_hash(path) == file_hash(path) == hashlib.md5(data).hexdigest() and len(opened) == 1
    before = os.stat(path)
    time.sleep(0.05)  # file times tick with the kernel's coarse clock (a few ms)
    with real_open(path, "r+b") as handle:  # one byte flipped in place: same size
        handle.seek(100)
        handle.write(bytes([data[100] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    corrupted = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    assert file_hash(path) == hashlib.md5(corrupted).hexdigest() and len(opened) == 2
    small = tmp_path / "table.parquet"
    small.write_bytes(b"x" * 100)
    file_hash(small), file_hash(small)
    assert len(opened) == 4  # small files are read each time


def _fill(folder, files: dict[str, bytes]):
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


FILES = {"config.json": b"{}", "model.safetensors": b"weights", "sub/tokenizer.json": b"tok"}


def test_dir_hash_is_independent_of_creation_order(tmp_path):
    first = _fill(tmp_path / "a", FILES)
    second = _fill(tmp_path / "b", dict(reversed(list(FILES.items()))))
    assert dir_hash(first) == dir_hash(second)


def test_dir_hash_changes_with_content_names_and_new_files(tmp_path):
    folder = _fill(tmp_path / "a", FILES)
    original = dir_hash(folder)
    (folder / "model.safetensors").write_bytes(b"weightz")
    changed_content = dir_hash(folder)
    (folder / "model.safetensors").rename(folder / "model2.safetensors")
    renamed = dir_hash(folder)
    (folder / "extra.txt").write_bytes(b"")
    added = dir_hash(folder)
    assert len({original, changed_content, renamed, added}) == 4


def test_dir_hash_exclude_skips_the_named_file(tmp_path):
    folder = _fill(tmp_path / "a", FILES)
    without = dir_hash(folder)
    (folder / "lineage.json").write_text("{}")
    assert dir_hash(folder, exclude=("lineage.json",)) == without
    assert dir_hash(folder) != without


def test_dir_hash_ignores_empty_folders(tmp_path):
    folder = _fill(tmp_path / "a", FILES)
    before = dir_hash(folder)
    (folder / "empty").mkdir()
    assert dir_hash(folder) == before


def test_content_hash_dispatches_on_kind(tmp_path):
    folder = _fill(tmp_path / "a", FILES)
    assert content_hash(folder) == dir_hash(folder)
    assert content_hash(folder / "config.json") == file_hash(folder / "config.json")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        content_hash(tmp_path / "missing")


# --- atomic_path: files ------------------------------------------------------------------------


def test_atomic_file_write_creates_parents_and_leaves_only_the_file(tmp_path):
    final = tmp_path / "deep" / "out.parquet"
    with atomic_path(final) as tmp:
        assert tmp.parent == final.parent and tmp != final
        tmp.write_bytes(b"new")
        assert not final.exists()  # nothing appears before the block succeeds
    assert final.read_bytes() == b"new"
    assert names(final.parent) == ["out.parquet"]


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_atomic_file_write_on_error_keeps_the_old_file_and_no_temp(tmp_path, error):
    final = tmp_path / "out.parquet"
    final.write_bytes(b"old")
    with pytest.raises(error):
        with atomic_path(final) as tmp:
            tmp.write_bytes(b"half-written")
            raise error()
    assert final.read_bytes() == b"old"
    assert names(tmp_path) == ["out.parquet"]


def test_atomic_file_write_on_error_without_a_previous_file_leaves_nothing(tmp_path):
    with pytest.raises(Boom):
        with atomic_path(tmp_path / "out.parquet") as tmp:
            tmp.write_bytes(b"x")
            raise Boom()
    assert names(tmp_path) == []


# --- atomic_path: folders ------------------------------------------------------------------------


def test_atomic_folder_replaces_an_existing_folder_entirely(tmp_path):
    final = _fill(tmp_path / "ckpt", {"old.bin": b"old", "config.json": b"1"})
    with atomic_path(final, is_dir=True) as tmp:
        assert tmp.is_dir() and tmp.parent == tmp_path
        _fill(tmp, {"config.json": b"2", "new.bin": b"new"})
        assert (final / "old.bin").read_bytes() == b"old"  # readers still see the old folder meanwhile
    assert names(final) == ["config.json", "new.bin"]
    assert (final / "config.json").read_bytes() == b"2"
    assert names(tmp_path) == ["ckpt"]  # no .tmp- or .old- sibling left


def test_atomic_folder_creates_a_new_folder(tmp_path):
    final = tmp_path / "runs" / "ckpt"
    with atomic_path(final, is_dir=True) as tmp:
        _fill(tmp, {"a": b"1"})
    assert names(final) == ["a"]
    assert names(final.parent) == ["ckpt"]


def test_atomic_folder_on_error_keeps_the_old_folder_and_no_temp(tmp_path):
    final = _fill(tmp_path / "ckpt", {"config.json": b"1", "sub/w.bin": b"w"})
    before = dir_hash(final)
    with pytest.raises(Boom):
        with atomic_path(final, is_dir=True) as tmp:
            _fill(tmp, {"config.json": b"2"})
            raise Boom()
    assert dir_hash(final) == before
    assert names(tmp_path) == ["ckpt"]


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.mark.parametrize("is_dir,expected", [(False, 0o644), (True, 0o755)], ids=["file", "folder"])
def test_atomic_output_gets_the_usual_permissions(tmp_path, umask_022, is_dir, expected):
    final = tmp_path / "out"
    with atomic_path(final, is_dir=is_dir) as tmp:
        if not is_dir:
            tmp.write_bytes(b"x")
    assert final.stat().st_mode & 0o777 == expected
