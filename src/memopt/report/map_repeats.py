"""A map study's repeats (tools/gpu_study.sh STUDY_REPEATS, published beside its results as
repeats/POINT/rN/TECHNIQUE.json): cells at a point's maxima run again at the same batch, on one
GPU, to show how far one cell's tokens/s moves from run to run, with and without cudaMalloc
retries. The papers' noise rule (memopt.report.noise) is read against them: its allowance for a
cell that retried (RETRY_NOISE) against how far such a cell moved, and every cell's runs against
each other by the rule itself."""

from __future__ import annotations

from pathlib import Path

from memopt.fileio import read_json
from memopt.report.noise import rel_interval, retries, within_noise


def _run(cell: dict) -> dict | None:
    """One timed run: its tokens/s, retries, 95% interval, timed steps and GPU (None: not timed)."""
    tps = cell.get("tokens_per_s")
    if cell.get("status") != "ok" or not tps:
        return None
    return {"tokens_per_s": tps, "alloc_retries": retries(cell), "rel_ci95": rel_interval(cell),
            "timed_steps": cell.get("timed_steps"),
            "gpu": (cell.get("provenance") or {}).get("gpu_uuid")}  # fmt: skip


def _tps(run: dict) -> float:
    return run["tokens_per_s"]


def _spread(runs: list[dict]) -> float:
    """The largest run's tokens/s over the smallest's, less 1 (0.034: 3.4%)."""
    tps = [r["tokens_per_s"] for r in runs]
    return max(tps) / min(tps) - 1


def repeat_spread(repeats: Path, results: Path, retry_noise: float) -> dict | None:
    """Per repeated cell its runs and their spread on the repeats' card (with the point's own run,
    results/map/POINT/cells/TECHNIQUE/max.json, where it ran on that card) and with the own run
    wherever it ran; the largest spreads on one card where a cell retried and where it did not;
    None where there are no repeats. A ratio compares two cells of one point, so of one card:
    `below` says whether the noise rule holds on the repeats, every retried cell moved by at most
    `retry_noise` on that card and every cell's fastest and slowest runs there are within noise of
    each other (for a cell that never retried: within their 95% intervals added)."""
    files = sorted(Path(repeats).glob("*/r*/*.json"))
    if not files:
        return None
    groups: dict[tuple[str, str], list[dict]] = {}
    for f in files:
        run = _run(read_json(f))
        if run is not None:
            groups.setdefault((f.parent.parent.name, f.stem), []).append(run)
    cells = []
    for (point, technique), runs in groups.items():
        own_path = Path(results) / "map" / point / "cells" / technique / "max.json"
        own = _run(read_json(own_path)) if own_path.exists() else None
        every = runs + ([own] if own else [])
        elsewhere = bool(own and own["gpu"] not in {r["gpu"] for r in runs})
        card = runs if elsewhere or not own else every  # the runs on the repeats' card
        cells.append({
            "point": point, "technique": technique, "runs": runs, "own": own,
            "retried": any(retries(r) > 0 for r in card),
            "spread": _spread(card) if len(card) > 1 else None,
            "within": len(card) < 2 or within_noise(max(card, key=_tps), min(card, key=_tps)),
            "with_own": _spread(every) if own else None, "own_elsewhere": elsewhere,
        })  # fmt: skip
    if not cells:
        return None

    def most(retried: bool, key: str):
        values = [c[key] for c in cells if c["retried"] == retried and c[key] is not None]
        return max(values) if values else None

    retried_max, clean_max = most(True, "spread"), most(False, "spread")
    return {
        "cells": cells, "points": sorted({c["point"] for c in cells}),
        "n_runs": min(len(c["runs"]) for c in cells),
        "gpus": sorted({r["gpu"] for c in cells for r in c["runs"] if r["gpu"]}),
        "retried_max": retried_max, "clean_max": clean_max,
        "with_own_max": max((c["with_own"] for c in cells if c["with_own"] is not None), default=None),
        "own_elsewhere": any(c["own_elsewhere"] for c in cells),
        "below": (retried_max is None or retried_max <= retry_noise)
                 and all(c["within"] for c in cells),
    }  # fmt: skip
