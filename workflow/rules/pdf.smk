# paper.pdf: part of `all` where a TeX engine is installed; without one, asking for it explains.
rule pdf:
    output:
        "paper/paper.pdf",
    input:
        tex="paper/paper.tex",  # the study's render rule: render, or map_render in a map study
        figures=PAPER_FIGURES,
        code=code("pdf"),
    log:
        "logs/pdf.log",
    benchmark:
        "results/benchmarks/pdf.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/pdf.py"


# The paper alone, from the results present: `snakemake --cores 1 paper`.
rule paper:
    input:
        PAPER,
