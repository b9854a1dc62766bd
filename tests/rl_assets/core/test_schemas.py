"""schemas.py: every table round-trips through Parquet and is refused under the wrong schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_assets.core.schemas import (EPISODE_COLUMNS, EVALUATION, PROMPTS, RAW_DATA, ROLLOUTS, SCHEMA_VERSION, TABLE_VERSIONS, read_table,
                               reward_function_names, rewards_schema, write_table)

# An episode: a tool call (policy), its result (the tool's tokens), the answer (policy).
EPISODE = {"completion_mask": [1, 1, 0, 0, 1], "num_turns": 2, "environment": "tools", "environment_rewards": '{"tool_calls": 1.0}',
           "turns": [{"role": "assistant", "text": "<c>", "start": 0, "end": 2}, {"role": "environment", "text": "<r>", "start": 2, "end": 4},
                     {"role": "assistant", "text": "3", "start": 4, "end": 5}],
           "tool_calls": [{"turn": 1, "name": "calculator", "arguments": '{"expression": "1+2"}', "output": "3", "error": None}]}
SINGLE = {"completion_mask": None, "turns": None, "tool_calls": None, "num_turns": 1, "environment": None, "environment_rewards": None}

SAMPLES = {
    "raw_data": (RAW_DATA, [
        {"source": "generator:t.json", "source_hash": "a" * 32, "source_row": 0, "prompt": "1+2=", "answer": "3", "extra": "{}",
         "image_ids": []},
        {"source": "x.jsonl", "source_hash": "b" * 32, "source_row": 7, "prompt": "9-12=", "answer": "-3", "extra": '{"tests": ["a"]}',
         "image_ids": ["d" * 64]},
    ]),
    "prompts": (PROMPTS, [
        {"prompt_id": "0123456789abcdef", "prompt": "Q: 1+2=", "problem": "1+2=", "answer": "3", "split": "train",
         "n_tokens": 8, "source": "x.jsonl", "source_hash": "c" * 32, "source_row": 1, "extra": '{"level": 2}',
         "image_ids": ["e" * 64, "f" * 64]},
    ]),
    "rollouts": (ROLLOUTS, [
        {"round": 1, "prompt_id": "p", "sample_idx": s, "prompt": "1+2=", "answer": "3", "extra": "{}", "completion": "3",
         "prompt_ids": [1, 5, 67, 6, 71], "completion_ids": [7, 2][: s + 1], "logprobs": [-0.5, -1.25][: s + 1],
         "sampler_logprobs": None if s == 0 else [-0.5, -1.5], "truncated": s == 0, "policy_id": "ckpt", "temperature": 1.0, "top_p": 0.5, "max_new_tokens": 4, "seed": 1001,
         "prompts_hash": "h", "image_ids": [] if s == 0 else ["a" * 64], "prior_pass_rate": None if s == 0 else 0.5,
         "prior_samples": 0 if s == 0 else 8, **(SINGLE if s == 0 else {**EPISODE, "completion_ids": [7, 2, 9, 9, 3], "logprobs": [-0.5, -1.25, 0.0, 0.0, -0.75],
                                                         "sampler_logprobs": None})}
        for s in range(2)
    ]),
    "evaluation": (EVALUATION, [
        {"checkpoint": "r00/checkpoint", "checkpoint_id": "id0", "mode": "greedy", "accuracy": 0.25, "reward_mean": 0.3,
         "pass_at_k": 0.25, "correctness": "arithmetic_answer", "n_prompts": 8,
         "n_samples": 1, "mean_completion_tokens": 3.5, "temperature": 0.0, "seed": 0, "tool_call_rate": 0.5,
         "correct_per_prompt": [1, 0, 0, 1, 0, 0, 0, 0], "gain": 0.125, "gain_se": 0.0625},
    ]),
    "rewards": (rewards_schema(["arithmetic_answer", "answer_format"]), [
        {"round": 1, "prompt_id": "p", "sample_idx": 0, "policy_id": "ckpt", "reward": 1.5, "reward_config_hash": "r",
         "rollouts_hash": "h", "score_arithmetic_answer": 1.0, "score_answer_format": None},
    ]),
}


SELECTION = ("prior_pass_rate", "prior_samples")  # rollouts v6


@pytest.mark.parametrize("name", list(SAMPLES))
def test_write_then_read_round_trips(tmp_path, name):
    schema, rows = SAMPLES[name]
    table = pa.Table.from_pylist(rows, schema=schema)
    path = write_table(table, tmp_path / f"{name}.parquet", schema, name)
    back = read_table(path, name)
    assert back.schema.remove_metadata().equals(schema)
    assert back.to_pylist() == rows  # values chosen to be exact in float32
    assert back.replace_schema_metadata().equals(table)
    meta = back.schema.metadata
    assert meta[b"rl_assets.schema"] == name.encode() and meta[b"rl_assets.schema_version"] == str(TABLE_VERSIONS.get(name, SCHEMA_VERSION)).encode()


def test_rollout_list_columns_keep_their_element_types(tmp_path):
    schema, rows = SAMPLES["rollouts"]
    back = read_table(write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "r.parquet", schema, "rollouts"), "rollouts")
    assert back.schema.field("completion_ids").type == pa.list_(pa.int32())
    assert back.schema.field("logprobs").type == pa.list_(pa.float32())
    assert back["logprobs"].to_pylist() == [[-0.5], [-0.5, -1.25, 0.0, 0.0, -0.75]]


def test_write_table_casts_and_orders_columns_and_drops_extras(tmp_path):
    rows = SAMPLES["raw_data"][1]
    # Columns in another order, default int64/str types, plus a column the schema does not have.
    table = pa.table({"answer": [r["answer"] for r in rows], "unknown": [1, 2], **{k: [r[k] for r in rows] for k in ("extra", "prompt", "source_row", "source_hash", "source", "image_ids")}})
    back = read_table(write_table(table, tmp_path / "raw.parquet", RAW_DATA, "raw_data"), "raw_data")
    assert back.column_names == RAW_DATA.names
    assert back.to_pylist() == rows


def test_rewards_schema_and_function_names():
    schema = rewards_schema(["arithmetic_answer", "answer_format"])
    assert schema.names[-2:] == ["score_arithmetic_answer", "score_answer_format"]
    assert schema.field("reward").type == pa.float64()
    table = pa.Table.from_pylist(SAMPLES["rewards"][1], schema=schema)
    assert reward_function_names(table) == ["arithmetic_answer", "answer_format"]
    assert reward_function_names(pa.Table.from_pylist([], schema=rewards_schema([]))) == []


def test_read_table_refuses_another_schema_name(tmp_path):
    schema, rows = SAMPLES["prompts"]
    path = write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "t.parquet", schema, "prompts")
    with pytest.raises(ValueError) as caught:
        read_table(path, "rollouts")
    assert str(caught.value) == f"{path}: expected table 'rollouts' v{TABLE_VERSIONS['rollouts']}, found 'prompts' v{TABLE_VERSIONS['prompts']}"


def test_read_table_refuses_a_plain_parquet_file(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist(SAMPLES["raw_data"][1], schema=RAW_DATA), path)
    with pytest.raises(ValueError, match=rf"expected table 'raw_data' v{TABLE_VERSIONS['raw_data']}, found '\?' v\?"):
        read_table(path, "raw_data")


def test_read_table_refuses_another_schema_version(tmp_path):
    path = tmp_path / "old.parquet"
    table = pa.Table.from_pylist(SAMPLES["raw_data"][1], schema=RAW_DATA)
    pq.write_table(table.replace_schema_metadata({b"rl_assets.schema": b"raw_data", b"rl_assets.schema_version": b"0"}), path)
    with pytest.raises(ValueError, match=r"found 'raw_data' v0"):
        read_table(path, "raw_data")


def test_read_table_of_a_missing_file_says_what_to_materialize(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"table 'prompts' not found; materialize"):
        read_table(tmp_path / "prompts.parquet", "prompts")


def test_write_table_refuses_missing_columns_and_leaves_no_file(tmp_path):
    rows = SAMPLES["raw_data"][1]
    table = pa.table({k: [r[k] for r in rows] for k in ("source", "source_hash", "prompt")})
    path = tmp_path / "raw.parquet"
    with pytest.raises(ValueError) as caught:
        write_table(table, path, RAW_DATA, "raw_data")
    assert str(caught.value) == f"{path}: table 'raw_data' lacks columns ['answer', 'extra', 'image_ids', 'source_row']"
    assert list(tmp_path.iterdir()) == []


def test_write_table_that_cannot_cast_keeps_the_previous_file(tmp_path):
    schema, rows = SAMPLES["raw_data"]
    path = write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "raw.parquet", schema, "raw_data")
    before = path.read_bytes()
    bad = pa.table({**{k: [r[k] for r in rows] for k in schema.names}, "source_row": ["zero", "one"]})
    with pytest.raises(pa.ArrowInvalid):
        write_table(bad, path, schema, "raw_data")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["raw.parquet"]


def test_write_table_replaces_an_existing_file(tmp_path):
    schema, rows = SAMPLES["raw_data"]
    path = tmp_path / "raw.parquet"
    write_table(pa.Table.from_pylist(rows, schema=schema), path, schema, "raw_data")
    write_table(pa.Table.from_pylist(rows[:1], schema=schema), path, schema, "raw_data")
    assert read_table(path, "raw_data").to_pylist() == rows[:1]
    assert [p.name for p in tmp_path.iterdir()] == ["raw.parquet"]


def test_a_single_turn_rollouts_table_of_v3_still_reads_as_one_turn_each(tmp_path):
    """Written before episodes: the episode columns read as null, with one policy turn per rollout."""
    rows = [{k: v for k, v in SAMPLES["rollouts"][1][0].items() if k not in (*EPISODE_COLUMNS, "image_ids", *SELECTION)}]
    v3 = pa.schema([f for f in ROLLOUTS if f.name not in (*EPISODE_COLUMNS, "image_ids", *SELECTION)])
    path = tmp_path / "rollouts.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=v3).replace_schema_metadata({b"rl_assets.schema": b"rollouts", b"rl_assets.schema_version": b"3"}), path)
    back = read_table(path, "rollouts")
    assert back.schema.remove_metadata().equals(ROLLOUTS)
    assert back.to_pylist() == [{**SAMPLES["rollouts"][1][0], "prior_samples": None}]


def test_a_rollouts_table_of_v4_reads_as_text_only(tmp_path):
    """Written before prompts carried images: every rollout's image_ids is []."""
    rows = [{k: v for k, v in row.items() if k not in ("image_ids", *SELECTION)} for row in SAMPLES["rollouts"][1]]
    v4 = pa.schema([f for f in ROLLOUTS if f.name not in ("image_ids", *SELECTION)])
    path = tmp_path / "rollouts.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=v4).replace_schema_metadata({b"rl_assets.schema": b"rollouts", b"rl_assets.schema_version": b"4"}), path)
    back = read_table(path, "rollouts")
    assert back.schema.remove_metadata().equals(ROLLOUTS)
    assert back["image_ids"].to_pylist() == [[], []] and back.drop_columns(["image_ids", *SELECTION]).to_pylist() == rows


def test_a_rollouts_table_of_v5_reads_without_why_its_prompts_were_chosen(tmp_path):
    """Written before rollouts.selection: the prompts' prior pass rate and sample count are null (not recorded)."""
    rows = [{k: v for k, v in row.items() if k not in SELECTION} for row in SAMPLES["rollouts"][1]]
    v5 = pa.schema([f for f in ROLLOUTS if f.name not in SELECTION])
    path = tmp_path / "rollouts.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=v5).replace_schema_metadata({b"rl_assets.schema": b"rollouts", b"rl_assets.schema_version": b"5"}), path)
    back = read_table(path, "rollouts")
    assert back.schema.remove_metadata().equals(ROLLOUTS)
    assert back.select(list(SELECTION)).to_pylist() == [{"prior_pass_rate": None, "prior_samples": None}] * 2


def test_an_evaluation_table_of_v3_reads_without_a_tool_call_rate(tmp_path):
    added = {"tool_call_rate": None, "correct_per_prompt": None, "gain": None, "gain_se": None}  # v4, then v5
    for version, missing in (("3", added), ("4", {k: None for k in list(added)[1:]})):
        rows = [{k: v for k, v in SAMPLES["evaluation"][1][0].items() if k not in missing}]
        path = tmp_path / f"evaluation-v{version}.parquet"
        old = pa.schema([f for f in EVALUATION if f.name not in missing])
        pq.write_table(pa.Table.from_pylist(rows, schema=old).replace_schema_metadata({b"rl_assets.schema": b"evaluation",
                                                                                       b"rl_assets.schema_version": version.encode()}), path)
        back = read_table(path, "evaluation")
        assert back.schema.names == EVALUATION.names and back.to_pylist() == [{**rows[0], **missing}]
