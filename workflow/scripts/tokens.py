# Adapter: rule tokens -> memopt.data.tokenizer.encode_splits
from pathlib import Path

from memopt.data.tokenizer import encode_splits
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
train_bin, val_bin, meta = map(Path, sm.output)
with logged(sm.log[0]):
    encode_splits(
        Path(sm.input.model),
        Path(sm.input.train),
        Path(sm.input.val),
        train_bin,
        val_bin,
        meta,
        threads=sm.threads,
    )
