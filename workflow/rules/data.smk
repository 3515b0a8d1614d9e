rule corpus:
    output:
        train="data/corpus/train.jsonl",
        val="data/corpus/val.jsonl",
        stats="data/corpus/stats.json",
    input:
        code("corpus"),
    params:
        corpus=corpus_params(),
        cache_dir="data/corpus/.speakleash",
    log:
        "logs/corpus.log",
    benchmark:
        "results/benchmarks/corpus.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/corpus.py"


rule tokenizer:
    output:
        model="data/tokenizer/spm.model",
    input:
        train=rules.corpus.output.train,
        code=code("tokenizer"),
    params:
        tokenizer=Params(STUDY["tokenizer"]),
    # One thread: sentencepiece records its thread count in the model, so the file's hash would
    # otherwise depend on --cores. Training takes seconds either way.
    threads: 1
    log:
        "logs/tokenizer.log",
    benchmark:
        "results/benchmarks/tokenizer.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/tokenizer.py"


rule tokens:
    output:
        TOKENS,
    input:
        model=rules.tokenizer.output.model,
        train=rules.corpus.output.train,
        val=rules.corpus.output.val,
        code=code("tokens"),
    threads: 4
    log:
        "logs/tokens.log",
    benchmark:
        "results/benchmarks/tokens.tsv"
    conda:
        CONDA_ENV
    script:
        "../scripts/tokens.py"
