# memopt: corpus -> tokenizer -> tokens -> max-batch search -> cells -> summary -> figures -> paper.
# Each rule's logic is one function in src/memopt/; the scripts in workflow/scripts are adapters.
#   snakemake --cores all --resources gpu=1                            the default study (GPU)
#   snakemake --cores all --resources gpu=1 --configfile config/smoke.yaml   the CPU smoke study
# See README.md for targets, offline use and what every config key means.


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/paper.smk"


# Every result the paper is made of, not only the paper: Snakemake skips a missing intermediate
# file when what is built from it looks up to date, so a result lost to a crash or deleted by hand
# would stay lost. Asking for all of them makes a plain rerun rebuild whatever is missing.
rule all:
    default_target: True
    input:
        SEARCHES,
        EXACTNESS,
        CELLS,
        QUALITY,
        "results/summary.csv",
        "results/quality.csv",
        FIGURES,
        PAPER,
