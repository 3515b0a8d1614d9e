"""Token data for training and evaluation: flat token-id files, seeded batch sampling.

Every technique sees the same batches for the same batch size (same seed, same order), and every
cell is evaluated on the same validation tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from memopt.errors import MemoptError


class TokenData:
    def __init__(self, tokens_dir: Path):
        tokens_dir = Path(tokens_dir)
        meta_path = tokens_dir / "meta.json"
        if not meta_path.exists():
            raise MemoptError(
                f"no token data at {tokens_dir} (missing meta.json); "
                "build it first: snakemake data/tokens/meta.json --cores all"
            )
        self.meta = json.loads(meta_path.read_text())
        dtype = np.dtype(self.meta["dtype"])
        self.train = np.memmap(tokens_dir / "train.bin", dtype=dtype, mode="r")
        self.val = np.memmap(tokens_dir / "val.bin", dtype=dtype, mode="r")
        self.vocab_size = int(self.meta["vocab_size"])

    def max_batch(self, seq_len: int) -> int:
        """A batch cannot hold more distinct sequences than the training tokens can fill."""
        return max(0, len(self.train) // (seq_len + 1))


class Batches:
    """Random windows of seq_len + 1 tokens, drawn from a generator seeded once per run."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int,
        device: str,
        part: tuple[int, int] = (0, 1),
    ):
        if len(tokens) < seq_len + 2:
            raise MemoptError(
                f"training split has {len(tokens)} tokens, fewer than "
                f"model.seq_len + 2 ({seq_len + 2}); use more text or a shorter seq_len"
            )
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.device = device
        # (rank, ranks): every rank draws the same batch and keeps its contiguous slice of it.
        self.part = part
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(
            0, len(self.tokens) - self.seq_len - 1, (self.batch_size,), generator=self.gen
        ).numpy()
        rank, ranks = self.part
        starts = np.array_split(starts, ranks)[rank]
        rows = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        xy = torch.from_numpy(rows)
        if self.device == "cuda":
            xy = xy.pin_memory().to("cuda", non_blocking=True)
        return xy[:, :-1], xy[:, 1:]


def eval_sequences(tokens: np.ndarray, seq_len: int, n_sequences: int) -> torch.Tensor:
    """n windows of seq_len + 1 tokens spread evenly over the whole validation split (the first
    starts at its beginning, the last ends at its end), (n, seq_len + 1); the same in every run."""
    n = min(n_sequences, (len(tokens) - 1) // seq_len)
    if n < 1:
        raise MemoptError(
            f"validation split has {len(tokens)} tokens, fewer than model.seq_len + 1 "
            f"({seq_len + 1}); raise corpus.val_fraction or use more text"
        )
    starts = np.linspace(0, len(tokens) - seq_len - 1, n).round().astype(np.int64)
    rows = [tokens[s : s + seq_len + 1] for s in starts]
    return torch.from_numpy(np.stack(rows).astype(np.int64))
