"""Result files: atomic JSON helpers, and the aggregation of cell JSONs into one tidy summary.csv.

A cell JSON is written by the training step (one technique x batch entry); this module only reads
them, checks that every field the summary needs is present, and flattens them into rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from memopt.errors import MemoptError
from memopt.fileio import read_json, write_json, write_text  # noqa: F401  (re-exported)
from memopt.knobs import KNOBS
from memopt.report.steady import instability, median_interval

# Top-level keys every cell JSON must carry (values may be null, e.g. timings of an oom cell).
CELL_KEYS = """
    technique batch_entry batch_size status spec function kernel kernel_detail device device_name
    steps warmup_steps timed_steps seq_len tokens_per_step step_time_ms timed_s warmup_s
    allocator_events tokens_per_s model_tflops mfu wall_s peak_allocated_mib peak_reserved_mib
    phase_memory memory_breakdown loss_curve error
""".split()
SPEC_KEYS = [k.name for k in KNOBS if k.required]
# Knobs added later: a cell written before them ran with these values.
LATER_SPEC_KEYS = {k.name: k.default for k in KNOBS if not k.required}
STEP_TIME_STATS = ["mean", "median", "std", "p10", "p90", "ci95_half", "rel_ci95"]
ALLOCATOR_KEYS = ["alloc_retries", "ooms", "device_allocs", "device_frees"]
# Provenance is optional per key (older cells may lack some); copied so the paper can cite it.
PROVENANCE_KEYS = """
    torch python cuda cudnn gpu driver flash_attn git_commit config_hash memopt host gpu_uuid
""".split()
# Memory read after each phase of one step, and its breakdown (see memopt.runtime.step.measured_step).
PHASE_KEYS = [
    f"{when}_{phase}_mib"
    for phase in ("forward", "backward", "optimizer")
    for when in ("after", "peak")
]
BREAKDOWN_KEYS = (
    "weights gradients optimizer_state activations logits logits_grad offloaded".split()
)
# ok; oom: out of memory; diverged: the training loss became non-finite (memopt.runtime.divergence).
STATUSES = ("ok", "oom", "diverged")
# The paper's figures (memopt.report.figures writes each as .pdf and .png; the workflow and the paper
# name them from here).
FIGURE_NAMES = (
    "memory",
    "throughput",
    "memory_batch",
    "speed_batch",
    "loss",
    "tradeoff",
    "windows",
    "phases",
    "max_batch",
    "positions",
)


# Column order of summary.csv: identity, spec, setup, timing, memory, quality, provenance.
SUMMARY_COLUMNS = (
    ["technique", "batch_entry", "batch_size", "effective_batch", "status", "measured_as"]
    + ["function"]
    + SPEC_KEYS
    + list(LATER_SPEC_KEYS)
    + "kernel kernel_detail device device_name steps warmup_steps timed_steps seq_len".split()
    + ["tokens_per_step"]
    + [f"step_time_ms_{stat}" for stat in STEP_TIME_STATS]
    + ["step_time_ms_median_lo", "step_time_ms_median_hi", "unstable"]
    + "timed_s warmup_s".split()
    + [f"allocator_{key}" for key in ALLOCATOR_KEYS]
    + "tokens_per_s model_tflops mfu wall_s peak_allocated_mib peak_reserved_mib".split()
    + [f"phase_{key}" for key in PHASE_KEYS]
    + [f"{key}_mib" for key in BREAKDOWN_KEYS]
    + ["error", "diverged_step"]
    + [f"provenance_{key}" for key in PROVENANCE_KEYS]
)
# Integer columns that may hold nulls (batch_size of an oom cell, window): kept as Int64 so the
# CSV says 8, not 8.0.
INT_COLUMNS = "batch_size effective_batch window checkpoint_every loss_chunk grad_accum gpus steps"
INT_COLUMNS += " warmup_steps timed_steps seq_len diverged_step"
INT_COLUMNS = INT_COLUMNS.split()
INT_COLUMNS += ["tokens_per_step"] + [f"allocator_{key}" for key in ALLOCATOR_KEYS]


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


def alias_cell(source: Path, out: Path, entry: str) -> dict:
    """Write the cell `source` again as batch entry `entry`: for an entry at the same batch (the
    baseline's `max` is its `same`; near the cap a technique's may be too), measured once."""
    cell = read_cell(Path(source))
    cell = {**cell, "batch_entry": entry, "measured_as": cell["batch_entry"]}
    write_json(out, cell)
    return cell


def cell_row(cell: dict) -> dict:
    """Flatten one (checked) cell into a summary row keyed by SUMMARY_COLUMNS."""
    step_time = cell["step_time_ms"] or {}
    provenance = cell.get("provenance") or {}
    row = {key: cell[key] for key in ("technique", "batch_entry", "batch_size", "status")}
    row.update({key: cell["spec"][key] for key in SPEC_KEYS})
    row.update({key: cell["spec"].get(key, value) for key, value in LATER_SPEC_KEYS.items()})
    times = cell.get("step_times_ms") or []
    row["step_time_ms_median_lo"], row["step_time_ms_median_hi"] = median_interval(times)
    row["unstable"] = instability(times)
    retries = (cell.get("allocator_events") or {}).get("alloc_retries")
    if row["unstable"] and retries:  # the slow path the spread comes from, when it was taken
        times_word = "once" if retries == 1 else f"{retries} times"
        timed = cell.get("timed_steps") or len(times)
        row["unstable"] += f"; cudaMalloc retried {times_word} in its {timed} timed steps"
    for key in SUMMARY_COLUMNS:
        if key in row:
            continue
        if key.startswith("step_time_ms_"):
            row[key] = step_time.get(key.removeprefix("step_time_ms_"))
        elif key.startswith("provenance_"):
            row[key] = provenance.get(key.removeprefix("provenance_"))
        elif key.startswith("allocator_"):
            row[key] = (cell["allocator_events"] or {}).get(key.removeprefix("allocator_"))
        elif key.startswith("phase_"):
            row[key] = (cell["phase_memory"] or {}).get(key.removeprefix("phase_"))
        elif key.endswith("_mib") and key.removesuffix("_mib") in BREAKDOWN_KEYS:
            row[key] = (cell["memory_breakdown"] or {}).get(key)
        elif key in ("measured_as", "diverged_step"):  # only where they apply
            row[key] = cell.get(key)
        elif key == "effective_batch":  # micro-batch x grad_accum (older cells: the batch)
            b = cell["batch_size"]
            row[key] = cell.get(key, None if b is None else b * row["grad_accum"])
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


def ok_cells(cells: list[dict], entry: str = "same") -> dict[str, dict]:
    """The cells of batch entry `entry` that trained (status ok), by technique, in study order:
    the view every comparison at one batch starts from."""
    return {c["technique"]: c for c in cells if c["batch_entry"] == entry and c["status"] == "ok"}


def _change(cell: dict, ref: dict) -> dict:
    """Speed-up and memory reduction of `cell` against `ref` (quality: memopt.report.verdicts.quality_table)."""
    return {
        "speedup": cell["tokens_per_s"] / ref["tokens_per_s"],
        "memory_reduction_pct": 100 * (1 - cell["peak_allocated_mib"] / ref["peak_allocated_mib"]),
    }


def relative_to_baseline(cells: list[dict], baseline: str) -> list[dict]:
    """Every ok cell against the baseline's `same` cell (the baseline at its maximum batch)."""
    ref = ok_cells(cells).get(baseline)
    if ref is None:
        return []
    return [
        {
            "technique": c["technique"],
            "batch_entry": c["batch_entry"],
            "batch_size": c["batch_size"],
            **_change(c, ref),
        }
        for c in cells
        if c["status"] == "ok" and c["technique"] != baseline
    ]


def capped_techniques(searches: list[dict]) -> frozenset:
    """The techniques whose search stopped at its cap: their maximum is a lower bound."""
    return frozenset(s["technique"] for s in searches if s.get("status") == "capped")


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, speed) points no other point beats: less or equal memory AND more or equal
    speed, better in at least one. Sorted by memory ascending; identical points are all kept."""
    frontier = [
        p for p in points if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points)
    ]
    return sorted(frontier)


def stopped_at_time_limit(cells: list[dict], measure_cfg: dict) -> list[dict]:
    """The runs whose timing stopped at measure.max_timed_s, short of the step cap and of the
    interval target (so their interval is wider than the target); a `max` entry measured as its
    `same` run is that run, counted once."""
    limit_s = measure_cfg.get("max_timed_s")
    if limit_s is None:
        return []
    return [
        c
        for c in cells
        if not c.get("measured_as")
        and c.get("timed_s") is not None
        and c["timed_s"] >= limit_s
        and c["timed_steps"] < measure_cfg["max_timed_steps"]
        and (c.get("step_time_ms_rel_ci95") or 0) > measure_cfg["target_rel_ci"]
    ]
