# Adapter: rule map_figures -> memopt.report.map_figures (each figure as .pdf and .png)
from pathlib import Path

import pandas as pd

from memopt.report import map_figures
from memopt.report.figures_style import render_all

sm = snakemake  # noqa: F821
table = pd.read_csv(sm.input.table)
builders = {
    "map_tokens_by_size": lambda: map_figures.tokens_by_size(table),
    "map_tokens_by_length": lambda: map_figures.tokens_by_length(table),
    "map_memory_shares": lambda: map_figures.memory_shares(table, sm.params.reference),
}
render_all(builders, Path(sm.output[0]).parent, processes=sm.threads)
