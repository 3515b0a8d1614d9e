# Adapter: rule baseline_max -> memopt.results.alias_cell
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.results import alias_cell  # noqa: E402
from memopt.scripting import logged  # noqa: E402

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    alias_cell(Path(sm.input[0]), Path(sm.output[0]), "max")
