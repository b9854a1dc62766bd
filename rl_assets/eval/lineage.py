"""Walk a checkpoint back to its raw data, using DuckDB over the Parquet files and lineage cards.

There is no second copy of the lineage: each step reads what the previous one names (a card's
table hashes, the rollouts' policy and prompt ids, the prompts' raw sources and images) and checks that
the files on disk still have the hashes that were recorded (an image's id is its hash).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from rl_assets.core.checkpoints import read_lineage, read_retired, retired_words
from rl_assets.core.paths import DATA, IMAGES, checkpoint_key, data_dir_of, output_path, round_prefix
from rl_assets.data.images import image_id, stored_image
from rl_assets.data.raw_data import labelled_location
from rl_assets.core.storage import content_hash


def _hash_status(path: Path, recorded: str | None) -> str:
    if not path.exists():
        return "missing"
    return "ok" if recorded is None or content_hash(path) == recorded else "changed since recorded"


def _checkpoint_status(path: Path, card: dict, child: dict | None, root: Path) -> str:
    """ok, or why the folder is not the checkpoint its card names, or not the parent the child checkpoint was trained from."""
    from rl_assets.core.verify import changed

    if child is not None and card["checkpoint_id"] != child["parent"]:
        return f"not the parent of {child['path']}: that was trained from {child['parent'][:12]}, this is {card['checkpoint_id'][:12]}"
    if (note := read_retired(path)) is not None:
        return retired_words(note) if note.get("checkpoint_id") == card["checkpoint_id"] else "retired, and its note names another checkpoint"
    return "changed since recorded" if changed(path, card["checkpoint_id"], root) else "ok"


def problems(steps: list[dict]) -> list[str]:
    """Every file of the trace that is missing, changed, unreadable or not what its child names: `lineage` exits 1 on any."""
    found = []
    for step in steps:
        for part in (step, *(step[t] for t in ("rollouts", "rewards", "critic") if t in step)):
            status = part.get("status", "ok")
            if (status != "ok" and not status.startswith("retired on")) or part.get("error"):  # retired: removed on purpose
                found.append(f"{part['path']}: {status if status != 'ok' else part['error']}")
    return found


def _query(connection, sql: str, path: Path, step: dict):
    """One row about a table, or None (with the step's status saying why) when it is missing or unreadable."""
    if not path.is_file():
        return None
    try:
        return connection.execute(sql, [str(path)]).fetchone()
    except duckdb.Error as error:
        step["error"] = f"unreadable: {str(error).splitlines()[0]}"
        return None


def trace_checkpoint(checkpoint: str | Path, root: Path = Path("."), data: Path | None = None) -> list[dict]:
    """Steps from `checkpoint` back to r00, then its prompts and raw sources, newest first.

    The earlier rounds and the tables are those of the data folder `data` (paths.data_dir), by default the one the
    checkpoint lies in (data/experiments/x/r02/checkpoint: data/experiments/x), else data/.
    """
    steps, path = [], Path(checkpoint)
    data = data if data is not None else data_dir_of(path) or root / DATA
    connection = duckdb.connect()
    if read_lineage(path).get("kind") == "critic":  # a value model: its own chain, then the policies that sampled its tables
        steps, path = _trace_critic(path, root, data)
    while True:
        card = read_lineage(path)
        step = {"kind": "checkpoint", "path": str(path), "checkpoint_id": card["checkpoint_id"], "round": card["round"],
                "algorithm": card["algorithm"], "parent": card["parent"], "params_hash": card["params_hash"],
                "code_version": card["code_version"],
                "status": _checkpoint_status(path, card, steps[-1] if steps and steps[-1]["kind"] == "checkpoint" else None, root)}
        steps.append(step)
        round_number = card["round"]
        if round_number == 0:
            break
        prefix = round_prefix(round_number)
        rollouts, rewards = output_path(f"{prefix}/rollouts", data), output_path(f"{prefix}/rewards", data)
        trained = card["trained_on"]
        step["rollouts"] = {"path": str(rollouts), "hash": trained["rollouts"], "status": _hash_status(rollouts, trained["rollouts"])}
        step["rewards"] = {"path": str(rewards), "hash": trained["rewards"], "status": _hash_status(rewards, trained["rewards"])}
        if "critic" in trained:  # ppo: the value model whose estimates gave this round's advantages
            step["critic"] = _value_model_step(trained["critic"], round_number, data, root)
        row = _query(connection, "select count(*), count(distinct prompt_id), any_value(policy_id), any_value(seed), "
                     "any_value(prompts_hash) from read_parquet(?)", rollouts, step["rollouts"])
        if row:
            step["rollouts"].update(rows=row[0], prompts=row[1], sampled_by=row[2], seed=row[3], prompts_hash=row[4])
        row = _query(connection, "select avg(reward), any_value(reward_config_hash) from read_parquet(?)", rewards, step["rewards"])
        if row:
            step["rewards"].update(mean=row[0], reward_config_hash=row[1])
        path = output_path(checkpoint_key(round_number - 1), data)

    prompts = output_path("prompts", data)
    used = [str(output_path(f"{round_prefix(n)}/rollouts", data)) for n in range(1, steps[0]["round"] + 1)]
    used = [u for u in used if Path(u).is_file()]
    step = {"kind": "prompts", "path": str(prompts), "status": _hash_status(prompts, card["trained_on"].get("prompts"))}  # card is r00's here
    if prompts.is_file():
        try:
            sources = connection.execute(
                "select source, source_hash, count(*) as rows, count(*) filter (where prompt_id in (select prompt_id from read_parquet(?))) "
                "from read_parquet(?) group by all order by source", [used or [str(prompts)], str(prompts)]).fetchall()
            step["sources"] = [{"source": s, "source_hash": h, "rows": n, "rows_in_rollouts": k if used else 0} for s, h, n, k in sources]
        except duckdb.Error as error:
            step["error"] = f"unreadable: {str(error).splitlines()[0]}"
    steps.append(step)
    if (images := _images_step(connection, prompts, used, data)) is not None:
        steps.append(images)
    for source in step.get("sources", []):
        raw_path = labelled_location(source["source"], root) or root / source["source"]
        steps.append({"kind": "raw", "path": str(raw_path), "hash": source["source_hash"], "status": _hash_status(raw_path, source["source_hash"])})
    return steps


def _images_step(connection, prompts: Path, used: list[str], data: Path) -> dict | None:
    """The images of the prompts the rounds sampled (of every prompt before a round), each file re-hashed against its id;
    None for text-only prompts."""
    import pyarrow.parquet as pq

    try:
        if not prompts.is_file() or "image_ids" not in pq.read_schema(prompts).names:
            return None  # written before prompts carried images
        ids = [row[0] for row in connection.execute(
            "select distinct unnest(image_ids) from read_parquet(?) where prompt_id in (select prompt_id from read_parquet(?)) order by 1",
            [str(prompts), used or [str(prompts)]]).fetchall()]
    except (duckdb.Error, OSError, ValueError):
        return None  # the prompts step already says the table is unreadable
    if not ids:
        return None
    folder = data / IMAGES
    missing, changed = [], []
    for identifier in ids:
        path = stored_image(folder, identifier)
        if path is None:
            missing.append(identifier[:12])
        elif image_id(path.read_bytes()) != identifier:
            changed.append(path.name)
    words = ([f"{len(missing)} missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"] if missing else []) + \
            ([f"{len(changed)} changed since recorded ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''})"] if changed else [])
    return {"kind": "images", "path": str(folder), "images": len(ids), "status": "; ".join(words) or "ok"}


def _value_model_step(critic_id: str, round_number: int, data: Path, root: Path) -> dict:
    """Where the value model with `critic_id` that round `round_number` read lies: rNN-1/critic, or in round 1 r00 or the reward model."""
    candidates = [output_path(f"{round_prefix(round_number - 1)}/critic", data)] if round_number > 1 else \
        [output_path(checkpoint_key(0), data), output_path("reward_model", data)]
    for candidate in candidates:
        card = candidate / "lineage.json"
        if card.is_file() and json.loads(card.read_text()).get("checkpoint_id") == critic_id:
            return {"path": str(candidate), "checkpoint_id": critic_id, "status": _checkpoint_status(candidate, read_lineage(candidate), None, root)}
    return {"path": str(candidates[0]), "checkpoint_id": critic_id, "status": "missing"}


def _trace_critic(path: Path, root: Path, data: Path) -> tuple[list[dict], Path]:
    """The value model's steps back to where it started (r00's body or the reward model), and the checkpoint that sampled
    its own round's tables (rNN-1/checkpoint), from which the policy walk continues."""
    steps, top = [], None
    while True:
        card = read_lineage(path)
        if card.get("kind") != "critic":
            steps.append({"kind": "critic_start", "path": str(path), "checkpoint_id": card["checkpoint_id"],
                          "status": _checkpoint_status(path, card, steps[-1] if steps else None, root)})
            break
        top = top or card["round"]
        prefix = round_prefix(card["round"])
        rollouts, rewards = output_path(f"{prefix}/rollouts", data), output_path(f"{prefix}/rewards", data)
        trained = card["trained_on"]
        steps.append({"kind": "critic", "path": str(path), "checkpoint_id": card["checkpoint_id"], "round": card["round"],
                      "parent": card["parent"], "params_hash": card["params_hash"], "code_version": card["code_version"],
                      "status": _checkpoint_status(path, card, steps[-1] if steps else None, root),
                      "rollouts": {"path": str(rollouts), "hash": trained["rollouts"], "status": _hash_status(rollouts, trained["rollouts"])},
                      "rewards": {"path": str(rewards), "hash": trained["rewards"], "status": _hash_status(rewards, trained["rewards"])}})
        path = root / card["parent_path"]
    return steps, output_path(checkpoint_key(top - 1), data)


def format_trace(steps: list[dict]) -> str:
    """The trace as an indented text tree for the terminal."""
    lines = []
    for step in steps:
        if step["kind"] == "checkpoint":
            lines.append(f"{step['path']}  id={step['checkpoint_id'][:12]}  {step['algorithm']}  parent={step['parent'][:40]}  "
                         f"params={step['params_hash']}  code={step['code_version']}  [{step['status']}]")
            if "critic" in step:
                info = step["critic"]
                lines.append(f"  └─ advantages from {info['path']}  id={info['checkpoint_id'][:12]}  [{info['status']}]")
            for table in ("rollouts", "rewards"):
                if table in step:
                    info = step[table]
                    extra = {k: v for k, v in info.items() if k not in {"path", "hash", "status"}}  # includes "error" if unreadable
                    lines.append(f"  └─ {info['path']}  md5={info['hash'][:12]}  [{info['status']}]  {json.dumps(extra, default=str)}")
        elif step["kind"] in ("critic", "critic_start"):
            what = f"value model, round {step['round']}" if step["kind"] == "critic" else "value model started from"
            lines.append(f"{step['path']}  id={step['checkpoint_id'][:12]}  {what}  [{step['status']}]")
            for table in ("rollouts", "rewards"):
                if table in step:
                    lines.append(f"  └─ {step[table]['path']}  md5={step[table]['hash'][:12]}  [{step[table]['status']}]")
        elif step["kind"] == "prompts":
            lines.append(f"{step['path']}  [{step['status']}]")
            for source in step.get("sources", []):
                lines.append(f"  └─ {source['source']}  md5={source['source_hash'][:12]}  rows={source['rows']}  used in rollouts={source['rows_in_rollouts']}")
        elif step["kind"] == "images":
            lines.append(f"{step['path']}  {step['images']} images, each named by its SHA-256  [{step['status']}]")
        else:
            lines.append(f"{step['path']}  md5={step['hash'][:12]}  [{step['status']}]")
    return "\n".join(lines)


# View name -> files it reads; union_by_name because rounds may score with different reward functions.
TABLE_VIEWS = {
    "raw_data": "read_parquet('{data}/raw_data.parquet')",
    "prompts": "read_parquet('{data}/prompts.parquet')",
    "rollouts": "read_parquet('{data}/r*/rollouts.parquet', union_by_name=true)",
    "rewards": "read_parquet('{data}/r*/rewards.parquet', union_by_name=true)",
    "evaluation": "read_parquet('{data}/evaluation.parquet')",
    "checkpoints": "read_json_auto('{data}/r*/checkpoint/lineage.json', union_by_name=true, filename=true)",
    "promotions": "read_json_auto('{models}/history.jsonl')",
}


def connect_tables(data: Path = DATA, models: Path = Path("models")) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per table of the data folder `data` (paths.data_dir) that exists on disk
    (`select * from rewards`), and the promotion history in `models`."""
    connection = duckdb.connect()
    for name, source in TABLE_VIEWS.items():
        relation = source.format(data=Path(data).as_posix(), models=Path(models).as_posix())
        try:
            connection.execute(f"create view {name} as select * from {relation}")
        except duckdb.Error:  # no such files yet (e.g. before the first round), or one that cannot be read
            if broken := _unreadable(connection, relation):  # a query of it fails naming the file, not "does not exist"
                message = f"table {name}: {broken}".replace("'", "''")
                connection.execute(f"create view {name} as select 1 as unreadable from range(1) where error('{message}') is null")
    for name, query in EPISODE_VIEWS.items():
        try:
            connection.execute(f"create view {name} as {query}")
        except duckdb.Error:
            continue  # no rollouts yet, or only tables written before episodes (no such columns)
    return connection


def _unreadable(connection, relation: str) -> str | None:
    """The first file of a view's relation that DuckDB cannot read, and why (None when no file matches it)."""
    import glob
    import re

    pattern = re.search(r"read_\w+\('([^']+)'", relation).group(1)
    reader = "read_parquet" if relation.startswith("read_parquet") else "read_json_auto"
    for path in sorted(glob.glob(pattern)):
        try:
            connection.execute(f"select * from {reader}(?) limit 0", [path])
        except duckdb.Error as error:
            return f"{path} is unreadable ({str(error).splitlines()[0][:200]}); `rl-assets run` makes it again"
    return None


# Episodes (rollouts with tools or an environment), one row each, and per round: how often the policy called a tool,
# how many turns an episode took, how many calls failed and how many episodes a limit cut off.
EPISODE_VIEWS = {
    "episodes": """select round, prompt_id, sample_idx, policy_id, environment, num_turns, truncated, completion,
                          len(coalesce(tool_calls, [])) as tool_calls,
                          len(list_filter(coalesce(tool_calls, []), lambda c: c.error is not null)) as tool_errors,
                          list_sum(completion_mask) as policy_tokens, len(completion_ids) as tokens, environment_rewards
                   from rollouts where environment is not null""",
    "episode_stats": """select round, count(*) as episodes, avg((tool_calls > 0)::int) as tool_call_rate, avg(num_turns) as turns_per_episode,
                               sum(tool_errors) / nullif(sum(tool_calls), 0) as tool_error_share, avg(truncated::int) as truncated_share,
                               sum(policy_tokens) / sum(tokens) as policy_token_share
                        from episodes group by round order by round""",
}
