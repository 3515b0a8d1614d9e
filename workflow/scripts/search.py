# Adapter: rule search -> memopt.pipeline.search_file (in the warm worker, memopt.worker)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.config import validate_config  # noqa: E402
from memopt.worker import run_job  # noqa: E402

sm = snakemake  # noqa: F821
study = dict(sm.params.study, techniques={sm.wildcards.technique: sm.params.spec})
args = dict(
    cfg=study,
    technique=sm.wildcards.technique,
    tokens_dir=str(Path(sm.input[0]).parent),
    out=sm.output.search,
    threads=sm.threads,
    exactness_out=sm.output.exactness,
)
run_job(validate_config(sm.config)["worker"], "search_file", args, sm.log[0])
