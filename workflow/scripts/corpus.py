# Adapter: rule corpus -> memopt.corpus.prepare_corpus
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.corpus import prepare_corpus  # noqa: E402
from memopt.scripting import logged  # noqa: E402

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    prepare_corpus(
        sm.params.corpus,
        Path(sm.output.train),
        Path(sm.output.val),
        Path(sm.output.stats),
        Path(sm.params.cache_dir),
    )
