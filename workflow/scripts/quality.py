# Adapter: rule quality -> memopt.pipeline.quality_file (in the warm worker, memopt.worker)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.config import validate_config  # noqa: E402
from memopt.worker import run_job  # noqa: E402

sm = snakemake  # noqa: F821
study = dict(sm.params.study, techniques=dict(sm.params.techniques))
args = dict(
    cfg=study,
    function=sm.wildcards.function,
    seed=int(sm.wildcards.seed),
    tokens_dir=str(Path(sm.input[0]).parent),
    out=sm.output[0],
    threads=sm.threads,
)
run_job(validate_config(sm.config)["worker"], "quality_file", args, sm.log[0])
