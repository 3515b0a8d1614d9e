# Adapter: rule aggregate -> memopt.report.results.aggregate
from pathlib import Path

from memopt.report.results import aggregate
from memopt.report.verdicts import aggregate_quality
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    aggregate([Path(p) for p in sm.input.cells], Path(sm.output.summary))
    aggregate_quality([Path(p) for p in sm.input.quality], Path(sm.output.quality))
