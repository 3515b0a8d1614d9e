# Adapter: rule figures -> memopt.report.figures.make_figures
from pathlib import Path

from memopt.report.figures import make_figures
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    make_figures(
        Path(sm.input.summary),
        Path(sm.output[0]).parent,
        search_paths=[Path(p) for p in sm.input.searches],
        quality_paths=[Path(p) for p in sm.input.quality],
        baseline=sm.params.baseline,
        margin=sm.params.margin,
        processes=sm.threads,
    )
