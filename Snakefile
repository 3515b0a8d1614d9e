# memopt: corpus -> tokenizer -> tokens -> max-batch search -> cells -> summary -> figures -> paper.
# Each rule's logic is one function in src/memopt/; the scripts in workflow/scripts are adapters.
#   snakemake --cores all --resources gpu=1                            the default study (GPU)
#   snakemake --profile profiles/smoke                                 the CPU smoke study (runs/smoke/)
# See docs/running.md for targets and offline use, docs/configuration.md for every config key.


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
# A map study's rules exist only in a map study (forcing one elsewhere would write an empty map);
# it has its own aggregation, figures and paper in place of the default study's.
if MAP_POINTS:

    include: "workflow/rules/map.smk"

else:

    include: "workflow/rules/paper.smk"


include: "workflow/rules/pdf.smk"


# Before the first job: this folder is this study's (claimed for it), and the study's device is
# here when training jobs run locally (memopt.run.study_run). Not in a dry run.
onstart:
    try:
        if workflow.local_exec:
            planned = {job.rule.name for job in workflow.dag.needrun_jobs()}
            check_device_here(STUDY, planned, sys.argv)
        claim_folder(STUDY["study"], Path.cwd())
    except ConfigError as err:
        sys.exit(f"memopt: {err}")


# Every result the paper is made of, not only the paper: Snakemake skips a missing intermediate
# file when what is built from it looks up to date, so a result lost to a crash or deleted by hand
# would stay lost. Asking for all of them makes a plain rerun rebuild whatever is missing.
# A map study's: its points' searches and cells, their table and figures (workflow/rules/map.smk).
rule all:
    default_target: True
    input:
        MAP_SEARCHES + MAP_CELLS + ["results/map.csv", "results/map_findings.json"] + MAP_FIGURES + PAPER
        if MAP_POINTS
        else [],
        SEARCHES if not MAP_POINTS else [],
        EXACTNESS if not MAP_POINTS else [],
        CELLS if not MAP_POINTS else [],
        QUALITY if not MAP_POINTS else [],
        ["results/summary.csv", "results/quality.csv"] + FIGURES + PAPER if not MAP_POINTS else [],
