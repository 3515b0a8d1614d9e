# Training rules hold a GPU: --resources gpu=N runs N at once, each on a GPU it leases
# (memopt.runtime.lease: concurrent jobs never share one). On SLURM (profiles/slurm) the executor asks for
# that GPU (--gpus=1, or --gpus=<gpu_model>:1 with the config's gpu_model). A parallel technique's
# search and cells hold its `gpus` GPUs (memopt.runtime.parallel), so gpu=N counts GPUs, not jobs.


# The search job first runs the technique's exactness run (results/exactness/): one process, one
# Python/torch/CUDA start for both.
rule search:
    output:
        search="results/search/{technique}.json",
        exactness="results/exactness/{technique}.json",
    input:
        TOKENS,
        code=code("search"),
    params:
        study=search_params,
        spec=technique_spec,
    resources:
        **TECHNIQUE_RESOURCES,
    threads: 4
    log:
        "logs/search/{technique}.log",
    benchmark:
        "results/benchmarks/search/{technique}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/search.py"


# A technique's `max` cell comes after its `same` cell: where both are one batch (always for the
# baseline, often near the cap), it is that run written again (measured_as: same), not a second one.
rule cell:
    output:
        "results/cells/{technique}/{batch}.json",
    input:
        TOKENS,
        own=rules.search.output.search,
        baseline=f"results/search/{STUDY['baseline']}.json",
        same=lambda w: (
            f"results/cells/{w.technique}/same.json" if w.batch == "max" and "same" in BATCHES else []
        ),
        code=code("cell"),
    params:
        study=TRAIN_PARAMS,
        spec=technique_spec,
    resources:
        **TECHNIQUE_RESOURCES,
    threads: 4
    log:
        "logs/cell/{technique}/{batch}.log",
    benchmark:
        "results/benchmarks/cell/{technique}/{batch}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/cell.py"


# One quality run per function and seed: the function's fastest exact kernel, quality.tokens at
# quality.batch (memopt.jobs.quality).
rule quality:
    output:
        "results/quality/{function}/{seed}.json",
    input:
        TOKENS,
        code=code("quality"),
    params:
        study=QUALITY_PARAMS,
        techniques=lambda w: Params({t: STUDY["techniques"][t] for t in FUNCTIONS[w.function]}),
    resources:
        **TRAIN_RESOURCES,
    threads: 4
    log:
        "logs/quality/{function}/{seed}.log",
    benchmark:
        "results/benchmarks/quality/{function}/{seed}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/quality.py"


# One target per technique: `snakemake --cores all --resources gpu=1 technique_flash` (its search
# and exactness run, its cells and the quality runs of its function).
for _name in TECHNIQUES:

    rule:
        name:
            f"technique_{_name}"
        input:
            f"results/search/{_name}.json",
            f"results/exactness/{_name}.json",
            expand("results/cells/{technique}/{batch}.json", technique=_name, batch=BATCHES),
            [q for q in QUALITY if q.split("/")[2] in {f for f, m in FUNCTIONS.items() if _name in m}],
