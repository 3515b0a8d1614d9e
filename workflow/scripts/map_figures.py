# Adapter: rule map_figures -> memopt.report.map_figures (each figure as .pdf and .png)
from pathlib import Path

import pandas as pd

from memopt.report.figures_style import render_all
from memopt.report.map_figures import builders

sm = snakemake  # noqa: F821
table = pd.read_csv(sm.input.table)
render_all(builders(table, sm.params.reference), Path(sm.output[0]).parent, processes=sm.threads)
