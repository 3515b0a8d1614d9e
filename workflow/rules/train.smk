# Training rules hold the GPU: run with --resources gpu=1 so they never share it.


rule search:
    output:
        "results/search/{technique}.json",
    input:
        TOKENS,
        code=TRAIN_CODE,
    params:
        study=TRAIN_PARAMS,
        spec=lambda w: STUDY["techniques"][w.technique],
    resources:
        gpu=1,
    threads: 4
    log:
        "logs/search/{technique}.log",
    benchmark:
        "results/benchmarks/search/{technique}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/search.py"


rule cell:
    output:
        "results/cells/{technique}/{batch}.json",
    input:
        TOKENS,
        own=rules.search.output,
        baseline=f"results/search/{STUDY['baseline']}.json",
        code=TRAIN_CODE,
    params:
        study=TRAIN_PARAMS,
        spec=lambda w: STUDY["techniques"][w.technique],
    resources:
        gpu=1,
    threads: 4
    log:
        "logs/cell/{technique}/{batch}.log",
    benchmark:
        "results/benchmarks/cell/{technique}/{batch}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/cell.py"


# The baseline's `max` batch is its `same` batch by definition: one training run serves both.
if {"same", "max"} <= set(BATCHES):

    rule baseline_max:
        output:
            f"results/cells/{STUDY['baseline']}/max.json",
        input:
            f"results/cells/{STUDY['baseline']}/same.json",
        log:
            "logs/cell/baseline_max.log",
        benchmark:
            f"results/benchmarks/cell/{STUDY['baseline']}/max.tsv"
        conda:
            CONDA_ENV
        script:
            "../scripts/alias_cell.py"

    ruleorder: baseline_max > cell


# One target per technique: `snakemake --cores all --resources gpu=1 technique_flash`.
for _name in TECHNIQUES:

    rule:
        name:
            f"technique_{_name}"
        input:
            expand("results/cells/{technique}/{batch}.json", technique=_name, batch=BATCHES),
