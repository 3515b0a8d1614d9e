# Adapter: rule render -> memopt.report.paper.render_paper
from pathlib import Path

from memopt.report.paper import render_paper
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    render_paper(
        Path(sm.input.summary),
        [Path(p) for p in sm.input.searches],
        Path(sm.input.corpus),
        Path(sm.input.tokens),
        sm.params.study,
        Path(sm.input.figures[0]).parent,
        Path(sm.params.templates),
        Path(sm.output.md),
        Path(sm.output.tex),
        benchmark_paths=[Path(p) for p in sm.input.benchmarks],
        reference_path=Path(sm.input.reference),
        quality_csv=Path(sm.input.quality),
        exactness_paths=[Path(p) for p in sm.input.exactness],
    )
