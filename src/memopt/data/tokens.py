"""Token data for training and evaluation: flat token-id files, seeded batch sampling.

Every technique sees the same batches for the same batch size (same seed, same order), and every
cell is evaluated on the same validation tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from memopt.errors import MemoptError
from memopt.fileio import read_json

TOKEN_DTYPES = ("uint16", "uint32")  # memopt.data.tokenizer.token_dtype
REBUILD = "the `tokens` rule rebuilds it: snakemake --forcerun tokens (with your study's options)"


class TokenData:
    """The token files of data/tokens, checked against meta.json before anything trains on them:
    a truncated or foreign file stops the job with a message naming it, not a wrong result."""

    def __init__(self, tokens_dir: Path):
        tokens_dir = Path(tokens_dir)
        meta_path = tokens_dir / "meta.json"
        if not meta_path.exists():
            raise MemoptError(
                f"no token data at {tokens_dir} (missing meta.json); "
                "build it first: snakemake data/tokens/meta.json --cores all"
            )
        self.meta = read_json(meta_path)
        problem = _meta_problem(self.meta)
        if problem:
            raise MemoptError(f"{meta_path}: {problem}; {REBUILD}")
        dtype = np.dtype(self.meta["dtype"])
        self.train = _token_file(tokens_dir / "train.bin", dtype, self.meta["train_tokens"])
        self.val = _token_file(tokens_dir / "val.bin", dtype, self.meta["val_tokens"])
        self.vocab_size = int(self.meta["vocab_size"])

    def max_batch(self, seq_len: int) -> int:
        """A batch cannot hold more distinct sequences than the training tokens can fill."""
        return max(0, len(self.train) // (seq_len + 1))


def _meta_problem(meta) -> str | None:
    if not isinstance(meta, dict):
        return "not an object"
    if meta.get("dtype") not in TOKEN_DTYPES:
        return f"dtype {meta.get('dtype')!r} is not one of {', '.join(TOKEN_DTYPES)}"
    for key in ("vocab_size", "train_tokens", "val_tokens"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{key} is {value!r}, not a positive integer"
    if meta["vocab_size"] > np.iinfo(np.dtype(meta["dtype"])).max + 1:
        return f"vocab_size {meta['vocab_size']} does not fit dtype {meta['dtype']}"
    return None


def _token_file(path: Path, dtype: np.dtype, expected: int) -> np.memmap:
    """The flat token ids of one split, after checking the file holds exactly `expected` of them."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise MemoptError(f"{path}: file not found; {REBUILD}") from None
    if size != expected * dtype.itemsize:
        held = (
            f"{size / dtype.itemsize:,.1f}"
            if size % dtype.itemsize
            else f"{size // dtype.itemsize:,}"
        )
        raise MemoptError(
            f"{path}: holds {size:,} bytes ({held} {dtype.name} tokens), meta.json says "
            f"{expected:,} tokens ({expected * dtype.itemsize:,} bytes): the file is truncated, "
            f"damaged or from another run; {REBUILD}"
        )
    return np.memmap(path, dtype=dtype, mode="r")


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
