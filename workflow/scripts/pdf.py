# Adapter: rule pdf -> memopt.paper_format.build_pdf
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.paper_format import build_pdf  # noqa: E402
from memopt.scripting import logged  # noqa: E402

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    build_pdf(Path(sm.input.tex), Path(sm.output[0]))
