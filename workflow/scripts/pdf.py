# Adapter: rule pdf -> memopt.report.paper_format.build_pdf
from pathlib import Path

from memopt.report.paper_format import build_pdf
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    build_pdf(Path(sm.input.tex), Path(sm.output[0]))
