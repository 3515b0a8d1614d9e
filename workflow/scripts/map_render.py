# Adapter: rule map_render -> memopt.report.map_paper.render_map_paper
from pathlib import Path

from memopt.report.map_paper import render_map_paper
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    render_map_paper(
        Path(sm.input.table),
        Path(sm.input.findings),
        [Path(p) for p in sm.input.searches],
        Path(sm.input.corpus),
        Path(sm.input.tokens),
        sm.params.study,
        Path(sm.input.figures[0]).parent,
        Path(sm.params.templates),
        Path(sm.output.md),
        Path(sm.output.tex),
    )
