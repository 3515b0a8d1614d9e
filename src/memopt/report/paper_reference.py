"""The paper's comparison with earlier public reports (paper/reference.yaml): their own ratios
against their baseline next to ours, never their absolute numbers."""

from __future__ import annotations

import re
from pathlib import Path

import yaml


def ratio(a, b):
    """a / b, or None when either is missing (or b is zero)."""
    return a / b if a is not None and b else None


def _reported(row: dict) -> tuple[float, str] | None:
    """A reported peak memory as (number, unit), from the raw text ("18,401 MB")."""
    match = re.match(r"\s*([\d,.]+)\s*(\S+)", str(row.get("peak_memory_raw") or ""))
    return (float(match.group(1).replace(",", "")), match.group(2)) if match else None


def reference_comparison(
    reference_path: Path | None, relative: list[dict], searches: list[dict], baseline: str
) -> dict:
    """Earlier reports' own ratios (speed-up, memory reduction, maximum batch against their
    baseline, at their baseline's batch) next to ours at the `same` batch. Absolute numbers are
    not compared: the reports used other GPUs, models and settings."""
    if reference_path is None or not Path(reference_path).exists():
        return {"reports": [], "rows": []}
    reports = (yaml.safe_load(Path(reference_path).read_text()) or {}).get("reports", [])
    ours = {r["technique"]: r for r in relative if r["batch_entry"] == "same"}
    our_max = {s["technique"]: s["max_batch"] for s in searches}
    base_max = our_max.get(baseline)
    rows = []
    for report in reports:
        results = report.get("results", [])
        base = next(
            (
                r
                for r in results
                if r.get("memopt") == baseline and r.get("batch") in ("same", None)
            ),
            None,
        )
        if base is None:
            continue
        base_peak = _reported(base)
        seen = set()
        for r in results:
            name = r.get("memopt")
            if not name or name == baseline or name in seen:
                continue
            if r.get("batch_size") != base.get("batch_size"):
                continue
            seen.add(name)
            peak = _reported(r)
            same_unit = peak and base_peak and peak[1] == base_peak[1]
            rows.append(
                {
                    "report": report["id"],
                    "gpu": report.get("gpu"),
                    "technique": name,
                    "batch_size": r.get("batch_size"),
                    "speedup": r.get("speedup_vs_baseline"),
                    "memory_reduction_pct": 100 * (1 - peak[0] / base_peak[0])
                    if same_unit
                    else None,
                    "max_batch_ratio": ratio(r.get("max_batch"), base.get("max_batch")),
                    "our_speedup": ours.get(name, {}).get("speedup"),
                    "our_speedup_tf32": ours.get(name, {}).get("speedup_tf32"),
                    "our_memory_reduction_pct": ours.get(name, {}).get("memory_reduction_pct"),
                    "our_max_batch_ratio": ratio(our_max.get(name), base_max),
                }
            )
    cited = [
        {
            key: r.get(key)
            for key in ("id", "title", "author", "source", "gpu", "comparability", "shortfall")
        }
        for r in reports
        if any(x["report"] == r["id"] for x in rows)
    ]
    return {"reports": cited, "rows": rows}
