rule aggregate:
    output:
        summary=report("results/summary.csv", caption="../report/summary.rst", category="Results"),
        quality="results/quality.csv",
    input:
        cells=CELLS,
        quality=QUALITY,
        code=code("aggregate"),
    params:
        order=TECHNIQUE_ORDER,  # the tables' row order (the input list's order)
    log:
        "logs/aggregate.log",
    benchmark:
        "results/benchmarks/aggregate.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/aggregate.py"


rule figures:
    output:
        # In `snakemake --report report.html`: the PNGs, one subcategory per figure.
        [
            report(f, caption="../report/figure.rst", category="Figures", subcategory=Path(f).stem)
            if f.endswith(".png")
            else f
            for f in FIGURES
        ],
    input:
        summary=rules.aggregate.output.summary,
        searches=SEARCHES,
        quality=QUALITY,
        code=code("figures"),
    params:
        baseline=STUDY["baseline"],
        margin=STUDY["quality"]["margin"],
    threads: 8  # one figure per process (memopt.report.figures_style.render_all)
    log:
        "logs/figures.log",
    benchmark:
        "results/benchmarks/figures.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/figures.py"


rule render:
    output:
        md="paper/paper.md",
        tex="paper/paper.tex",
    input:
        summary=rules.aggregate.output.summary,
        quality=rules.aggregate.output.quality,
        exactness=EXACTNESS,
        searches=SEARCHES,
        corpus=rules.corpus.output.stats,
        tokens="data/tokens/meta.json",
        figures=FIGURES,
        # every template but the map paper's (map*.j2, map/), the prose/ folder's too
        templates=[
            t
            for t in (ROOT / "paper" / "templates").rglob("*.j2")
            if not t.relative_to(ROOT / "paper" / "templates").parts[0].startswith("map")
        ],
        reference=ROOT / "paper" / "reference.yaml",
        literature=ROOT / "paper" / "literature.yaml",  # the prose's cite(): the References
        benchmarks=STAGE_BENCHMARKS,
        code=code("render"),
    params:
        study=Params(STUDY),
        order=TECHNIQUE_ORDER,
        templates=ROOT / "paper" / "templates",
    log:
        "logs/render.log",
    benchmark:
        "results/benchmarks/render.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/render.py"
