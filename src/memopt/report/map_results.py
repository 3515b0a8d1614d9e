"""A map study's results as one table (results/map.csv): per point and technique, the proven
maximum batch in sequences and tokens, peak memory per token from the search's fit, and the
timing cell at the maximum (tokens/s, model TFLOP/s, peak memory and its breakdown by kind)."""

from __future__ import annotations

from pathlib import Path

from memopt.fileio import read_json
from memopt.runtime.flops import param_count

BREAKDOWN = ("weights", "gradients", "optimizer_state", "activations", "logits")
MAP_COLUMNS = (
    ["point", "model", "arch", "params", "seq_len", "technique", "search_status", "limit",
     "max_batch", "max_tokens", "trials", "search_s", "per_token_mib", "fixed_mib"]
    + ["cell_status", "tokens_per_s", "model_tflops", "mfu", "peak_allocated_mib"]
    + [f"{kind}_mib" for kind in BREAKDOWN]
)  # fmt: skip


def _limit(search: dict) -> str | None:
    """What stopped the batch from growing: memory (the GPU's, or a CPU's budget), host (pinned
    memory for offloaded activations), data (the training tokens) or cap (search.max_batch)."""
    if search["status"] == "capped":
        return "data" if search.get("cap_from", "data") == "data" else "cap"
    misses = [
        t for t in search["trials"] if not t["fits"] and t["batch"] == search["first_failing_batch"]
    ]
    error = (misses[0].get("error") or "") if misses else ""
    return "host" if "host memory" in error else "memory"


def map_row(point: str, model_name: str, model: dict, vocab: int, search: dict, cell: dict) -> dict:
    fit = search.get("fit") or {}
    seq = model["seq_len"]
    ok = cell.get("status") == "ok"
    breakdown = cell.get("memory_breakdown") or {}
    return {
        "point": point, "model": model_name, "arch": model["arch"],
        "params": param_count(model, vocab), "seq_len": seq, "technique": search["technique"],
        "search_status": search["status"], "limit": _limit(search),
        "max_batch": search["max_batch"], "max_tokens": search["max_batch"] * seq,
        "trials": len(search["trials"]), "search_s": search["seconds"],
        "per_token_mib": fit["per_sample_mib"] / seq if fit.get("per_sample_mib") else None,
        "fixed_mib": fit.get("fixed_mib"),
        "cell_status": cell.get("status"),
        "tokens_per_s": cell.get("tokens_per_s") if ok else None,
        "model_tflops": cell.get("model_tflops") if ok else None,
        "mfu": cell.get("mfu") if ok else None,
        "peak_allocated_mib": cell.get("peak_allocated_mib") if ok else None,
        **{f"{k}_mib": breakdown.get(f"{k}_mib") if ok else None for k in BREAKDOWN},
    }  # fmt: skip


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
