# Adapter: rule corpus -> memopt.data.corpus.prepare_corpus
from pathlib import Path

from memopt.data.corpus import prepare_corpus
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    prepare_corpus(
        sm.params.corpus,
        Path(sm.output.train),
        Path(sm.output.val),
        Path(sm.output.stats),
        Path(sm.params.cache_dir),
    )
