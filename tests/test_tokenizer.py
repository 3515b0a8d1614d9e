"""memopt.data.tokenizer on the fixture corpus: reproducible training, lossless encoding, file layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sentencepiece as spm

from memopt.data.corpus import prepare_corpus
from memopt.data.tokenizer import (
    MAX_LINE_CHARS,
    _training_lines,
    encode_splits,
    load_tokens,
    token_dtype,
    train_tokenizer,
)
from memopt.errors import MemoptError

VOCAB = 400


@pytest.fixture(scope="module")
def corpus(speakleash_mirror, tmp_path_factory):
    """The fixture corpus's train / val JSONL files."""
    out = tmp_path_factory.mktemp("corpus")
    cfg = {
        "source": "mirror",
        "dataset": speakleash_mirror.dataset,
        "mirror": str(speakleash_mirror.path),
        "quality": ["HIGH", "MEDIUM", "LOW"],
        "min_chars": 100,
        "max_documents": None,
        "max_chars": None,
        "val_fraction": 0.2,
        "timeout_s": 15,
    }
    prepare_corpus(cfg, out / "train.jsonl", out / "val.jsonl", out / "stats.json", out / "cache")
    return out


@pytest.fixture(scope="module")
def tokens(corpus):
    """A trained tokenizer and both splits encoded: (directory, train stats, encode meta)."""
    stats = train_tokenizer(corpus / "train.jsonl", corpus / "tok" / "spm.model", VOCAB, 100_000)
    meta = encode_splits(
        corpus / "tok" / "spm.model",
        corpus / "train.jsonl",
        corpus / "val.jsonl",
        corpus / "tok" / "train.bin",
        corpus / "tok" / "val.bin",
        corpus / "tok" / "meta.json",
    )
    return corpus / "tok", stats, meta


def read_texts(path):
    return [json.loads(line)["text"] for line in path.read_text("utf-8").splitlines()]


def test_training_is_reproducible(corpus, tokens, tmp_path):
    tok, stats, _ = tokens
    again = train_tokenizer(corpus / "train.jsonl", tmp_path / "spm.model", VOCAB, 100_000)
    assert (tmp_path / "spm.model").read_bytes() == (tok / "spm.model").read_bytes()
    assert again["sha256"] == stats["sha256"]
    assert json.loads((tok / "spm.json").read_text())["sha256"] == stats["sha256"]
    assert stats["vocab_size"] == VOCAB and stats["model_type"] == "bpe"
    train_chars = sum(len(t) - t.count("\n") for t in read_texts(corpus / "train.jsonl"))
    assert stats["train_chars_used"] <= train_chars  # newlines are line breaks, not text


def test_train_chars_budget(corpus, tmp_path):
    stats = train_tokenizer(corpus / "train.jsonl", tmp_path / "spm.model", 350, 2_000)
    assert stats["train_chars_used"] == 2_000


def test_encoding_roundtrips(corpus, tokens):
    tok, _, meta = tokens
    sp = spm.SentencePieceProcessor(model_file=str(tok / "spm.model"))
    for split in ("train", "val"):
        ids = load_tokens(tok / f"{split}.bin", meta)
        assert isinstance(ids, np.memmap) and ids[-1] == meta["eos_id"]
        boundaries = np.flatnonzero(ids == meta["eos_id"])
        docs = np.split(np.asarray(ids), boundaries + 1)[:-1]
        decoded = [sp.decode(doc[:-1].tolist()) for doc in docs]
        assert decoded == read_texts(corpus / f"{split}.jsonl")
    assert sp.piece_to_id("\n") != sp.unk_id()  # a paragraph break is one piece


def test_meta_matches_files(corpus, tokens):
    tok, stats, meta = tokens
    assert json.loads((tok / "meta.json").read_text()) == meta
    assert meta["vocab_size"] == VOCAB and meta["dtype"] == "uint16"
    assert meta["tokenizer_sha256"] == stats["sha256"]
    for split in ("train", "val"):
        size = (tok / f"{split}.bin").stat().st_size
        assert size == meta[f"{split}_tokens"] * np.dtype(meta["dtype"]).itemsize
        ids = load_tokens(tok / f"{split}.bin", meta)
        n_docs = len(read_texts(corpus / f"{split}.jsonl"))
        assert meta[f"{split}_documents"] == n_docs == int((ids == meta["eos_id"]).sum())
        assert int(ids.max()) < VOCAB
    assert 1.0 < meta["chars_per_token"] < 10.0


def test_token_dtype():
    assert token_dtype(300) == np.uint16
    assert token_dtype(65536) == np.uint16  # ids 0..65535
    assert token_dtype(65537) == np.uint32
    assert token_dtype(1_000_000) == np.uint32


def test_vocab_too_large_names_the_key_and_the_maximum(corpus, tmp_path):
    with pytest.raises(MemoptError, match=r"tokenizer\.vocab_size: 100000 .* at most \d+"):
        train_tokenizer(corpus / "train.jsonl", tmp_path / "spm.model", 100_000, 100_000)
    assert not (tmp_path / "spm.model").exists()


def test_vocab_too_small_names_the_minimum(corpus, tmp_path):
    with pytest.raises(MemoptError, match=r"tokenizer\.vocab_size: 260 .* at least \d+"):
        train_tokenizer(corpus / "train.jsonl", tmp_path / "spm.model", 260, 100_000)


def test_long_paragraphs_are_split_at_word_breaks(tmp_path):
    words = " ".join(f"słowo{i}" for i in range(3000))  # one paragraph of ~26000 characters
    (tmp_path / "train.jsonl").write_text(json.dumps({"id": "a", "text": words}) + "\n")
    lines, used = _training_lines(tmp_path / "train.jsonl", 10**9)
    assert len(lines) > 1 and max(map(len, lines)) <= MAX_LINE_CHARS
    assert "".join(lines) == words and used == len(words)
