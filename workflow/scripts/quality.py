# Adapter: rule quality -> memopt.jobs.pipeline.quality_file (in the warm worker, memopt.run.worker)
from pathlib import Path

from memopt.config import validate_config
from memopt.run.worker import run_job

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
