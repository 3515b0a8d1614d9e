# Adapter: rules cell and map_cell (at `max`) -> memopt.jobs.pipeline.cell_file (in the warm worker, memopt.run.worker)
from pathlib import Path

from memopt.config import validate_config
from memopt.run.worker import run_job

sm = snakemake  # noqa: F821
# worker and mixed_gpus from the config, not rule parameters: changing them reruns nothing.
settings = validate_config(sm.config)
study = dict(
    sm.params.study,
    techniques={sm.wildcards.technique: sm.params.spec},
    mixed_gpus=settings["mixed_gpus"],
)
args = dict(
    cfg=study,
    technique=sm.wildcards.technique,
    entry=sm.wildcards.get("batch", "max"),
    tokens_dir=str(Path(sm.input[0]).parent),
    search_dir=str(Path(sm.input.own).parent),
    out=sm.output[0],
    threads=sm.threads,
    same_cell=sm.input.get("same") or None,  # for `max`: the same cell, reused when the batch is equal
)
run_job(settings["worker"], "cell_file", args, sm.log[0])
