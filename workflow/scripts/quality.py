# Adapter: rule quality -> memopt.pipeline.quality_file
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.pipeline import quality_file  # noqa: E402
from memopt.scripting import logged  # noqa: E402

sm = snakemake  # noqa: F821
study = dict(sm.params.study, techniques=dict(sm.params.techniques))
with logged(sm.log[0]):
    quality_file(
        study,
        sm.wildcards.function,
        int(sm.wildcards.seed),
        Path(sm.input[0]).parent,
        Path(sm.output[0]),
        threads=sm.threads,
    )
