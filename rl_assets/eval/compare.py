"""Compare two experiments (or two checkpoints): what made them differ, and how their held-out accuracy differs.

Everything comes from what the runs stored, so it works as well on experiments made on another machine and pulled:
the params and code each output's lineage records (Parquet metadata of the tables, `lineage.json` of the
checkpoints), the raw sources the prompts table names with their hashes, and the evaluation table, whose
`correct_per_prompt` lists each held-out prompt's correct completions in the order of the held-out prompts (the
first `n_prompts` rows of the prompts table's eval split). Differences are paired over the
prompts both evaluated, so what the prompts share (an easy prompt is easy for both) cancels.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl_assets.core.checkpoints import read_lineage
from rl_assets.core.paths import checkpoint_key, output_path
from rl_assets.core.schemas import read_table, table_lineage
from rl_assets.eval.stats import paired_rates


def flatten(params: dict, prefix: str = "") -> dict[str, object]:
    """Nested params as dotted keys.

    >>> flatten({"train": {"learning_rate": 0.001, "dpo": {"beta": 0.1}}, "seed": 0})
    {'train.learning_rate': 0.001, 'train.dpo.beta': 0.1, 'seed': 0}
    """
    flat = {}
    for key, value in params.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(first: dict, second: dict) -> list[tuple[str, object, object]]:
    """(key, first's value, second's value) for every key whose values differ; None where one side lacks the key.

    >>> differences({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4})
    [('b', 2, 3), ('c', None, 4)]
    """
    return [(key, first.get(key), second.get(key)) for key in sorted(first.keys() | second.keys()) if first.get(key) != second.get(key)]


def experiment_record(data: Path) -> dict:
    """What one data folder's outputs record: params (dotted keys), code (file: hash), raw sources (source: hash), the
    held-out prompts in evaluation order, and the evaluation rows by (checkpoint, mode)."""
    from rl_assets.core.config import EvaluationParams
    from rl_assets.eval.evaluation import eval_prompts

    evaluation_path = output_path("evaluation", data)
    if not evaluation_path.is_file():
        raise FileNotFoundError(f"{evaluation_path}: no evaluation table; run the experiment (or pull it) first")
    params, code = {}, {}
    lineages = [table_lineage(path) for path in [output_path(key, data) for key in ("raw_data", "prompts")] + sorted(data.glob("r*/*.parquet"))
                + [evaluation_path] if path.is_file()]
    lineages += [read_lineage(folder) for folder in sorted(data.glob("r*/checkpoint")) + sorted(data.glob("r*/critic"))
                 if (folder / "lineage.json").is_file()]
    for lineage in lineages:
        params.update(flatten(lineage.get("params") or {}))
        for files in (lineage.get("code") or {}).values():
            code.update(files)
    prompts = read_table(output_path("prompts", data), "prompts")
    sources = dict(sorted(set(zip(prompts["source"].to_pylist(), prompts["source_hash"].to_pylist()))))
    rows = {(row["checkpoint"], row["mode"]): row for row in read_table(evaluation_path, "evaluation").to_pylist()}
    # the evaluation took the eval split's first max_prompts rows: as many as its rows counted
    held_out = eval_prompts(prompts, EvaluationParams(max_prompts=max(row["n_prompts"] for row in rows.values())))
    return {"data": data.as_posix(), "experiment": table_lineage(evaluation_path).get("experiment"), "params": params, "code": code,
            "sources": sources, "held_out": held_out.select(["prompt_id", "prompt", "answer"]).to_pylist(), "evaluation": rows}


def _rates(record: dict, checkpoint: str, mode: str) -> dict[str, float] | None:
    row = record["evaluation"].get((checkpoint, mode))
    if row is None or not row.get("correct_per_prompt"):
        return None
    return {p["prompt_id"]: c / row["n_samples"] for p, c in zip(record["held_out"], row["correct_per_prompt"])}


def compare_pair(first: dict, second: dict, pairs: list[tuple[str, str]]) -> dict:
    """The comparison of two records: what differs, and for each (first's checkpoint, second's checkpoint) in `pairs`
    the held-out accuracies and their paired difference per mode; prompts that flipped at the last pair (sampled:
    solved = at least half the samples correct)."""
    report = {"params": differences(first["params"], second["params"]),
              "code": differences(first["code"], second["code"]),
              "sources": differences(first["sources"], second["sources"]), "rows": [], "flipped": []}
    texts = {p["prompt_id"]: p for p in first["held_out"] + second["held_out"]}
    for a, b in pairs:
        for mode in ("greedy", "sampled"):
            rates_a, rates_b = _rates(first, a, mode), _rates(second, b, mode)
            if rates_a is None or rates_b is None:
                continue
            common = [p for p in rates_a if p in rates_b]
            row = {"first": a, "second": b, "mode": mode, "first_accuracy": first["evaluation"][(a, mode)]["accuracy"],
                   "second_accuracy": second["evaluation"][(b, mode)]["accuracy"], "prompts": len(common)}
            if common:
                row["difference"], row["se"] = paired_rates([rates_a[p] for p in common], [rates_b[p] for p in common])
            report["rows"].append(row)
            if mode == "sampled" and (a, b) == pairs[-1]:
                report["flipped"] = [{"prompt_id": p, "prompt": texts[p]["prompt"], "answer": texts[p]["answer"],
                                      "first": rates_a[p], "second": rates_b[p]}
                                     for p in common if (rates_a[p] >= 0.5) != (rates_b[p] >= 0.5)]
    return report


def compare_experiments(first_data: Path, second_data: Path) -> dict:
    """Two experiments round by round (rounds both ran)."""
    first, second = experiment_record(first_data), experiment_record(second_data)
    rounds = sorted({int(c[1:3]) for c, _ in first["evaluation"]} & {int(c[1:3]) for c, _ in second["evaluation"]})
    if not rounds:
        raise ValueError(f"{first_data} and {second_data} have no evaluated round in common")
    report = compare_pair(first, second, [(checkpoint_key(n), checkpoint_key(n)) for n in rounds])
    return {**report, "first_name": first["experiment"] or first["data"], "second_name": second["experiment"] or second["data"]}


def compare_checkpoints(first: Path, second: Path, first_data: Path, second_data: Path) -> dict:
    """Two checkpoints: the params and code files both lineage cards record, and their held-out accuracy where both were
    evaluated the same way (found in their experiments' evaluation tables by checkpoint id)."""
    cards = [read_lineage(first), read_lineage(second)]
    records = [experiment_record(first_data), experiment_record(second_data)]
    names = []
    for card, record in zip(cards, records):
        found = [c for (c, _), row in record["evaluation"].items() if row["checkpoint_id"] == card["checkpoint_id"]]
        if not found:
            raise ValueError(f"checkpoint {card['checkpoint_id'][:12]} is not in {record['data']}'s evaluation table: run its evaluation first")
        names.append(found[0])
    narrowed = [{**record, "params": flatten(card.get("params") or {}),
                 "code": {k: v for files in (card.get("code") or {}).values() for k, v in files.items()}} for record, card in zip(records, cards)]
    report = compare_pair(*narrowed, [tuple(names)])
    # r00's card records the warm start's params and code, a round's its training's: only what both record compares
    for what in ("params", "code"):
        report[what] = [(key, a, b) for key, a, b in report[what] if a is not None and b is not None]
    return {**report, "first_name": f"{names[0]} ({cards[0]['checkpoint_id'][:12]})", "second_name": f"{names[1]} ({cards[1]['checkpoint_id'][:12]})"}


def compare_plot(report: dict, path: Path) -> str:
    """Sampled (and greedy) held-out accuracy of both sides per pair, and the paired difference with ±1 SE; saved at
    `path`, returned as base64 PNG."""
    import base64

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (accuracy, difference) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=100)
    for mode, style in (("sampled", "-"), ("greedy", "--")):
        rows = [r for r in report["rows"] if r["mode"] == mode]
        if not rows:
            continue
        x = list(range(len(rows)))
        accuracy.plot(x, [r["first_accuracy"] for r in rows], "o" + style, color="C0", label=f"A {report['first_name']} {mode}")
        accuracy.plot(x, [r["second_accuracy"] for r in rows], "s" + style, color="C1", label=f"B {report['second_name']} {mode}")
        if mode == "sampled":
            accuracy.set_xticks(x, [r["second"].split("/")[0] for r in rows])
            difference.set_xticks(x, [r["second"].split("/")[0] for r in rows])
        paired = [(i, r["difference"], r["se"]) for i, r in enumerate(rows) if "difference" in r]
        if paired:
            i, mean, se = zip(*paired)
            difference.errorbar(i, mean, yerr=se, fmt="o" + style, color="C2" if mode == "sampled" else "C3", capsize=3, label=mode)
    accuracy.set_ylim(0, 1)
    accuracy.set_title("held-out accuracy", fontsize=9)
    accuracy.legend(fontsize=7)
    difference.axhline(0, color="grey", linewidth=0.8)
    difference.set_title(f"{report['second_name']} − {report['first_name']} (± paired SE)", fontsize=9)
    difference.legend(fontsize=7)
    for axis in (accuracy, difference):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return base64.b64encode(path.read_bytes()).decode()


def compare_text(report: dict) -> str:
    """The comparison as the CLI prints it."""
    a, b = report["first_name"], report["second_name"]
    lines = [f"A = {a}", f"B = {b}", ""]
    short = lambda value: json.dumps(value)[:60] if value is not None else "-"  # noqa: E731
    lines.append(f"params that differ ({len(report['params'])}):" if report["params"] else "params: the same")
    lines += [f"  {key}: {short(x)} -> {short(y)}" for key, x, y in report["params"]]
    changed = report["code"]
    lines.append(f"code that differs ({len(changed)} files):" if changed else "code: the same")
    lines += [f"  {path}: " + ("only in B" if x is None else "only in A" if y is None else f"{x[:8]} -> {y[:8]}") for path, x, y in changed[:20]]
    lines.append(f"raw sources that differ ({len(report['sources'])}):" if report["sources"] else "raw sources: the same")
    lines += [f"  {source}: {(x or '-')[:8]} -> {(y or '-')[:8]}" for source, x, y in report["sources"]]
    lines += ["", f"{'A':<16}{'B':<16}{'mode':<9}{'A acc':>7}{'B acc':>7}{'B - A':>10}{'± SE':>7}{'prompts':>9}"]
    for r in report["rows"]:
        diff = f"{r['difference'] * 100:>+9.1f}p{r['se'] * 100:>6.1f}p" if "difference" in r else f"{'-':>10}{'-':>7}"
        lines.append(f"{r['first']:<16}{r['second']:<16}{r['mode']:<9}{r['first_accuracy']:>7.3f}{r['second_accuracy']:>7.3f}{diff}{r['prompts']:>9}")
    if report["flipped"]:
        gained = sum(f["second"] >= 0.5 for f in report["flipped"])
        lines += ["", f"prompts that flipped at the last row (sampled, solved = half the samples right): {gained} solved only by B, "
                      f"{len(report['flipped']) - gained} only by A"]
        lines += [f"  {'B' if f['second'] >= 0.5 else 'A'} {f['prompt_id'][:10]} {f['first']:.2f} -> {f['second']:.2f}  {f['prompt'][-40:]!r} "
                  f"answer {f['answer']!r}" for f in report["flipped"][:8]]
    return "\n".join(lines)
