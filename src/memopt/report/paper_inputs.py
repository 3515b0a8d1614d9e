"""The default paper's inputs, read from a study's results: the summary's cells, the searches,
the quality runs, the cells' provenance and techniques, and the FLOP figures the paper states
(memopt.report.paper builds its context from them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from memopt.errors import MemoptError
from memopt.knobs import KNOBS
from memopt.report.map_results import search_limit
from memopt.report.results import INT_COLUMNS, read_json, read_summary
from memopt.runtime.flops import matmul_params

PROVENANCE_KEYS = (
    "git_commit",
    "config_hash",
    "torch",
    "python",
    "cuda",
    "cudnn",
    "gpu",
    "driver",
    "flash_attn",
    "memopt",
)


def flops_summary(model_cfg: dict, vocab_size: int, cells: list[dict]) -> dict:
    """What the paper states about model FLOPs: the matmul weights N_matmul of the formula in
    memopt.runtime.flops.flops_per_token, the FLOPs per token a full-attention cell was credited with,
    and the peak the cells' MFU divides by (both recovered from the cells' own numbers)."""
    ok = [c for c in cells if c["status"] == "ok" and c.get("model_tflops") and c["tokens_per_s"]]
    full = [c for c in ok if c["window"] is None]
    with_mfu = [c for c in ok if c.get("mfu")]
    return {
        "n_matmul": matmul_params(model_cfg, vocab_size),
        "per_token": full[0]["model_tflops"] * 1e12 / full[0]["tokens_per_s"] if full else None,
        "peak_tflops": with_mfu[0]["model_tflops"] / with_mfu[0]["mfu"] if with_mfu else None,
    }


def _clean(value):
    """NaN -> None and numpy scalars -> Python, so templates can test `is none`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _cells(summary_csv: Path) -> list[dict]:
    rows = read_summary(summary_csv).to_dict(orient="records")
    cells = []
    for row in rows:
        cell = {key: _clean(value) for key, value in row.items()}
        for key in INT_COLUMNS:
            if cell.get(key) is not None:
                cell[key] = int(cell[key])
        cells.append(cell)
    return cells


def _search(path: Path) -> dict:
    search = read_json(path)
    for key in ("technique", "status", "max_batch", "cap", "trials"):
        if key not in search:
            raise MemoptError(f"{path}: search JSON lacks required key '{key}'")
    failed = [t["batch"] for t in search["trials"] if not t["fits"]]
    fit = search.get("fit") or {}
    out = {
        **search,
        "n_trials": len(search["trials"]),
        "first_failing_batch": min(failed) if failed else None,
        "fixed_mib": fit.get("fixed_mib"),
        "per_sample_mib": fit.get("per_sample_mib"),
        "predicted_batch": search.get("predicted_batch"),
        "prediction_error": search.get("prediction_error"),
    }
    return {**out, "limit": search_limit(out)}  # memory, host (offload's pinned memory), data, cap


def _provenance(cells: list[dict]) -> dict:
    """Distinct provenance values over all cells (one commit expected; hashes may differ)."""
    return {
        key: sorted(
            {str(c[f"provenance_{key}"]) for c in cells if c.get(f"provenance_{key}") is not None}
        )
        for key in PROVENANCE_KEYS
    }


def _other_knobs(c: dict) -> str:
    """The knobs the technique table has no column for, where they are not at their default."""
    return "; ".join(filter(None, (k.labels(c) for k in KNOBS)))


def _techniques(cells: list[dict]) -> list[dict]:
    """One entry per technique with its knobs and the attention kernels that actually ran."""
    out = {}
    for c in cells:
        t = out.setdefault(
            c["technique"],
            {
                "name": c["technique"],
                "precision": c["precision"],
                "attention": c["attention"],
                "window": c["window"],
                "checkpointing": c["checkpointing"],
                "checkpoint_every": c["checkpoint_every"],
                "compile": bool(c["compile"]),
                "loss": c["loss"],
                "loss_chunk": c["loss_chunk"],
                "optimizer": c["optimizer"]
                + (" in backward" if c["optimizer_in_backward"] else ""),
                "grad_accum": c["grad_accum"],
                "other": _other_knobs(c),
                "knobs": {k.name: k.value_in(c) for k in KNOBS},  # the values: facts, not labels
                "kernels": [],
            },
        )
        if c["kernel"] is not None and c["kernel"] not in t["kernels"]:
            t["kernels"].append(c["kernel"])
    for t in out.values():  # FlexAttention is always compiled, on its own
        t["compiled"] = (
            "yes" if t["compile"] else "attention only" if "flex" in t["kernels"] else "no"
        )
    return list(out.values())


def _quality_runs(quality_csv: Path | None) -> list[dict]:
    if quality_csv is None or not Path(quality_csv).exists():
        return []
    import pandas as pd

    frame = pd.read_csv(quality_csv)
    runs = [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
    for run in runs:  # loss by position: JSON in quality.csv (absent in runs from before it)
        run["val_positions"] = (
            json.loads(run["val_positions"]) if run.get("val_positions") else None
        )
    return runs
