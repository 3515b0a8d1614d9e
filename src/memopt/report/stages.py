"""Job time per workflow stage, from Snakemake's benchmark files (the paper's stage table)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from memopt.errors import MemoptError

# Workflow stages in the order they run; a Snakemake benchmark file belongs to one by its path:
# results/benchmarks/search/<technique>.tsv (exactness run included), cell/<technique>/<entry>.tsv,
# quality/<function>/<seed>.tsv, or <rule>.tsv for the
# rules below. The paper stage is aggregating and drawing figures: rendering the paper comes after
# its stage table is written (render.tsv, pdf.tsv), so it cannot count itself.
STAGES = ("corpus", "tokenizer", "tokens", "searches", "cells", "quality", "paper")
RULE_STAGES = {
    "corpus": "corpus",
    "tokenizer": "tokenizer",
    "tokens": "tokens",
    "aggregate": "paper",
    "figures": "paper",
}


def stage_benchmarks(benchmark_dir: Path) -> list[Path]:
    """The stage benchmark files under results/benchmarks (not those of rendering the paper)."""
    root = Path(benchmark_dir)
    files = [root / f"{rule}.tsv" for rule in RULE_STAGES]
    files += sorted((root / "search").glob("*.tsv")) + sorted((root / "cell").glob("*/*.tsv"))
    files += sorted((root / "quality").glob("*/*.tsv"))
    return [f for f in files if f.exists()]


def stage_times(benchmark_paths: list[Path]) -> dict:
    """Wall-clock seconds per stage (summed over its jobs) from Snakemake benchmark files, and
    the total. Stages without a file are left out; the total covers only what was recorded."""
    seconds: dict[str, list[float]] = {}
    for path in map(Path, benchmark_paths):
        parts = path.parts
        if len(parts) >= 3 and parts[-3] == "cell":  # cell/<technique>/<entry>.tsv
            stage = "cells"
        elif len(parts) >= 3 and parts[-3] == "quality":  # quality/<function>/<seed>.tsv
            stage = "quality"
        elif len(parts) >= 2 and parts[-2] == "search":  # search/<technique>.tsv
            stage = "searches"
        else:
            stage = RULE_STAGES.get(path.stem)
        if stage is None:
            raise MemoptError(
                f"{path}: not a benchmark of a stage (search/*.tsv, cell/*/*.tsv, quality/*/*.tsv "
                "or one of "
                f"{', '.join(f'{rule}.tsv' for rule in RULE_STAGES)})"
            )
        frame = pd.read_csv(path, sep="\t")
        if "s" not in frame.columns or frame.empty:
            raise MemoptError(f"{path}: a Snakemake benchmark needs a column 's' and one row")
        seconds.setdefault(stage, []).append(float(frame["s"].iloc[0]))
    rows = [
        {"stage": stage, "jobs": len(seconds[stage]), "seconds": math.fsum(seconds[stage])}
        for stage in STAGES
        if stage in seconds
    ]
    # fsum: exact, so the order the files come in cannot move a rounded total.
    total = math.fsum(s for stage in seconds for s in seconds[stage]) if rows else None
    return {"rows": rows, "total_s": total}
