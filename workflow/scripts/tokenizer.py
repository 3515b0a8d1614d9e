# Adapter: rule tokenizer -> memopt.tokenizer.train_tokenizer
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))  # noqa: F821

from memopt.scripting import logged  # noqa: E402
from memopt.tokenizer import train_tokenizer  # noqa: E402

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    train_tokenizer(
        Path(sm.input.train),
        Path(sm.output.model),
        sm.params.tokenizer["vocab_size"],
        sm.params.tokenizer["train_chars"],
        threads=sm.threads,
    )
