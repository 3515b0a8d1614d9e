"""Running the pipeline: the `memopt` command line, the warm worker that runs jobs in one
long-lived process per GPU, torchrun launches of parallel techniques, the watch on the Snakemake
process that started a job, a study's output folder, and the code inputs of each workflow rule."""
