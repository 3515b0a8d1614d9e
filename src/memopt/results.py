"""Result files: atomic JSON helpers, and the aggregation of cell JSONs into one tidy summary.csv.

A cell JSON is written by the training step (one technique x batch entry); this module only reads
them, checks that every field the summary needs is present, and flattens them into rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from memopt.errors import MemoptError
from memopt.fileio import read_json, write_json, write_text  # noqa: F401  (re-exported)

# Top-level keys every cell JSON must carry (values may be null, e.g. timings of an oom cell).
CELL_KEYS = """
    technique batch_entry batch_size status spec kernel device device_name steps warmup_steps
    timed_steps seq_len tokens_per_step step_time_ms tokens_per_s wall_s peak_allocated_mib
    peak_reserved_mib val_loss val_ppl final_train_loss loss_curve error
""".split()
SPEC_KEYS = ["precision", "attention", "window", "checkpointing", "checkpoint_every", "compile"]
STEP_TIME_STATS = ["mean", "median", "std", "p10", "p90"]
# Provenance is optional per key (older cells may lack some); copied so the paper can cite it.
PROVENANCE_KEYS = ["torch", "python", "cuda", "gpu", "git_commit", "config_hash", "memopt"]
STATUSES = ("ok", "oom")

# Column order of summary.csv: identity, spec, setup, timing, memory, quality, provenance.
SUMMARY_COLUMNS = (
    ["technique", "batch_entry", "batch_size", "status"]
    + SPEC_KEYS
    + "kernel device device_name steps warmup_steps timed_steps seq_len tokens_per_step".split()
    + [f"step_time_ms_{stat}" for stat in STEP_TIME_STATS]
    + "tokens_per_s wall_s peak_allocated_mib peak_reserved_mib".split()
    + "val_loss val_ppl final_train_loss error".split()
    + [f"provenance_{key}" for key in PROVENANCE_KEYS]
)
# Integer columns that may hold nulls (batch_size of an oom cell, window): kept as Int64 so the
# CSV says 8, not 8.0.
INT_COLUMNS = "batch_size window checkpoint_every steps warmup_steps timed_steps seq_len".split()
INT_COLUMNS += ["tokens_per_step"]


def read_cell(path: Path) -> dict:
    """Read one cell JSON and check the keys the summary relies on."""
    cell = read_json(path)
    if not isinstance(cell, dict):
        raise MemoptError(f"{path}: a cell JSON must be an object")
    for key in CELL_KEYS:
        if key not in cell:
            raise MemoptError(f"{path}: cell JSON lacks required key '{key}'")
    if cell["status"] not in STATUSES:
        raise MemoptError(f"{path}: status is {cell['status']!r}, expected one of {STATUSES}")
    spec = cell["spec"]
    if not isinstance(spec, dict):
        raise MemoptError(f"{path}: 'spec' must be an object")
    for key in SPEC_KEYS:
        if key not in spec:
            raise MemoptError(f"{path}: cell JSON lacks required key 'spec.{key}'")
    step_time = cell["step_time_ms"]
    if cell["status"] == "ok":
        if not isinstance(step_time, dict):
            raise MemoptError(f"{path}: an ok cell needs 'step_time_ms' as an object")
        for stat in STEP_TIME_STATS:
            if stat not in step_time:
                raise MemoptError(f"{path}: cell JSON lacks required key 'step_time_ms.{stat}'")
    return cell


def cell_row(cell: dict) -> dict:
    """Flatten one (checked) cell into a summary row keyed by SUMMARY_COLUMNS."""
    step_time = cell["step_time_ms"] or {}
    provenance = cell.get("provenance") or {}
    row = {key: cell[key] for key in ("technique", "batch_entry", "batch_size", "status")}
    row.update({key: cell["spec"][key] for key in SPEC_KEYS})
    for key in SUMMARY_COLUMNS:
        if key.startswith("step_time_ms_"):
            row[key] = step_time.get(key.removeprefix("step_time_ms_"))
        elif key.startswith("provenance_"):
            row[key] = provenance.get(key.removeprefix("provenance_"))
        elif key not in row:
            row[key] = cell[key]
    row["batch_entry"] = str(row["batch_entry"])  # "8" and 8 name the same entry
    return row


def entry_sort_key(entry: str) -> tuple:
    """same, max, then fixed batch sizes ascending: the order the paper discusses them in."""
    named = {"same": 0, "max": 1}
    if entry in named:
        return (named[entry], 0, "")
    return (2, int(entry), "") if entry.isdigit() else (3, 0, entry)


def aggregate(cell_paths: list[Path], out_csv: Path) -> pd.DataFrame:
    """Collect cell JSONs into one tidy row per cell and write out_csv atomically.

    Rows keep the order in which techniques first appear in cell_paths (the config order, as the
    workflow passes them), then entries as same, max, numbers ascending.
    """
    rows = [cell_row(read_cell(Path(p))) for p in cell_paths]
    seen = set()
    for row in rows:
        key = (row["technique"], row["batch_entry"])
        if key in seen:
            raise MemoptError(f"two cell JSONs for technique {key[0]!r}, batch entry {key[1]!r}")
        seen.add(key)
    technique_rank = {t: i for i, t in enumerate(dict.fromkeys(r["technique"] for r in rows))}
    rows.sort(key=lambda r: (technique_rank[r["technique"]], entry_sort_key(r["batch_entry"])))
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    for col in INT_COLUMNS:
        frame[col] = frame[col].astype("Int64")
    write_text(out_csv, frame.to_csv(index=False))
    return frame


def read_summary(summary_csv: Path) -> pd.DataFrame:
    """Read summary.csv back with the same dtypes aggregate wrote (entries stay strings)."""
    summary_csv = Path(summary_csv)
    if not summary_csv.exists():
        raise MemoptError(f"{summary_csv}: summary not found (run the aggregate step first)")
    frame = pd.read_csv(summary_csv, dtype={"batch_entry": str, "technique": str})
    missing = [c for c in ("technique", "batch_entry", "status") if c not in frame.columns]
    if missing:
        raise MemoptError(f"{summary_csv}: missing column(s) {', '.join(missing)}")
    return frame


def loss_curves(cell_paths: list[Path]) -> dict[tuple[str, str], list[float]]:
    """Per-step training loss of each cell, keyed by (technique, batch entry); oom cells give []."""
    curves = {}
    for path in cell_paths:
        cell = read_cell(Path(path))
        curves[(cell["technique"], str(cell["batch_entry"]))] = list(cell["loss_curve"] or [])
    return curves
