# Adapter: rules search and map_search (no exactness run) -> memopt.jobs.pipeline.search_file (in the warm worker, memopt.run.worker)
from pathlib import Path

from memopt.config import validate_config
from memopt.run.worker import run_job

sm = snakemake  # noqa: F821
study = dict(sm.params.study, techniques={sm.wildcards.technique: sm.params.spec})
args = dict(
    cfg=study,
    technique=sm.wildcards.technique,
    tokens_dir=str(Path(sm.input[0]).parent),
    out=sm.output.search,
    threads=sm.threads,
    exactness_out=sm.output.get("exactness"),
)
run_job(validate_config(sm.config)["worker"], "search_file", args, sm.log[0])
