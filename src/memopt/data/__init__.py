"""The data: the speakleash corpus (download or mirror, cleaning, the train/val split by document),
the sentencepiece tokenizer trained on the training split, and the flat token files the jobs read.
Torch-free except `tokens` (memmaps and batches)."""
