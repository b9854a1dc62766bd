"""The Parquet schema of every table, with the lineage columns each row needs to be traced back.

One explicit `pyarrow` schema per table; the schema name and version travel in the file metadata,
and `read_table` refuses a file written under another schema or version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rl_assets.core.storage import atomic_path

SCHEMA_VERSION = 3  # 2: `extra` (JSON object of reward inputs) in raw_data, prompts and rollouts; 3: rollouts' sampler_logprobs
# Tables whose schema moved on since; each still reads the version before it (`_UPGRADES`).
# rollouts 4: episodes (completion_mask, turns, tool_calls, num_turns, environment, environment_rewards); evaluation 4: tool_call_rate,
# 5: correct_per_prompt, gain, gain_se; raw_data and prompts 4: image_ids
TABLE_VERSIONS = {"rollouts": 6, "evaluation": 5, "raw_data": 4, "prompts": 4}  # rollouts 5: image_ids

RAW_DATA = pa.schema(
    [
        ("source", pa.string()),  # file/folder path, "generator:<templates path>" or "python:<module>:<function>"
        ("source_hash", pa.string()),  # MD5 of the raw file (folder hash, generator module file) the row came from
        ("source_row", pa.int64()),  # 1-based line (JSONL, CSV), 0-based row (Parquet, datasets, python) or generated index
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("extra", pa.string()),  # JSON object of the source's extra columns, passed to reward functions; "{}" when none
        ("image_ids", pa.list_(pa.string())),  # SHA-256 of each image the prompt shows (<data>/images/<id>.<ext>); [] for text
    ]
)

PROMPTS = pa.schema(
    [
        ("prompt_id", pa.string()),  # stable content hash of (problem, answer)
        ("prompt", pa.string()),  # the text the policy sees (template applied)
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("split", pa.string()),  # "sft", "rl" or "eval", from the prompt_id hash
        ("n_tokens", pa.int32()),
        ("source", pa.string()),
        ("source_hash", pa.string()),
        ("source_row", pa.int64()),
        ("extra", pa.string()),
        ("image_ids", pa.list_(pa.string())),
    ]
)

ROLLOUTS = pa.schema(
    [
        ("round", pa.int32()),
        ("prompt_id", pa.string()),
        ("sample_idx", pa.int32()),
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("extra", pa.string()),  # the prompt's extra reward inputs (JSON object)
        ("completion", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),  # per completion token, under the sampling policy, in the trainer's precision
        ("sampler_logprobs", pa.list_(pa.float32())),  # the sampling engine's own (vLLM), null from transformers generate
        ("truncated", pa.bool_()),  # hit max_new_tokens without an end-of-sequence token
        ("policy_id", pa.string()),  # content hash of the checkpoint that sampled
        ("temperature", pa.float32()),
        ("top_p", pa.float32()),
        ("max_new_tokens", pa.int32()),
        ("seed", pa.int64()),
        ("prompts_hash", pa.string()),
        # Episodes (rollouts.tools or rollouts.environment); a single completion has mask, turns, tool calls and environment null.
        ("completion_mask", pa.list_(pa.int8())),  # per completion token: 1 written by the policy (trained on), 0 by a tool or environment
        ("turns", pa.list_(pa.struct([("role", pa.string()), ("text", pa.string()), ("start", pa.int32()), ("end", pa.int32())]))),
        ("tool_calls", pa.list_(pa.struct([("turn", pa.int32()), ("name", pa.string()), ("arguments", pa.string()),
                                           ("output", pa.string()), ("error", pa.string())]))),
        ("num_turns", pa.int32()),  # policy turns; 1 for a single completion
        ("environment", pa.string()),
        ("environment_rewards", pa.string()),  # JSON object: the environment's reward parts summed over the episode
        ("image_ids", pa.list_(pa.string())),  # the prompt's images (prompts.image_ids); [] for text
        # Why the prompt was chosen (rollouts.selection): its pass rate over the earlier rounds when chosen (null: not seen,
        # or not read by a uniform selection) and how many of its completions were scored then
        ("prior_pass_rate", pa.float64()),
        ("prior_samples", pa.int32()),
    ]
)
EPISODE_COLUMNS = ("completion_mask", "turns", "tool_calls", "num_turns", "environment", "environment_rewards")

EVALUATION = pa.schema(
    [
        ("checkpoint", pa.string()),  # asset key, e.g. "r02/checkpoint"
        ("checkpoint_id", pa.string()),
        ("mode", pa.string()),  # "greedy" or "sampled"
        ("accuracy", pa.float64()),  # share of completions the correctness reward scores 1
        ("reward_mean", pa.float64()),  # mean weighted total reward of the completions
        ("pass_at_k", pa.float64()),  # share of prompts with a correct completion among their n_samples
        ("correctness", pa.string()),  # the reward function whose 1.0 counts as correct
        ("n_prompts", pa.int32()),
        ("n_samples", pa.int32()),
        ("mean_completion_tokens", pa.float64()),
        ("temperature", pa.float64()),
        ("seed", pa.int64()),
        ("tool_call_rate", pa.float64()),  # episodes with at least one tool call; null without tools
        ("correct_per_prompt", pa.list_(pa.int32())),  # correct completions of each held-out prompt, in prompt order
        ("gain", pa.float64()),  # accuracy minus r00's in the same mode (paired: same prompts, same seed)
        ("gain_se", pa.float64()),  # its paired standard error; null for r00 or evaluations made before it was recorded
    ]
)

_REWARDS_BASE = [
    ("round", pa.int32()),
    ("prompt_id", pa.string()),
    ("sample_idx", pa.int32()),
    ("policy_id", pa.string()),
    ("reward", pa.float64()),  # weighted total
    ("reward_config_hash", pa.string()),
    ("rollouts_hash", pa.string()),
]


def rewards_schema(function_names: list[str]) -> pa.Schema:
    """The rewards table: the rollout key, the total, then one `score_<name>` column per function."""
    return pa.schema(_REWARDS_BASE + [(f"score_{name}", pa.float64()) for name in function_names])


def reward_function_names(rewards: pa.Table) -> list[str]:
    """The reward functions a rewards table has a `score_<name>` column for."""
    return [c.removeprefix("score_") for c in rewards.column_names if c.startswith("score_")]


def _tagged(schema: pa.Schema, name: str) -> pa.Schema:
    version = TABLE_VERSIONS.get(name, SCHEMA_VERSION)
    return schema.with_metadata({b"rl_assets.schema": name.encode(), b"rl_assets.schema_version": str(version).encode()})


def _single_turn(table: pa.Table) -> pa.Table:
    """A rollouts table of v3 (single completions) as v5: no episode columns but one turn each, no images."""
    for name in EPISODE_COLUMNS:
        column = pa.array([1] * table.num_rows, pa.int32()) if name == "num_turns" else pa.nulls(table.num_rows, ROLLOUTS.field(name).type)
        table = table.append_column(ROLLOUTS.field(name), column)
    return _text_only(table)


def _evaluation_columns(table: pa.Table) -> pa.Table:
    """An evaluation table of v3 or v4 as v5: the columns added since are null (not recorded then)."""
    for field in EVALUATION:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.select(EVALUATION.names)


def _text_only(table: pa.Table) -> pa.Table:
    """A raw_data or prompts table of v3 (rollouts: v4) as now: every row text only (no image ids)."""
    return table.append_column(pa.field("image_ids", pa.list_(pa.string())), pa.array([[]] * table.num_rows, pa.list_(pa.string())))


def _unselected(table: pa.Table) -> pa.Table:
    """A rollouts table of v5 as v6: why each prompt was chosen was not recorded (null)."""
    return table.append_column(ROLLOUTS.field("prior_pass_rate"), pa.nulls(table.num_rows, pa.float64())) \
                .append_column(ROLLOUTS.field("prior_samples"), pa.nulls(table.num_rows, pa.int32()))


_UPGRADES = {("rollouts", "3"): lambda t: _unselected(_single_turn(t)), ("rollouts", "4"): lambda t: _unselected(_text_only(t)),
             ("rollouts", "5"): _unselected, ("raw_data", "3"): _text_only, ("prompts", "3"): _text_only,
             ("evaluation", "3"): _evaluation_columns, ("evaluation", "4"): _evaluation_columns}


def write_table(table: pa.Table, path: str | Path, schema: pa.Schema, name: str, lineage: dict | None = None) -> Path:
    """Cast `table` to `schema` and write it atomically; returns the path.

    `lineage` (e.g. the content hashes of the code that made the table) is kept in the file's
    metadata, where `table_lineage` reads it back.
    """
    missing = set(schema.names) - set(table.column_names)
    if missing:
        raise ValueError(f"{path}: table {name!r} lacks columns {sorted(missing)}")
    table = table.select(schema.names).cast(schema)
    metadata = dict(_tagged(schema, name).metadata)
    if lineage:
        metadata[LINEAGE_KEY] = json.dumps(lineage, sort_keys=True).encode()
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp)
    return Path(path)


LINEAGE_KEY = b"rl_assets.eval.lineage"


def table_lineage(path: str | Path) -> dict:
    """What `write_table` recorded about how the table was made ({} for a table written without it)."""
    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[LINEAGE_KEY]) if LINEAGE_KEY in meta else {}


def read_table(path: str | Path, name: str) -> pa.Table:
    """Read a table written by `write_table`, checking it carries schema `name` at our version."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: table {name!r} not found; materialize the asset that writes it first")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:  # random bytes, a cut-off file: name it, whatever pyarrow says
        raise ValueError(f"{path}: not a readable Parquet file, it is corrupt or cut off ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200]}); `rl-assets run` makes it again") from error
    meta = table.schema.metadata or {}
    found = meta.get(b"rl_assets.schema", b"?").decode()
    version = meta.get(b"rl_assets.schema_version", b"?").decode()
    expected = str(TABLE_VERSIONS.get(name, SCHEMA_VERSION))
    if found == name and (name, version) in _UPGRADES:
        return _UPGRADES[(name, version)](table)
    if found != name or version != expected:
        raise ValueError(f"{path}: expected table {name!r} v{expected}, found {found!r} v{version}")
    return table
