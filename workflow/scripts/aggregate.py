# Adapter: rule aggregate -> memopt.results.aggregate
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.results import aggregate  # noqa: E402
from memopt.scripting import logged  # noqa: E402
from memopt.verdicts import aggregate_quality  # noqa: E402

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    aggregate([Path(p) for p in sm.input.cells], Path(sm.output.summary))
    aggregate_quality([Path(p) for p in sm.input.quality], Path(sm.output.quality))
