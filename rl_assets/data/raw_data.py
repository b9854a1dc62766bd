"""raw_data: read every configured source into one table, each row tagged with its source and hash.

Sources (`raw_data.sources` in params.yaml):

- static files: `jsonl`, `csv`, `parquet`, and `hf_dataset` (a folder written by `save_to_disk`);
- dynamic: `generator` (the seeded templates file of `raw_generators`) and `python` (your
  `module:function(count=, seed=)` returning row dicts).

A column mapping (`columns: {prompt: question, answer: solution, extra: [difficulty]}`) picks each
row's prompt and reference answer; `extra` columns travel as a JSON object to reward functions.
Every row carries `source`, `source_hash` (MD5 of the file; a folder hash for a dataset folder;
the module file of a python generator) and `source_row`.

With `columns: {image: <column>}` each row also carries an image (a path relative to the source file's
folder, the file's bytes, or a datasets Image value): checked with PIL, stored once under `<data>/images/`
by its SHA-256 and listed in the row's `image_ids` (rl_assets.data.images). A null cell is a text-only row.

Bad rows (invalid JSON, undecodable text, a missing column, a wrong type, an empty prompt) stop
the load with a `RawDataError` naming the file and line (or row); with `on_bad_rows: skip` they are
dropped and returned as messages. Problems with a whole source always stop the load.

Mixing: with `raw_data.max_rows` set, source i contributes min(its rows, its share) rows, its share
being max_rows * weight_i / sum(weights) (largest remainders make the shares add up); the rows are
a seeded draw without replacement, kept in source order. A source smaller than its share gives all
its rows and the others do not make up the difference. Without `max_rows`, every row is kept.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from rl_assets.core.config import ColumnsParams, Params, ParamsError, RawDataParams, SourceParams
from rl_assets.data.raw_files import BadRow, RawDataError, Records, read_csv, read_hf_dataset, read_jsonl, read_parquet, where
from rl_assets.data.images import read_image, store_images
from rl_assets.data.raw_generators import evaluate_expression, generate_problems, module_file, run_user_generator
from rl_assets.core.storage import content_hash

if TYPE_CHECKING:  # pyarrow loads with the data: the code location imports this module for the raw inputs
    import pyarrow as pa

__all__ = ["RawDataError", "check_sources", "evaluate_expression", "generate_problems", "labelled_location", "load_raw_data", "read_source", "source_inputs", "source_label"]


def source_label(source: SourceParams) -> str:
    """How rows name their source in the `source` column.

    >>> source_label(SourceParams(kind="python", function="gen:rows", count=1))
    'python:gen:rows'
    """
    if source.kind == "generator":
        return f"generator:{source.path}"
    return f"python:{source.function}" if source.kind == "python" else source.path


def source_location(source: SourceParams, root: Path) -> Path | None:
    """The file or folder whose content hash identifies the source (None: a python module not found)."""
    return labelled_location(source_label(source), root)


def labelled_location(label: str, root: Path) -> Path | None:
    """The file or folder a `source` column value names, so lineage and checks can re-hash it.

    >>> labelled_location("generator:data/raw/t.json", Path("."))
    PosixPath('data/raw/t.json')
    """
    kind, _, rest = label.partition(":")
    if kind == "generator":
        return root / rest
    if kind == "python":
        return module_file(rest.partition(":")[0], root)
    return root / label


def source_inputs(params: RawDataParams, root: Path = Path(".")) -> list[str]:
    """Paths (relative to `root`) of every file or folder the sources read: DVC deps of the raw_data stage.

    A python generator's module file counts when it lies under `root`; an installed module does not.
    """
    inputs = set()
    for source in params.sources:
        location = source_location(source, root)
        if location is None:
            continue
        try:
            inputs.add(location.resolve().relative_to(root.resolve()).as_posix())
        except ValueError:
            continue  # outside the project: hashed into every row, but not a DVC dep
    return sorted(inputs)


def check_sources(params: Params, source: str = "params.yaml", root: Path = Path("."), sections=("raw_data", "reward_model")) -> None:
    """Every data source exists: raw_data.sources files, folders and generator modules, and reward_model.preference_data;
    and every row of a JSONL source fits its column mapping (`first_bad_jsonl_row`).

    Raises one `ParamsError` listing each problem as `params.yaml: raw_data.sources[1].path: file not found: data/raw/x.jsonl`.
    """
    missing = []
    for index, item in enumerate(params.raw_data.sources if "raw_data" in sections else []):
        key = f"{source}: raw_data.sources[{index}]"
        if item.kind == "python":
            module = item.function.partition(":")[0]
            if module_file(module, root) is None:
                missing.append(f"{key}.function: module {module!r} not found in the project or on sys.path")
            continue
        path = root / item.path
        if item.kind == "hf_dataset" and not path.is_dir():
            missing.append(f"{key}.path: " + (f"not a folder (a save_to_disk folder is expected): {item.path}" if path.exists() else f"folder not found: {item.path}"))
        elif item.kind != "hf_dataset" and not path.is_file():
            missing.append(f"{key}.path: " + (f"not a file: {item.path}" if path.exists() else f"file not found: {item.path}"))
        elif item.kind == "jsonl" and (bad := first_bad_jsonl_row(item, root, item.on_bad_rows or params.raw_data.on_bad_rows)):
            missing.append(f"{key}.path: {bad}")
    if "reward_model" in sections and params.reward_model is not None and not (root / params.reward_model.preference_data).is_file():
        missing.append(f"{source}: reward_model.preference_data: file not found: {params.reward_model.preference_data}")
    if missing:
        raise ParamsError("\n".join(missing))


def first_bad_jsonl_row(source: SourceParams, root: Path, on_bad_rows: str = "error") -> str | None:
    """What the raw_data step would stop at in a JSONL source, named by file and line: its first bad row (undecodable text,
    invalid JSON, not an object, a column the mapping needs missing or of the wrong type; under `on_bad_rows: skip` those
    are dropped, not errors), or a file without rows. None when the file loads.

    Read here, before a run, as the step reads it (`map_row`), so a bad line stops `rl-assets run` up front rather than the
    run seconds later; images are left to the step (reading every one here would double its work).
    """
    label, columns = source_label(source), source.columns.model_copy(update={"image": None})
    rows = 0
    for number, record in read_jsonl(root / source.path, label):
        try:
            if isinstance(record, BadRow):
                raise record
            map_row(record, columns, where(label, "jsonl", number))
            rows += 1
        except BadRow as error:
            if on_bad_rows == "error":
                return f"{error}; raw_data.on_bad_rows: skip drops bad rows instead"
    return None if rows else f"{label}: no rows" + (" left after skipping bad rows" if on_bad_rows == "skip" else "")


def _records(source: SourceParams, root: Path, seed: int) -> Records:
    label = source.path
    columns = source.columns
    needed = {columns.prompt: "prompt", columns.answer: "answer", **{c: "extra" for c in columns.extra},
              **({columns.image: "image"} if columns.image else {})}
    typed = [columns.prompt, columns.answer]
    if source.kind == "python":
        return run_user_generator(source.function, source.count, seed, root)
    path = root / source.path
    if source.kind == "hf_dataset":
        if not path.is_dir():
            raise RawDataError(f"{label}: folder not found")
        return read_hf_dataset(path, label, needed, typed, source.split)
    if not path.is_file():
        raise RawDataError(f"{label}: file not found")
    if source.kind == "jsonl":
        return read_jsonl(path, label)
    if source.kind == "csv":
        return read_csv(path, label, needed)
    return read_parquet(path, label, needed, typed)


def image_base(source: SourceParams, root: Path) -> Path:
    """Where a source's relative image paths start: its file's folder, a datasets folder itself, the project for python."""
    if source.kind == "python":
        return root
    path = root / source.path
    return path if source.kind == "hf_dataset" else path.parent


def map_row(record: dict, columns: ColumnsParams, at: str, base: Path | None = None, images: dict | None = None) -> dict:
    """Our `prompt`, `answer`, `extra` (JSON text) and `image_ids` from one record; `BadRow` when it does not fit.

    With an image column, the image is read (paths from `base`) and checked, and `images` collects {id: (bytes, extension)}.
    """
    values = {}
    for field, column in (("prompt", columns.prompt), ("answer", columns.answer)):
        if column not in record:
            raise BadRow(f"{at}: missing column {column!r} (mapped to {field})")
        value = record[column]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise BadRow(f"{at}: column {column!r} must be text or a number, got {type(value).__name__}")
        values[field] = str(value).strip()
    if not values["prompt"]:
        raise BadRow(f"{at}: empty prompt in column {columns.prompt!r}")
    extra = {}
    for column in columns.extra:
        if column not in record:
            raise BadRow(f"{at}: missing column {column!r} (mapped to extra)")
        try:
            json.dumps(record[column], allow_nan=False)
        except (TypeError, ValueError):
            raise BadRow(f"{at}: column {column!r} holds {type(record[column]).__name__}, which is not JSON") from None
        extra[column] = record[column]
    values["extra"] = json.dumps(extra, sort_keys=True, ensure_ascii=False)
    values["image_ids"] = []
    if columns.image is not None:
        if columns.image not in record:
            raise BadRow(f"{at}: missing column {columns.image!r} (mapped to image)")
        if record[columns.image] is not None:
            identifier, data, extension = read_image(record[columns.image], base or Path("."), at)
            values["image_ids"] = [identifier]
            if images is not None:
                images[identifier] = (data, extension)
    return values


def read_source(source: SourceParams, root: Path, seed: int, on_bad_rows: str = "error",
                images: dict | None = None) -> tuple[list[dict], list[str]]:
    """The rows of one source (`source_row`, `prompt`, `answer`, `extra`, `image_ids`) and the messages of rows it dropped.

    `images` collects the rows' images, {id: (bytes, extension)}, for `store_images`.
    """
    label = source_label(source)
    if source.kind == "generator":
        rows = [{**row, "extra": "{}", "image_ids": []} for row in generate_problems(root / source.path, source.count, seed, source.path)]
        return rows, []
    rows, dropped = [], []
    for number, record in _records(source, root, seed):
        try:
            if isinstance(record, BadRow):
                raise record
            rows.append({"source_row": number, **map_row(record, source.columns, where(label, source.kind, number), image_base(source, root), images)})
        except BadRow as error:
            if on_bad_rows == "error":
                raise
            dropped.append(str(error))
    if not rows:
        raise RawDataError(f"{label}: no rows" + (f" left after skipping {len(dropped)} bad rows" if dropped else ""))
    return rows, dropped


def mix(sizes: list[int], weights: list[float], max_rows: int, seed: int) -> list[list[int]]:
    """Indices kept from each source: shares of `max_rows` by weight, a seeded draw without replacement.

    >>> [len(kept) for kept in mix([10, 10, 2], [1.0, 3.0, 4.0], 8, seed=0)]
    [1, 3, 2]
    """
    exact = [max_rows * w / sum(weights) for w in weights]
    shares = [int(e) for e in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (shares[i] - exact[i], i))
    for i in by_remainder[: max_rows - sum(shares)]:
        shares[i] += 1
    return [sorted(random.Random(f"mix:{seed}:{i}").sample(range(size), min(size, share))) for i, (size, share) in enumerate(zip(sizes, shares))]


def load_raw_data(params: RawDataParams, seed: int, root: Path = Path("."), images_dir: Path | None = None) -> tuple[pa.Table, list[str]]:
    """All sources merged into one `RAW_DATA` table, and the messages of skipped bad rows.

    The kept rows' images are stored in `images_dir` (rl_assets.data.images) once every source has loaded.
    Raises `RawDataError` before anything is written: a failed load leaves every output as it was.
    """
    import pyarrow as pa

    from rl_assets.core.schemas import RAW_DATA

    loaded, dropped, images = [], [], {}
    for source in params.sources:
        rows, skipped = read_source(source, root, seed, source.on_bad_rows or params.on_bad_rows, images)
        location = source_location(source, root)
        loaded.append((source_label(source), content_hash(location), rows))
        dropped += skipped
    if params.max_rows is not None:
        keep = mix([len(rows) for _, _, rows in loaded], [s.weight for s in params.sources], params.max_rows, seed)
        loaded = [(label, digest, [rows[i] for i in indices]) for (label, digest, rows), indices in zip(loaded, keep)]
    columns = {name: [] for name in RAW_DATA.names}
    for label, digest, rows in loaded:
        columns["source"] += [label] * len(rows)
        columns["source_hash"] += [digest] * len(rows)
        for key in ("source_row", "prompt", "answer", "extra", "image_ids"):
            columns[key] += [row[key] for row in rows]
    if images_dir is not None:
        kept = {identifier for ids in columns["image_ids"] for identifier in ids}  # not those of rows max_rows left out
        store_images({identifier: images[identifier] for identifier in sorted(kept)}, images_dir)
    return pa.table(columns, schema=RAW_DATA), dropped
