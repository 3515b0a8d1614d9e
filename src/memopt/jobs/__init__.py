"""The jobs the workflow runs on a GPU: the search for a technique's proven maximum batch (with its
exactness run), the timing cell at one batch, and the quality run of a function with one seed.
Each returns one result dict with a declared status (ok, oom, diverged: memopt.jobs.outcome) and its
provenance; memopt.jobs.pipeline writes them to the files the workflow names."""
