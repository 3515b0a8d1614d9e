# A map study (config key `map`, e.g. config/map.yaml): every technique at every point (a model at
# a length): its proven maximum batch, then one timing cell at it. No exactness or quality runs:
# timing and memory only. A point's jobs see the study with the point's model (point_params).


rule map_search:
    input:
        TOKENS,
        code=code("map_search"),
    output:
        "results/map/{point}/search/{technique}.json",
    log:
        "logs/map/{point}/search/{technique}.log",
    benchmark:
        "results/benchmarks/map/{point}/search/{technique}.tsv"
    conda:
        CONDA_ENV
    threads: 4
    resources:
        **TECHNIQUE_RESOURCES,
    params:
        study=point_params(TRAIN_KEYS),
        spec=technique_spec,
    script:
        "../scripts/map_search.py"


rule map_cell:
    input:
        TOKENS,
        own=rules.map_search.output[0],
        code=code("cell"),
    output:
        "results/map/{point}/cells/{technique}/max.json",
    log:
        "logs/map/{point}/cells/{technique}.log",
    benchmark:
        "results/benchmarks/map/{point}/cell/{technique}.tsv"
    conda:
        CONDA_ENV
    threads: 4
    resources:
        **TECHNIQUE_RESOURCES,
    params:
        study=point_params(TRAIN_KEYS),
        spec=technique_spec,
    script:
        "../scripts/cell.py"


rule map_aggregate:
    input:
        MAP_SEARCHES,
        MAP_CELLS,
        tokens="data/tokens/meta.json",
        code=code("map_aggregate"),
    output:
        "results/map.csv",
    log:
        "logs/map_aggregate.log",
    conda:
        CONDA_ENV
    params:
        points=Params(MAP_POINTS),
        models=Params(point_models(STUDY)),
        order=TECHNIQUE_ORDER,
    script:
        "../scripts/map_aggregate.py"
