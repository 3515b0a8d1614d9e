"""Train a sentencepiece BPE tokenizer on the training split and encode both splits to token files.

The tokenizer is lossless on normalized corpus text (identity normalization, spaces kept, newline a
piece of its own, byte fallback for unseen characters), so decoding a document's tokens gives back
exactly the text in the corpus JSONL. Documents are separated by the eos token in the .bin files.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from memopt.errors import MemoptError
from memopt.fileio import atomic_path, read_json, write_json

# sentencepiece skips (drops) sentences longer than max_sentence_length bytes, so long paragraphs
# are cut at word breaks into lines of at most this many characters (4 UTF-8 bytes each at most).
MAX_LINE_CHARS = 4096
UNK_ID, EOS_ID = 0, 1


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every token id: uint16 up to 65536 pieces."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def load_tokens(bin_path: Path, meta: dict) -> np.memmap:
    """The flat token ids of a split (documents separated by meta['eos_id']), read-only."""
    return np.memmap(bin_path, dtype=np.dtype(meta["dtype"]), mode="r")


def iter_texts(jsonl: Path) -> Iterator[str]:
    """The text of each document of a corpus JSONL file, in file order."""
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)["text"]


def _split_long(line: str) -> Iterator[str]:
    while len(line) > MAX_LINE_CHARS:
        cut = line.rfind(" ", 1, MAX_LINE_CHARS)
        cut = cut if cut > 0 else MAX_LINE_CHARS
        yield line[:cut]
        line = line[cut:]  # keeps the space: the next word starts with "▁" as it does in the text
    yield line


def _training_lines(train_jsonl: Path, train_chars: int) -> tuple[list[str], int]:
    """Up to train_chars characters of training text, one paragraph (or piece of one) per line."""
    lines, used = [], 0
    for text in iter_texts(train_jsonl):
        for paragraph in text.split("\n"):
            if not paragraph.strip():
                continue
            for line in _split_long(paragraph):
                line = line[: train_chars - used]
                lines.append(line)
                used += len(line)
                if used >= train_chars:
                    return lines, used
    return lines, used


def _vocab_error(vocab_size: int, err: RuntimeError) -> MemoptError:
    """Turn sentencepiece's vocabulary-size complaints into a message naming the config key."""
    message = str(err)
    too_high = re.search(r"Vocabulary size too high .*<= (\d+)", message)
    if too_high:
        return MemoptError(
            f"tokenizer.vocab_size: {vocab_size} is too large for the training text, which allows "
            f"at most {too_high.group(1)}; lower it, or give more text (tokenizer.train_chars, "
            "corpus.max_chars)"
        )
    too_low = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", message)
    if too_low:
        return MemoptError(
            f"tokenizer.vocab_size: {vocab_size} is too small: the 256 byte pieces, the special "
            f"pieces and the characters of the text need at least {too_low.group(1)}"
        )
    return MemoptError(f"tokenizer: sentencepiece training failed: {message}")


def train_tokenizer(
    train_jsonl: Path, model_out: Path, vocab_size: int, train_chars: int, threads: int = 1
) -> dict:
    """Train a BPE sentencepiece model on the first train_chars characters of the training split.

    Writes model_out (e.g. spm.model) and its stats beside it (spm.json); returns the stats. The
    same input and threads give a byte-identical model (num_threads is recorded inside the model).
    """
    start = time.perf_counter()
    lines, used = _training_lines(Path(train_jsonl), train_chars)
    if not lines:
        raise MemoptError(f"tokenizer: the training split {train_jsonl} has no text")
    model = io.BytesIO()
    try:
        # An iterator and a writer rather than files: a temp file's name would be recorded inside
        # the model and make its bytes differ between otherwise identical runs.
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=0.9995,
            byte_fallback=True,
            # Lossless on normalized text: no NFKC, no whitespace collapsing, no dummy leading space.
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            user_defined_symbols=["\n"],  # paragraph breaks are one piece, not a byte-fallback
            input_sentence_size=0,  # use every line, no sampling: reproducible
            shuffle_input_sentence=False,
            max_sentence_length=4 * MAX_LINE_CHARS,
            unk_id=UNK_ID,
            eos_id=EOS_ID,  # the document separator in the token files
            bos_id=-1,
            pad_id=-1,
            num_threads=threads,
            minloglevel=1,
        )
    except RuntimeError as err:
        raise _vocab_error(vocab_size, err) from err
    data = model.getvalue()
    with atomic_path(model_out) as tmp:
        tmp.write_bytes(data)
    stats = {
        "vocab_size": vocab_size,
        "model_type": "bpe",
        "eos_id": EOS_ID,
        "train_chars_used": used,
        "train_lines": len(lines),
        "num_threads": threads,
        "sha256": hashlib.sha256(data).hexdigest(),
        "seconds": round(time.perf_counter() - start, 3),
    }
    write_json(Path(model_out).with_suffix(".json"), stats)
    return stats


def _batches(texts: Iterable[str], max_chars: int = 1 << 22) -> Iterator[list[str]]:
    """Groups of documents of about max_chars characters: bounded memory, threads kept busy."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encode(sp, texts: list[str], threads: int) -> list[list[int]]:
    """Token ids of each text, computed paragraph by paragraph (about 2.5x faster on novels).

    "\n" is a user-defined piece, which no other piece crosses, so joining the paragraphs' ids with
    its id gives exactly the ids of the whole text.
    """
    newline = sp.piece_to_id("\n")
    if newline == sp.unk_id():  # a model made elsewhere, without the newline piece
        return sp.encode(texts, num_threads=threads)
    paragraphs = [text.split("\n") for text in texts]
    flat = iter(sp.encode([p for ps in paragraphs for p in ps], num_threads=threads))
    docs = []
    for ps in paragraphs:
        ids = list(next(flat))
        for _ in ps[1:]:
            ids.append(newline)
            ids.extend(next(flat))
        docs.append(ids)
    return docs


def _encode_file(sp, jsonl: Path, bin_out: Path, dtype: np.dtype, threads: int, desc: str):
    """Write the token ids of every document followed by eos; return (documents, tokens, chars)."""
    with open(jsonl, encoding="utf-8") as f:
        total = sum(1 for line in f if line.strip())
    documents = tokens = chars = 0
    with (
        atomic_path(bin_out) as tmp,
        open(tmp, "wb") as out,
        tqdm(total=total, desc=desc, unit=" doc") as bar,
    ):
        for batch in _batches(iter_texts(jsonl)):
            for ids in _encode(sp, batch, threads):
                ids.append(sp.eos_id())
                np.asarray(ids, dtype=dtype).tofile(out)
                tokens += len(ids)
            documents += len(batch)
            chars += sum(map(len, batch))
            bar.update(len(batch))
    return documents, tokens, chars


def load_model(path: Path) -> spm.SentencePieceProcessor:
    """The sentencepiece model at `path`, checked against the SHA-256 and vocabulary size that
    train_tokenizer recorded beside it (spm.json) when that record is there. A missing,
    truncated or foreign file is a MemoptError naming it and the rule that rebuilds it
    (sentencepiece would raise a protobuf error, or read a truncated file as a smaller model)."""
    path = Path(path)
    rebuild = "the `tokenizer` rule rebuilds it: snakemake --forcerun tokenizer (with your study's options)"
    if not path.is_file():
        raise MemoptError(f"{path}: tokenizer model not found; {rebuild}")
    record = path.with_suffix(".json")
    stats = read_json(record) if record.is_file() else {}
    data = path.read_bytes()
    if stats.get("sha256") not in (None, hashlib.sha256(data).hexdigest()):
        raise MemoptError(
            f"{path}: its SHA-256 differs from the one {record.name} recorded when it was trained "
            f"({len(data):,} bytes now): truncated, damaged or replaced; {rebuild}"
        )
    try:
        model = spm.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise MemoptError(
            f"{path}: not a sentencepiece model ({first}): truncated, damaged or another file; "
            f"{rebuild}"
        ) from None
    if model.get_piece_size() != stats.get("vocab_size", model.get_piece_size()):
        raise MemoptError(
            f"{path}: holds {model.get_piece_size()} pieces, {record.name} says "
            f"{stats['vocab_size']}; {rebuild}"
        )
    return model


def encode_splits(
    model_path: Path,
    train_jsonl: Path,
    val_jsonl: Path,
    train_bin: Path,
    val_bin: Path,
    meta_out: Path,
    threads: int = 1,
) -> dict:
    """Encode both splits to flat token files (np.memmap-readable, see load_tokens); return meta."""
    sp = load_model(Path(model_path))
    vocab_size, dtype = sp.get_piece_size(), token_dtype(sp.get_piece_size())
    train_docs, train_tokens, train_chars = _encode_file(
        sp, Path(train_jsonl), Path(train_bin), dtype, threads, "encode train"
    )
    val_docs, val_tokens, _ = _encode_file(
        sp, Path(val_jsonl), Path(val_bin), dtype, threads, "encode val"
    )
    meta = {
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "eos_id": sp.eos_id(),
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "train_documents": train_docs,
        "val_documents": val_docs,
        "tokenizer_sha256": hashlib.sha256(Path(model_path).read_bytes()).hexdigest(),
        # Characters per text token: the eos separators are left out of the count.
        "chars_per_token": round(train_chars / max(1, train_tokens - train_docs), 4),
    }
    write_json(meta_out, meta)
    return meta
