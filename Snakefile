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


rule all:
    default_target: True
    input:
        PAPER,
