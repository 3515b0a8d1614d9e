"""The training runtime: the model's blocks, what each technique knob does to them and to the step
(attention kernels, precision, losses, checkpointing, offload, optimizers, data parallelism), the
training step itself, and how memory, time and FLOPs are measured on the GPU a job leased. What a
knob *is* (its value, default, label) lives in memopt.knobs; what it *does* lives here."""
