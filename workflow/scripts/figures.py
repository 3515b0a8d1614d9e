# Adapter: rule figures -> memopt.figures.make_figures
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.figures import make_figures  # noqa: E402
from memopt.scripting import logged  # noqa: E402

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    make_figures(
        Path(sm.input.summary),
        Path(sm.output[0]).parent,
        search_paths=[Path(p) for p in sm.input.searches],
        quality_paths=[Path(p) for p in sm.input.quality],
        baseline=sm.params.baseline,
        processes=sm.threads,
    )
