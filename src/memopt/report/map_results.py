"""A map study's results as one table (results/map.csv): per point and technique, the proven
maximum batch in sequences and tokens, peak memory per token from the search's fit, and the
timing cell at the maximum (tokens/s, model TFLOP/s, peak memory and its breakdown by kind);
and the findings computed from it (results/map_findings.json): for each technique against the
map's reference, where along each axis it starts to train at least PAYS times the reference's
tokens per step and stays there at every larger value measured, or that it does not; and, where a
technique's maximum is the reference's batch, its tokens/s against the reference's there."""

from __future__ import annotations

from pathlib import Path

from memopt.fileio import read_json
from memopt.report.noise import RETRY_NOISE, SPEED_BASIS, pair_noise, retries
from memopt.runtime.blocks import technique_model
from memopt.runtime.flops import param_count

PAYS = 1.10  # "pays": at least 10% more tokens per step than the reference
# Table 2's marks (and docs/results.md's) for a maximum that is not the GPU's memory's
LIMIT_MARKS = {"host": "h", "data": "d", "cap": "c"}
# What each mark says (Table 2's caption lists those its cells carry)
LIMIT_WHY = {"host": "the host's pinned memory, not the GPU's, stopped the batch",
             "data": "the training data did", "cap": "the search's cap did"}  # fmt: skip


def was_timed(row: dict) -> bool:
    """Whether a cell was timed (its tokens/s: None or NaN where it was not)."""
    v = row.get("tokens_per_s")
    return v is not None and v > 0


def retried(row: dict) -> bool:
    """Whether a cell's timed steps retried cudaMalloc (NaN, None: not timed, or not known)."""
    return retries(row) > 0


# The map's figures (memopt.report.map_figures draws each as .pdf and .png; the workflow and the
# map paper name them from here).
MAP_FIGURE_NAMES = ("map_tokens_by_size", "map_tokens_by_length", "map_memory_shares")
# the step's memory by kind (memopt.runtime.measure's breakdown): for an eager BF16 step they sum
# to its allocated peak within about 1%, the logits' gradient being the backward's transient
BREAKDOWN = ("weights", "gradients", "optimizer_state", "activations", "logits", "logits_grad")
MAP_COLUMNS = (
    ["point", "model", "arch", "params", "seq_len", "technique", "search_status", "limit",
     "max_batch", "max_tokens", "trials", "search_s", "per_token_mib", "fixed_mib"]
    + ["cell_status", "tokens_per_s", "model_tflops", "mfu", "rel_ci95", "timed_steps",
       "alloc_retries", "peak_allocated_mib", "free_mib", "step_spread"]
    + [f"{kind}_mib" for kind in BREAKDOWN]
    + ["gpu", "gpu_uuid", "git_commit", "search_gpu_uuid", "search_git_commit"]
)  # fmt: skip


def search_limit(search: dict) -> str | None:
    """What stopped the batch from growing: memory (the GPU's, or a CPU's budget), host (pinned
    memory for offloaded activations), data (the training tokens) or cap (search.max_batch)."""
    if search["status"] == "capped":
        return "data" if search.get("cap_from", "data") == "data" else "cap"
    misses = [
        t for t in search["trials"] if not t["fits"] and t["batch"] == search["first_failing_batch"]
    ]
    error = (misses[0].get("error") or "") if misses else ""
    return "host" if "offload: activations" in error else "memory"


def map_row(point: str, model_name: str, model: dict, vocab: int, search: dict, cell: dict) -> dict:
    fit = search.get("fit") or {}
    seq = model["seq_len"]
    trained = technique_model(model, search.get("spec") or {})  # its block (memopt.runtime.blocks)
    ok = cell.get("status") == "ok"
    breakdown = cell.get("memory_breakdown") or {}
    row = {
        "point": point, "model": model_name, "arch": trained["arch"],
        "params": param_count(trained, vocab), "seq_len": seq, "technique": search["technique"],
        "search_status": search["status"], "limit": search_limit(search),
        "max_batch": search["max_batch"], "max_tokens": search["max_batch"] * seq,
        "trials": len(search["trials"]), "search_s": search["seconds"],
        "per_token_mib": fit["per_sample_mib"] / seq if fit.get("per_sample_mib") else None,
        "fixed_mib": fit.get("fixed_mib"),
        "cell_status": cell.get("status"),
        "tokens_per_s": cell.get("tokens_per_s") if ok else None,
        "model_tflops": cell.get("model_tflops") if ok else None,
        "mfu": cell.get("mfu") if ok else None,
        # the interval of the mean step, and how often cudaMalloc failed and was retried (the
        # cache flushed, a synchronizing slow path) in the timed steps
        "rel_ci95": (cell.get("step_time_ms") or {}).get("rel_ci95") if ok else None,
        "timed_steps": cell.get("timed_steps") if ok else None,
        "alloc_retries": (cell.get("allocator_events") or {}).get("alloc_retries") if ok else None,
        "peak_allocated_mib": cell.get("peak_allocated_mib") if ok else None,
        # the search's budget left unallocated at the cell's peak, and the cell's slowest timed
        # step over its fastest (a cell that retried cudaMalloc mixes slow and fast steps)
        "free_mib": search["budget_mib"] - cell["peak_allocated_mib"]
        if ok and search.get("budget_mib") and cell.get("peak_allocated_mib") else None,
        "step_spread": max(steps) / min(steps)
        if ok and (steps := cell.get("step_times_ms")) and min(steps) > 0 else None,
        **{f"{k}_mib": breakdown.get(f"{k}_mib") if ok else None for k in BREAKDOWN},
        # where it ran: the cell's GPU and commit, and the search's (a point runs on one GPU)
        **{k: (cell.get("provenance") or {}).get(k) for k in ("gpu", "gpu_uuid", "git_commit")},
        **{f"search_{k}": (search.get("provenance") or {}).get(k) for k in ("gpu_uuid", "git_commit")},
    }  # fmt: skip
    # As the paper splits them (memopt.report.paper_mechanisms): the step's activations hold
    # the logits, which count once, as logits (none kept: 0).
    if row["activations_mib"] is not None and row["logits_mib"] is not None:
        row["logits_mib"] = max(0.0, row["logits_mib"])
        row["activations_mib"] -= row["logits_mib"]
    return row


def map_table(points: dict, models: dict, techniques: list, vocab: int, results: Path):
    """Every point x technique's row, in the config's order, as a pandas DataFrame. `points`:
    point -> its model config; `models`: point -> the model's name in `map.models`."""
    import pandas as pd

    rows = []
    for point, model in points.items():
        for technique in techniques:
            search = read_json(results / "map" / point / "search" / f"{technique}.json")
            cell = read_json(results / "map" / point / "cells" / technique / "max.json")
            rows.append(map_row(point, models[point], model, vocab, search, cell))
    return pd.DataFrame(rows, columns=MAP_COLUMNS)


def starts_to_pay(table, technique: str, reference: str) -> list[dict]:
    """Along each axis (length at each model; size at each length, Llama-style models), the
    first value from which `technique` trains at least PAYS times `reference`'s maximum tokens
    per step at every larger value measured: {axis, at (the fixed value), from (None: never),
    ratio (at `from`), ratios (every value's), one_more (at `from` the technique's maximum is
    one sequence above the reference's: the ratio is the batch's granularity as much as the
    technique)}. A point where the reference fits no batch and the technique does counts as
    paying; where neither fits, the point is left out."""
    out = []
    for axis, fixed, over, subset in (
        ("length", "model", "seq_len", table),
        ("size", "seq_len", "params", table[table["arch"] == "llama"]),
    ):
        for at, group in subset.groupby(fixed, sort=False):
            ratios, more = {}, {}
            for value, rows in group.groupby(over):
                tokens = dict(zip(rows["technique"], rows["max_tokens"]))
                batches = dict(zip(rows["technique"], rows["max_batch"]))
                t, r = tokens.get(technique), tokens.get(reference)
                if t is None or r is None or (t == 0 and r == 0):
                    continue
                ratios[value] = float("inf") if r == 0 else t / r
                more[value] = batches[technique] - batches[reference]
            values = sorted(ratios)
            start = next(
                (v for i, v in enumerate(values) if all(ratios[w] >= PAYS for w in values[i:])),
                None,
            )
            out.append({"axis": axis, "at": at, "from": start, "ratios": ratios,
                        "ratio": None if start is None else ratios[start],
                        "one_more": start is not None and bool(more[start] == 1)})  # fmt: skip
    return out


def aggregate_map(points: dict, models: dict, techniques: list, vocab: int, results: Path,
                  reference: str):  # fmt: skip
    """The map's table -> results/map.csv and its findings -> results/map_findings.json (under
    `results`); the table (a DataFrame)."""
    from memopt.fileio import write_json

    table = map_table(points, models, techniques, vocab, results)
    table.to_csv(results / "map.csv", index=False)
    write_json(results / "map_findings.json", map_findings(table, reference))
    return table


def same_batch_speed(table, technique: str, reference: str) -> list[dict]:
    """Each point where `technique`'s maximum is `reference`'s batch and both cells were timed:
    {point, batch, ratio (its tokens/s over the reference's), noise (the two cells' noises added:
    memopt.report.noise), retried (either cell retried cudaMalloc in its timed steps), both (both
    did)}. Only there is the ratio the technique's knobs alone."""
    out = []
    for point, rows in table.groupby("point", sort=False):
        by = {r["technique"]: r for r in rows.to_dict(orient="records")}
        t, r = by.get(technique), by.get(reference)
        if t is None or r is None or t["max_batch"] != r["max_batch"] or not t["max_batch"]:
            continue
        if not (was_timed(t) and was_timed(r)):
            continue
        out.append({"point": point, "batch": int(t["max_batch"]),
                    "ratio": float(t["tokens_per_s"] / r["tokens_per_s"]), "noise": pair_noise(t, r),
                    "retried": retried(t) or retried(r), "both": retried(t) and retried(r)})  # fmt: skip
    return out


def map_findings(table, reference: str) -> dict:
    """{technique: starts_to_pay(...)} for every technique but the reference, and its
    same_batch_speed(...) (JSON-able)."""
    out, speed = {}, {}
    for technique in dict.fromkeys(table["technique"]):
        if technique != reference:
            speed[technique] = same_batch_speed(table, technique, reference)
            found = starts_to_pay(table, technique, reference)
            out[technique] = [
                {**f, "at": _plain(f["at"]), "from": _plain(f["from"]),
                 "ratio": None if f["ratio"] == float("inf") else f["ratio"],  # the reference fits none
                 "ratios": {str(_plain(k)): (None if v == float("inf") else v) for k, v in f["ratios"].items()}}
                for f in found
            ]  # fmt: skip
    return {"reference": reference, "pays_at": PAYS, "techniques": out,
            "retry_noise": RETRY_NOISE, "speed_basis": SPEED_BASIS,
            "speed": speed}  # fmt: skip


def _plain(value):
    """numpy scalars as Python numbers (JSON)."""
    return value.item() if hasattr(value, "item") else value
