"""memopt: which memory-optimization techniques let you train a transformer with a bigger batch,
faster, and at what cost in quality. The library behind the Snakemake workflow and the `memopt` CLI."""

__version__ = "0.1.0"
