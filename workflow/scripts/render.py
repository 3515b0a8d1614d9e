# Adapter: rule render -> memopt.paper.render_paper
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.paper import render_paper  # noqa: E402
from memopt.scripting import logged  # noqa: E402

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
