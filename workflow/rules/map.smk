# A map study (config key `map`, e.g. config/map.yaml): every technique at every point (a model at
# a length): its proven maximum batch, then one timing cell at it. No exactness or quality runs:
# timing and memory only. A point's jobs see the study with the point's model (point_params).


rule map_search:
    output:
        search="results/map/{point}/search/{technique}.json",
    input:
        TOKENS,
        code=code("search"),
    params:
        study=point_params(TRAIN_KEYS),
        spec=technique_spec,
    resources:
        **TECHNIQUE_RESOURCES,
    threads: 4
    log:
        "logs/map/{point}/search/{technique}.log",
    benchmark:
        "results/benchmarks/map/{point}/search/{technique}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/search.py"


rule map_cell:
    output:
        "results/map/{point}/cells/{technique}/max.json",
    input:
        TOKENS,
        own=rules.map_search.output.search,
        code=code("cell"),
    params:
        study=point_params(TRAIN_KEYS),
        spec=technique_spec,
    resources:
        **TECHNIQUE_RESOURCES,
    threads: 4
    log:
        "logs/map/{point}/cells/{technique}.log",
    benchmark:
        "results/benchmarks/map/{point}/cell/{technique}.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/cell.py"


rule map_aggregate:
    output:
        table="results/map.csv",
        findings="results/map_findings.json",
    input:
        MAP_SEARCHES,
        MAP_CELLS,
        tokens="data/tokens/meta.json",
        code=code("map_aggregate"),
    params:
        points=Params(MAP_POINTS),
        models=Params(point_models(STUDY)),
        order=TECHNIQUE_ORDER,
        reference=MAP_REFERENCE,
    log:
        "logs/map_aggregate.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/map_aggregate.py"


rule map_figures:
    output:
        MAP_FIGURES,
    input:
        table=rules.map_aggregate.output.table,
        code=code("map_figures"),
    params:
        reference=MAP_REFERENCE,
    threads: 3
    log:
        "logs/map_figures.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/map_figures.py"


rule map_render:
    output:
        md="paper/paper.md",
        tex="paper/paper.tex",
    input:
        table=rules.map_aggregate.output.table,
        findings=rules.map_aggregate.output.findings,
        searches=MAP_SEARCHES,
        corpus=rules.corpus.output.stats,
        tokens="data/tokens/meta.json",
        figures=MAP_FIGURES,
        templates=list((ROOT / "paper" / "templates").glob("map*.j2"))
        + list((ROOT / "paper" / "templates" / "map").glob("*.j2")),
        code=code("map_render"),
    params:
        study=Params(STUDY),
        templates=ROOT / "paper" / "templates",
    log:
        "logs/map_render.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/map_render.py"
