# Adapter: rule tokens -> memopt.tokenizer.encode_splits
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.scripting import logged  # noqa: E402
from memopt.tokenizer import encode_splits  # noqa: E402

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
