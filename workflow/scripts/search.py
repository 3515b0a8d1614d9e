# Adapter: rule search -> memopt.pipeline.search_file
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.pipeline import search_file  # noqa: E402
from memopt.scripting import logged  # noqa: E402

sm = snakemake  # noqa: F821
study = dict(sm.params.study, techniques={sm.wildcards.technique: sm.params.spec})
with logged(sm.log[0]):
    search_file(
        study,
        sm.wildcards.technique,
        Path(sm.input[0]).parent,
        Path(sm.output.search),
        threads=sm.threads,
        exactness_out=Path(sm.output.exactness),
    )
