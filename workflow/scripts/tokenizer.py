# Adapter: rule tokenizer -> memopt.data.tokenizer.train_tokenizer
from pathlib import Path

from memopt.data.tokenizer import train_tokenizer
from memopt.run.scripting import logged

sm = snakemake  # noqa: F821
with logged(sm.log[0]):
    train_tokenizer(
        Path(sm.input.train),
        Path(sm.output.model),
        sm.params.tokenizer["vocab_size"],
        sm.params.tokenizer["train_chars"],
        threads=sm.threads,
    )
