"""Images in raw data: every source kind's image column, content-addressed storage, broken images named by row and file,
image ids through prompts (the same question about two images is two prompts), and raw_data's DVC output."""

from __future__ import annotations

import hashlib
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_assets.core.config import RawDataParams, SourceParams
from rl_assets.core.schemas import PROMPTS, RAW_DATA, read_table, write_table
from rl_assets.core.tokenizer import build_tiny_tokenizer
from rl_assets.data.images import store_images, stored_image
from rl_assets.data.prompts import build_prompts, prompt_id
from rl_assets.data.raw_data import RawDataError, load_raw_data, read_source

COLUMNS = {"prompt": "question", "answer": "count", "image": "picture"}


def png(color: str, size=(8, 6), fmt="PNG") -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt)
    return buffer.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def pictures(tmp_path):
    """Two images beside a JSONL file that names them relative to its own folder."""
    folder = tmp_path / "raw" / "img"
    folder.mkdir(parents=True)
    red, blue = png("red"), png("blue", fmt="JPEG")
    (folder / "red.png").write_bytes(red)
    (folder / "blue.jpg").write_bytes(blue)
    lines = [{"question": "How many shapes?", "count": 3, "picture": "img/red.png"},
             {"question": "How many shapes?", "count": 5, "picture": "img/blue.jpg"},
             {"question": "Name the color.", "count": "red", "picture": "img/red.png"},
             {"question": "Text only.", "count": 1, "picture": None}]
    (tmp_path / "raw" / "shapes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return {"red": red, "blue": blue}


def jsonl_source(**overrides) -> SourceParams:
    return SourceParams(kind="jsonl", path="raw/shapes.jsonl", columns={**COLUMNS, **overrides})


def test_jsonl_images_are_stored_once_by_their_hash(tmp_path, pictures):
    images = tmp_path / "data" / "images"
    table, dropped = load_raw_data(RawDataParams(sources=[jsonl_source()]), seed=0, root=tmp_path, images_dir=images)
    assert dropped == []
    red, blue = sha(pictures["red"]), sha(pictures["blue"])
    assert table["image_ids"].to_pylist() == [[red], [blue], [red], []]  # a null cell: a text-only row
    assert sorted(p.name for p in images.iterdir()) == sorted([f"{red}.png", f"{blue}.jpg"])
    assert stored_image(images, blue).read_bytes() == pictures["blue"]  # the bytes themselves, not a re-encoding


def test_parquet_bytes_csv_paths_and_a_datasets_image_feature_give_the_same_ids(tmp_path, pictures):
    pq.write_table(pa.table({"question": ["q"], "count": ["3"], "picture": pa.array([pictures["red"]], pa.binary())}), tmp_path / "raw" / "t.parquet")
    (tmp_path / "raw" / "t.csv").write_text("question,count,picture\nq,3,img/red.png\n")
    import datasets

    dataset = datasets.Dataset.from_dict({"question": ["q"], "count": ["3"], "picture": [str(tmp_path / "raw" / "img" / "red.png")]})
    dataset.cast_column("picture", datasets.Image()).save_to_disk(str(tmp_path / "raw" / "ds"))
    for kind, path in (("parquet", "raw/t.parquet"), ("csv", "raw/t.csv"), ("hf_dataset", "raw/ds")):
        rows, _ = read_source(SourceParams(kind=kind, path=path, columns=COLUMNS), tmp_path, seed=0)
        assert rows[0]["image_ids"] == [sha(pictures["red"])], kind


@pytest.mark.parametrize("cell, expected", [
    ("img/missing.png", "raw/shapes.jsonl:1: image file not found: "),
    ("img/cut.png", "raw/shapes.jsonl:1: image 'img/cut.png': not a readable image"),
    ("img/text.png", "raw/shapes.jsonl:1: image 'img/text.png': not a readable image"),
    (7, "raw/shapes.jsonl:1: the image column must hold a path or bytes, got int"),
])
def test_a_broken_image_stops_the_load_naming_the_row_and_the_file(tmp_path, pictures, cell, expected):
    (tmp_path / "raw" / "img" / "cut.png").write_bytes(pictures["red"][: len(pictures["red"]) // 2])  # cut off mid-stream
    (tmp_path / "raw" / "img" / "text.png").write_text("not an image")
    (tmp_path / "raw" / "shapes.jsonl").write_text(json.dumps({"question": "q", "count": 1, "picture": cell}) + "\n"
                                                   + json.dumps({"question": "q2", "count": 2, "picture": "img/red.png"}) + "\n")
    images = tmp_path / "data" / "images"
    with pytest.raises(RawDataError) as error:
        load_raw_data(RawDataParams(sources=[jsonl_source()]), seed=0, root=tmp_path, images_dir=images)
    assert str(error.value).startswith(expected)
    assert not images.exists()  # nothing written: not even the good row's image
    table, dropped = load_raw_data(RawDataParams(sources=[jsonl_source()], on_bad_rows="skip"), seed=0, root=tmp_path, images_dir=images)
    assert table.num_rows == 1 and dropped[0].startswith(expected)
    assert [p.name for p in images.iterdir()] == [f"{sha(pictures['red'])}.png"]


def test_a_missing_image_column_is_named(tmp_path, pictures):
    with pytest.raises(RawDataError, match=r"raw/shapes.jsonl:1: missing column 'photo' \(mapped to image\)"):
        read_source(jsonl_source(image="photo"), tmp_path, seed=0)


def test_a_stored_image_that_no_longer_matches_its_id_is_written_again(tmp_path, pictures):
    identifier = sha(pictures["red"])
    assert store_images({identifier: (pictures["red"], "png")}, tmp_path) == 1
    assert store_images({identifier: (pictures["red"], "png")}, tmp_path) == 0  # intact: left alone
    (tmp_path / f"{identifier}.png").write_bytes(pictures["red"][:20])
    assert store_images({identifier: (pictures["red"], "png")}, tmp_path) == 1
    assert (tmp_path / f"{identifier}.png").read_bytes() == pictures["red"]


def test_prompts_carry_image_ids_and_one_question_about_two_images_is_two_prompts(tmp_path, pictures):
    from rl_assets.core.config import PromptsParams

    raw, _ = load_raw_data(RawDataParams(sources=[jsonl_source()]), seed=0, root=tmp_path)
    table, dropped = build_prompts(raw, PromptsParams(chat_template=False), build_tiny_tokenizer())
    assert dropped["conflicting"] == 0  # "How many shapes?" has answers 3 and 5, one per image: no conflict
    rows = {(r["problem"], r["answer"]): r for r in table.to_pylist()}
    red, blue = sha(pictures["red"]), sha(pictures["blue"])
    assert rows[("How many shapes?", "3")]["image_ids"] == [red] and rows[("How many shapes?", "5")]["image_ids"] == [blue]
    assert rows[("How many shapes?", "3")]["prompt_id"] == prompt_id("How many shapes?", "3", [red])
    assert rows[("Text only.", "1")]["prompt_id"] == prompt_id("Text only.", "1")  # a text prompt keeps the id it always had
    write_table(table, tmp_path / "prompts.parquet", PROMPTS, "prompts")
    assert read_table(tmp_path / "prompts.parquet", "prompts")["image_ids"].to_pylist() == table["image_ids"].to_pylist()


def test_the_same_question_and_image_with_two_answers_still_conflicts(tmp_path, pictures):
    from rl_assets.core.config import PromptsParams

    raw = pa.Table.from_pylist([{"prompt": "How many?", "answer": a, "source": "s", "source_hash": "h", "source_row": i, "extra": "{}",
                                 "image_ids": ["abc"]} for i, a in enumerate(["3", "4"])], schema=RAW_DATA)
    with pytest.raises(ValueError, match=r"'How many\?' \(image abc\): '3' \(s:0\), '4' \(s:1\)"):
        build_prompts(raw, PromptsParams(chat_template=False), build_tiny_tokenizer())


def test_tables_written_before_images_read_as_text_only(tmp_path):
    old = RAW_DATA.remove(RAW_DATA.get_field_index("image_ids")).with_metadata({b"rl_assets.schema": b"raw_data", b"rl_assets.schema_version": b"3"})
    pq.write_table(pa.Table.from_pylist([{"source": "s", "source_hash": "h", "source_row": 0, "prompt": "p", "answer": "a", "extra": "{}"}],
                                        schema=old), tmp_path / "raw_data.parquet")
    assert read_table(tmp_path / "raw_data.parquet", "raw_data")["image_ids"].to_pylist() == [[]]


def test_raw_data_declares_the_images_folder_as_a_dvc_output_when_a_source_has_images(tmp_path):
    from pathlib import Path

    from pipelines.definitions.assets import data_assets, has_images
    from pipelines.records.dvc import graph_stage
    from rl_assets.core.params_file import load_params

    text = load_params(Path(__file__).resolve().parents[3] / "params.yaml")
    with_images = text.model_copy(update={"raw_data": RawDataParams(sources=[jsonl_source()])})
    assert not has_images(text) and has_images(with_images)
    for params, outs in ((text, ["data/raw_data.parquet"]), (with_images, ["data/raw_data.parquet", "data/images"])):
        raw_data = data_assets(params)[0]
        metadata = {name: getattr(value, "value", value) for name, value in raw_data.specs_by_key[raw_data.key].metadata.items()}
        assert graph_stage("raw_data", metadata, [])["outs"] == outs


def test_lineage_walks_a_checkpoint_back_to_the_images_its_rounds_showed(tmp_path):
    from ops_support import make_fake_project
    from rl_assets.eval.lineage import format_trace, problems, trace_checkpoint

    shown, unused = png("red"), png("blue")
    root = make_fake_project(tmp_path, rounds=1, images={0: shown, 1: shown, 3: unused})  # p0, p1 sampled; p3 held out
    steps = trace_checkpoint(root / "data/r01/checkpoint", root=root)
    images = next(s for s in steps if s["kind"] == "images")
    assert (images["images"], images["status"]) == (1, "ok")  # the one image the round's prompts showed
    assert "1 images, each named by its SHA-256  [ok]" in format_trace(steps)
    stored = root / "data" / "images" / f"{sha(shown)}.png"
    stored.write_bytes(shown[:-8])
    steps = trace_checkpoint(root / "data/r01/checkpoint", root=root)
    assert problems(steps) == [f"{root / 'data' / 'images'}: 1 changed since recorded ({stored.name})"]
    stored.unlink()
    assert problems(trace_checkpoint(root / "data/r01/checkpoint", root=root)) == [f"{root / 'data' / 'images'}: 1 missing ({sha(shown)[:12]})"]
    text_only = make_fake_project(tmp_path / "text", rounds=1)
    assert [s["kind"] for s in trace_checkpoint(text_only / "data/r01/checkpoint", root=text_only)] == ["checkpoint", "checkpoint", "prompts", "raw"]


def test_rewards_receive_the_image_ids_only_when_prompts_show_images():
    from rl_assets.rewards import reward_kwargs

    rows = {"prompt": ["a", "b"], "answer": ["1", "2"], "prompt_id": ["p", "q"], "completion_ids": [[1], [2]], "truncated": [False, False],
            "extra": ["{}", "{}"]}
    assert "image_ids" not in reward_kwargs(pa.table({**rows, "image_ids": pa.array([[], []], pa.list_(pa.string()))}))
    assert reward_kwargs(pa.table({**rows, "image_ids": [["ab"], None]}))["image_ids"] == [["ab"], []]


def test_model_stages_refuse_prompts_with_images_while_every_policy_reads_text_only(tmp_path):
    """sft and rollouts stop before loading a model: a text policy would train on the words and report the images as seen."""
    from ops_support import make_fake_project
    from rl_assets.core.params_file import load_params
    from rl_assets.run.loaded import Loaded
    from rl_assets.run.stages import run_rollouts, run_sft

    root = make_fake_project(tmp_path, rounds=1, images={0: png("red")})
    params = load_params(root / "params.yaml")
    message = r"1 of 4 prompts show images, but the policy \(tiny\) reads text only"
    with pytest.raises(ValueError, match=message):
        run_sft(params, 0, root, "cpu", Loaded())
    with pytest.raises(ValueError, match=message):
        run_rollouts(params, 1, root, "cpu", Loaded())


def components(data: bytes) -> int:
    """Connected regions of non-white pixels (4-neighbours): the shapes a picture shows."""
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    pixels = image.load()
    seen, regions = set(), 0
    for start in ((x, y) for y in range(height) for x in range(width)):
        if start in seen or pixels[start] == (255, 255, 255):
            continue
        regions += 1
        stack = [start]
        seen.add(start)
        while stack:
            x, y = stack.pop()
            for nxt in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if 0 <= nxt[0] < width and 0 <= nxt[1] < height and nxt not in seen and pixels[nxt] != (255, 255, 255):
                    seen.add(nxt)
                    stack.append(nxt)
    return regions


def test_count_shapes_pictures_show_as_many_shapes_as_the_answer_says(tmp_path):
    source = SourceParams(kind="python", function="rl_assets.data.image_tasks:count_shapes", count=40,
                          columns={"image": "image", "extra": ["shapes"]})
    table, _ = load_raw_data(RawDataParams(sources=[source]), seed=5, root=tmp_path, images_dir=tmp_path / "images")
    answers = table["answer"].to_pylist()
    assert set(answers) == {str(n) for n in range(1, 7)}  # every count from 1 to 6 in 40 rows
    for answer, ids, extra in zip(answers, table["image_ids"].to_pylist(), table["extra"].to_pylist()):
        assert components(stored_image(tmp_path / "images", ids[0]).read_bytes()) == int(answer) == len(json.loads(extra)["shapes"])
    again, _ = load_raw_data(RawDataParams(sources=[source]), seed=5, root=tmp_path)
    assert again["image_ids"].to_pylist() == table["image_ids"].to_pylist()  # rendered byte for byte again: stable ids
