"""memopt.data.corpus against fixture mirrors on disk and on loopback HTTP; never the real internet."""

from __future__ import annotations

import functools
import hashlib
import json
import socket
import threading
import time
import unicodedata
from contextlib import contextmanager
from datetime import datetime
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import zstandard
from speakleash.config_loader import ConfigLoader

from memopt.data.corpus import prepare_corpus
from memopt.data.text import normalize_text
from memopt.errors import CorpusError


def corpus_cfg(fixture, **overrides) -> dict:
    """A filled-in corpus config section reading `fixture` (a conftest Mirror) as a directory."""
    cfg = {
        "source": "mirror",
        "dataset": fixture.dataset,
        "mirror": str(fixture.path),
        "quality": ["HIGH", "MEDIUM"],
        "min_chars": 200,
        "max_documents": None,
        "max_chars": None,
        "val_fraction": 0.2,
        "timeout_s": 15,
    }
    return cfg | overrides


def run(cfg, tmp_path, tag="out"):
    out = tmp_path / tag
    stats = prepare_corpus(
        cfg, out / "train.jsonl", out / "val.jsonl", out / "stats.json", tmp_path / "cache"
    )

    def read(name):
        return [json.loads(line) for line in (out / name).read_text("utf-8").splitlines()]

    return stats, read("train.jsonl"), read("val.jsonl"), out


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(directory, handler=_QuietHandler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=directory))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_directory_mirror(speakleash_mirror, speakleash_documents, tmp_path):
    stats, train, val, out = run(corpus_cfg(speakleash_mirror), tmp_path)
    assert stats["base_url"] == str(speakleash_mirror.path.resolve())
    assert stats["documents_in"] == 12 and stats["dropped_quality"] == 1
    assert stats["dropped_short"] == 1 and stats["quality_labels_seen"] is True
    assert stats["train"]["documents"] == 8 and stats["val"]["documents"] == 2  # round(0.2 * 10)
    assert stats["license"] == "CC0 (test fixture)"
    assert json.loads((out / "stats.json").read_text("utf-8")) == stats
    ids = {d["id"] for d in train + val}
    assert len(ids) == 10 and "doc01" in ids and "doc05" not in ids
    unnamed = _doc(train + val, speakleash_documents[11][0])
    assert unnamed["id"] == hashlib.sha256(unnamed["text"].encode()).hexdigest()[:16]
    assert stats["train"]["characters"] == sum(len(d["text"]) for d in train)
    assert stats["val"]["words"] == sum(len(d["text"].split()) for d in val)
    assert {d["meta"]["quality"] for d in train + val} == {"HIGH", "MEDIUM"}


def _doc(docs, raw_text):
    return next(d for d in docs if d["text"] == normalize_text(raw_text))


def test_http_mirror_gives_the_same_files(speakleash_mirror, tmp_path):
    _, train_dir, val_dir, _ = run(corpus_cfg(speakleash_mirror), tmp_path, "dir")
    with serve(speakleash_mirror.path) as url:
        stats, train, val, _ = run(corpus_cfg(speakleash_mirror, mirror=url), tmp_path, "http")
    assert stats["base_url"] == url
    assert (train, val) == (train_dir, val_dir)


def test_normalize_text():
    assert normalize_text("roz\u00adpo\u00adczę\u00adcie") == "rozpoczęcie"
    nfd = unicodedata.normalize("NFD", "zażółć gęślą jaźń")
    assert nfd != "zażółć gęślą jaźń" and normalize_text(nfd) == "zażółć gęślą jaźń"
    messy = "  a\u00a0\u00a0b\t\tc  \r\n\r\n\r\n\r\nd   \re\u2028f\n\n\n\n  "
    assert normalize_text(messy) == "a b c\n\nd\ne\nf"
    assert normalize_text("\ufeffx\u200by") == "xy"


def test_documents_are_normalized(speakleash_mirror, tmp_path):
    _, train, val, _ = run(corpus_cfg(speakleash_mirror), tmp_path)
    texts = {d["id"]: d["text"] for d in train + val}
    assert texts["doc01"].startswith("Przykład: rozpoczęcie. ")
    assert texts["doc02"] == unicodedata.normalize("NFC", texts["doc02"])
    assert texts["doc03"].startswith("Początek z tabem.\n\nŚrodek linii.\n")
    for text in texts.values():
        assert "\u00ad" not in text and "\r" not in text and "\n\n\n" not in text
        assert "  " not in text and " \n" not in text and text == text.strip()


def test_quality_and_min_chars(speakleash_mirror, tmp_path):
    cfg = corpus_cfg(speakleash_mirror, quality=["HIGH", "MEDIUM", "LOW"], min_chars=0)
    stats, train, val, _ = run(cfg, tmp_path)
    assert stats["dropped_quality"] == 0 and stats["dropped_short"] == 0
    assert len(train + val) == 12
    stats, train, val, _ = run(corpus_cfg(speakleash_mirror, quality=["MEDIUM"]), tmp_path)
    assert stats["dropped_quality"] == 10  # 12 docs: 9 HIGH, 2 MEDIUM, 1 LOW
    assert sorted(d["meta"]["quality"] for d in train + val) == ["MEDIUM", "MEDIUM"]


def test_documents_without_quality_labels_are_kept(
    make_speakleash_mirror, speakleash_documents, tmp_path
):
    docs = [(text, {"name": meta.get("name", "x")}) for text, meta in speakleash_documents]
    stats, train, val, _ = run(corpus_cfg(make_speakleash_mirror(docs)), tmp_path)
    assert stats["quality_labels_seen"] is False and stats["dropped_quality"] == 0
    assert len(train + val) == 11


def test_caps(speakleash_mirror, speakleash_documents, tmp_path):
    stats, train, val, _ = run(corpus_cfg(speakleash_mirror, max_documents=3), tmp_path)
    assert len(train + val) == 3 and stats["capped"] == "max_documents"
    assert {d["id"] for d in train + val} == {"doc00", "doc01", "doc02"}  # source order

    full, *_ = run(corpus_cfg(speakleash_mirror), tmp_path, "full")
    assert full["capped"] is None and full["truncated"] is False
    # doc00 + doc01 hold 1705 characters; doc02 crosses 2000 and is cut to fit at a break.
    stats, train, val, _ = run(corpus_cfg(speakleash_mirror, max_chars=2000), tmp_path, "chars")
    docs = {d["id"]: d["text"] for d in train + val}
    assert stats["capped"] == "max_chars" and stats["truncated"] is True
    assert set(docs) == {"doc00", "doc01", "doc02"}
    assert 1705 + 200 <= sum(map(len, docs.values())) <= 2000
    full_doc02 = normalize_text(speakleash_documents[2][0])
    assert full_doc02.startswith(docs["doc02"]) and len(docs["doc02"]) < len(full_doc02)


def test_split_is_deterministic_and_independent_of_source_order(
    make_speakleash_mirror, speakleash_documents, tmp_path
):
    docs = speakleash_documents
    _, train_a, val_a, _ = run(corpus_cfg(make_speakleash_mirror(docs)), tmp_path, "a")
    _, train_b, val_b, _ = run(corpus_cfg(make_speakleash_mirror(docs[::-1])), tmp_path, "b")
    assert (train_a, val_a) == (train_b, val_b)
    assert not {d["id"] for d in train_a} & {d["id"] for d in val_a}


def test_unknown_dataset_lists_available(speakleash_mirror, tmp_path):
    with pytest.raises(CorpusError, match="not offered") as err:
        run(corpus_cfg(speakleash_mirror, dataset="nope"), tmp_path)
    assert "corpus.dataset" in str(err.value)
    assert f"available: {speakleash_mirror.dataset}, fixture_other" in str(err.value)


@pytest.mark.parametrize(
    ("mirror", "match"),
    [(None, "needs a directory"), ("/no/such/dir", "not a directory"), ("ftp://x/", "allowed")],
)
def test_bad_mirror(speakleash_mirror, tmp_path, mirror, match):
    with pytest.raises(CorpusError, match=match) as err:
        run(corpus_cfg(speakleash_mirror, mirror=mirror), tmp_path)
    assert "corpus.mirror" in str(err.value)


def test_mirror_dir_without_dataset_list(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="corpus.mirror: .* has no speakleash.json"):
        prepare_corpus(
            {"source": "mirror", "mirror": str(tmp_path / "empty"), "dataset": "x"},
            tmp_path / "t",
            tmp_path / "v",
            tmp_path / "s",
            tmp_path / "c",
        )


def test_missing_manifest_names_the_dataset_and_where(make_speakleash_mirror, speakleash_documents, tmp_path):  # fmt: skip
    mirror = make_speakleash_mirror(speakleash_documents)
    (mirror.path / f"{mirror.dataset}.manifest").unlink()
    with pytest.raises(CorpusError) as err:
        run(corpus_cfg(mirror), tmp_path)
    assert str(err.value).startswith(f"corpus.dataset: '{mirror.dataset}': could not read ")
    assert f"{mirror.dataset}.manifest at " in str(err.value)
    assert not list((tmp_path).rglob("*.jsonl"))  # nothing written


def test_too_few_documents(speakleash_mirror, tmp_path):
    with pytest.raises(CorpusError, match="corpus.min_chars"):
        run(corpus_cfg(speakleash_mirror, min_chars=100_000), tmp_path)


def test_closed_mirror_port_fails_fast_with_advice(speakleash_mirror, tmp_path):
    start = time.monotonic()
    with pytest.raises(CorpusError, match="could not be reached") as err:
        run(corpus_cfg(speakleash_mirror, mirror="http://127.0.0.1:9/", timeout_s=2), tmp_path)
    assert time.monotonic() - start < 20
    assert "corpus.source: mirror, corpus.mirror: DIR and corpus.dataset: NAME" in str(err.value)


@pytest.fixture
def silent_server():
    """A loopback port that accepts connections and never answers: a hung speakleash host."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"


def test_unresponsive_speakleash_host_fails_fast(
    speakleash_mirror, tmp_path, monkeypatch, silent_server
):
    config = {"url_datasets_text_pl": silent_server}
    monkeypatch.setattr(ConfigLoader, "load_config", staticmethod(lambda: config))
    cfg = corpus_cfg(speakleash_mirror, source="speakleash", mirror=None, timeout_s=1)
    start = time.monotonic()
    with pytest.raises(CorpusError, match="could not be reached") as err:
        run(cfg, tmp_path)
    assert time.monotonic() - start < 20
    message = str(err.value)  # the mirror, in the config (so later commands stay the same)
    assert (
        "corpus.source: mirror" in message and f"asks for {speakleash_mirror.dataset!r}" in message
    )
    assert "snakemake --profile profiles/smoke" in message


def test_hung_download_times_out(speakleash_mirror, tmp_path):
    release = threading.Event()

    class HangOnData(_QuietHandler):
        def do_GET(self):
            if self.path.endswith(".jsonl.zst"):
                release.wait(30)  # speakleash itself would wait forever here
                return
            super().do_GET()

    start = time.monotonic()
    try:
        with (
            serve(speakleash_mirror.path, HangOnData) as url,
            pytest.raises(CorpusError, match="download"),
        ):
            run(corpus_cfg(speakleash_mirror, mirror=url, timeout_s=1), tmp_path)
    finally:
        release.set()
    assert time.monotonic() - start < 20
    assert not (tmp_path / "cache" / f"{speakleash_mirror.dataset}.jsonl.zst").exists()


def test_cached_failure_is_not_reused(speakleash_mirror, tmp_path):
    with serve(speakleash_mirror.path) as url:
        # What speakleash leaves behind after a failed fetch of the dataset list this hour.
        key = hashlib.md5((url + "speakleash.json").encode()).hexdigest()
        stamp = datetime.now().strftime("-%m_%d_%y_%H")
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / f"{key}{stamp}.json").write_text("null")
        stats, *_ = run(corpus_cfg(speakleash_mirror, mirror=url), tmp_path)
    assert stats["documents_in"] == 12


def _zst(*lines: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n")


GOOD_LINE = json.dumps({"text": "Dobry tekst. " * 40, "meta": {"quality": "HIGH"}}).encode()
# Issue 14's four ways a download or a half-synced mirror leaves the dataset file broken, each
# with the place and the cause the message must name.
BROKEN = {
    "an error page saved as the file": (
        lambda good: b"<html><body>502 Bad Gateway</body></html>\n" * 30,
        "at its start: not zstd-compressed data",
    ),
    "truncated": (lambda good: good[: len(good) // 2], "at its end: .*the file is truncated"),
    "a line that is not JSON": (
        lambda good: _zst(GOOD_LINE, b"<<this is not json>>"),
        "at line 2: not JSON",
    ),
    "a record without text": (
        lambda good: _zst(GOOD_LINE, b'{"body": "x", "meta": {}}'),
        r"at line 2: a record without a `text` field \(its fields: body, meta\)",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_dataset_file_names_file_and_place(make_speakleash_mirror, speakleash_documents, tmp_path, case):  # fmt: skip
    mirror = make_speakleash_mirror(speakleash_documents)
    path = mirror.path / f"{mirror.dataset}.jsonl.zst"
    broken, match = BROKEN[case]
    data = broken(path.read_bytes())
    path.write_bytes(data)
    manifest = mirror.path / f"{mirror.dataset}.manifest"  # a mirror whose manifest agrees
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"file_size": len(data)}))
    with pytest.raises(CorpusError, match=match) as err:
        run(corpus_cfg(mirror), tmp_path)
    text = str(err.value)
    assert (
        f"corpus.dataset: '{mirror.dataset}': {mirror.dataset}.jsonl.zst from {mirror.path}" in text
    )
    assert "run again to download it anew" in text and "repair the mirror" in text
    # Nothing half-written: no output, and the broken download is not kept for the next run.
    files = [p.name for d in ("out", "cache") for p in (tmp_path / d).rglob("*") if p.is_file()]
    assert files == [], files


def test_records_read_as_speakleash_reads_them(tmp_path):
    """memopt.data.corpus_file.records gives what speakleash's own reader gives for a sound file:
    several zstd frames, paragraphs given as a list, records with and without meta."""
    from lm_dataformat import Reader

    from memopt.data.corpus_file import records

    path = tmp_path / "d.jsonl.zst"
    frame2 = _zst(b'{"text": ["p1", "p2"], "meta": {"name": "x"}}', b'{"text": "no meta"}')
    path.write_bytes(_zst(GOOD_LINE) + frame2)
    ours = list(records(path))
    assert ours == list(Reader(str(path)).stream_data(get_meta=True))
    assert [t for t, _ in ours[1:]] == ["p1\n\np2", "no meta"]
