"""Fetch a speakleash dataset, clean it, and split it into train / val JSONL files.

The data always goes through the real speakleash API (`Speakleash(dir).get(name).ext_data`), also for
a mirror: a mirror URL replaces the package's baked server URL, and a mirror directory is served on a
loopback HTTP server for the duration of the call, so online and offline runs share one code path.
The downloaded file is read by memopt.data.corpus_file, which names the line where a file is broken.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import socket
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
from speakleash import Speakleash
from speakleash.config_loader import ConfigLoader
from speakleash.dataset import dataset as speakleash_dataset
from speakleash.downloader import structure_downloader
from tqdm import tqdm

from memopt.data.corpus_file import BrokenFile, records
from memopt.data.text import normalize_text, truncate
from memopt.errors import CorpusError
from memopt.fileio import atomic_path, write_json
from memopt.redact import redact

QUALITY_LEVELS = ("HIGH", "MEDIUM", "LOW")

# StructureDownloader caches every fetched JSON as <md5 of url>-<date stamp>.json, failures as `null`.
_STRUCTURE_CACHE = re.compile(r"^[0-9a-f]{32}-\d\d_\d\d_\d\d(_\d\d)?\.json$")


def offline_hint(dataset: str) -> str:
    """How to read the corpus from a speakleash-layout mirror instead: in the study's config, so
    every later command of the study stays the same (a --config override would have to be
    repeated on each, or the study reads as another corpus)."""
    return (
        "to work offline, read the corpus from a speakleash-layout mirror (a directory or http(s) "
        "URL holding speakleash.json, NAME.manifest and NAME.jsonl.zst): in the study's config set "
        "corpus.source: mirror, corpus.mirror: DIR and corpus.dataset: NAME, a dataset the mirror "
        f"holds (this study asks for {dataset!r}; a name the mirror lacks fails with its list). "
        "The CPU smoke study reads the mirror beside the checkout: snakemake --profile "
        "profiles/smoke"
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _write_jsonl(path: Path, docs: list[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass  # a request log per file would bury the workflow's own output


@contextmanager
def _serve_directory(directory: Path) -> Iterator[str]:
    """Serve a directory on 127.0.0.1 (a free port) and yield its base URL with a trailing slash."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # A short poll interval: shutdown() waits for the next poll (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _baked_url() -> str:
    """The speakleash server URL that the installed package has baked into its config.json."""
    return ConfigLoader.load_config()["url_datasets_text_pl"]


@contextmanager
def _source_url(cfg: dict) -> Iterator[tuple[str, str]]:
    """Yield (base URL for speakleash, base URL or directory to record) for the configured source."""
    source, mirror = cfg["source"], cfg.get("mirror")
    if source == "speakleash":
        url = _baked_url()
        yield url, url
        return
    if source != "mirror":
        raise CorpusError(f"corpus.source: {source!r} is not allowed; use 'speakleash' or 'mirror'")
    if not mirror:
        raise CorpusError(
            f"corpus.mirror: {mirror!r}; source 'mirror' needs a directory or http(s) URL in "
            "speakleash layout (speakleash.json, NAME.manifest, NAME.jsonl.zst)"
        )
    if mirror.startswith(("http://", "https://")):
        url = mirror.rstrip("/") + "/"
        yield url, url
        return
    if "://" in mirror:
        raise CorpusError(f"corpus.mirror: {mirror!r}; allowed: a local directory or http(s) URL")
    directory = Path(mirror).resolve()
    if not directory.is_dir():
        raise CorpusError(f"corpus.mirror: {mirror!r} is not a directory (resolved: {directory})")
    if not (directory / "speakleash.json").is_file():
        raise CorpusError(
            f"corpus.mirror: {mirror!r} has no speakleash.json; a mirror directory needs "
            "speakleash.json, NAME.manifest and NAME.jsonl.zst"
        )
    with _serve_directory(directory) as url:
        yield url, str(directory)


def _check_reachable(base: str, cfg: dict) -> None:
    """Fail within timeout_s when the server is down: speakleash itself would hang or cache null."""
    url = base + "speakleash.json"
    try:
        response = requests.get(url, timeout=cfg["timeout_s"])
        response.raise_for_status()
        names = response.json()
    except (requests.RequestException, ValueError) as err:
        raise CorpusError(
            f"corpus.source: {cfg['source']!r}: the corpus host could not be reached or gave no "
            f"dataset list at {url} within {cfg['timeout_s']} s ({type(err).__name__}: {err}); "
            + offline_hint(cfg["dataset"])
        ) from err
    if not isinstance(names, list):
        raise CorpusError(f"corpus.source: {url} is not a speakleash dataset list (a JSON list)")


def _remove_structure_cache(replicate_dir: Path) -> None:
    """Delete speakleash's hourly JSON cache so that an earlier failure (cached as null) is retried."""
    for path in replicate_dir.iterdir():
        if _STRUCTURE_CACHE.match(path.name):
            path.unlink()


@contextmanager
def _network_timeouts(timeout_s: float) -> Iterator[None]:
    """Give every HTTP request speakleash makes a timeout, so nothing can hang forever.

    speakleash calls requests.get(url) without a timeout. socket.setdefaulttimeout() is not enough:
    requests passes an explicit `None` (block forever) down to urllib3, which overrides the socket
    default. So speakleash's modules see a `requests` whose get() has a default timeout; the socket
    default still covers anything that opens sockets by other means.
    """

    def get(url, **kwargs):
        kwargs.setdefault("timeout", timeout_s)
        return requests.get(url, **kwargs)

    modules = (structure_downloader, speakleash_dataset)
    saved = [module.requests for module in modules]
    saved_socket_timeout = socket.getdefaulttimeout()
    for module in modules:
        module.requests = types.SimpleNamespace(get=get)
    socket.setdefaulttimeout(timeout_s)
    try:
        yield
    finally:
        socket.setdefaulttimeout(saved_socket_timeout)
        for module, original in zip(modules, saved):
            module.requests = original


class _Speakleash(Speakleash):
    """Speakleash reading from `base_url`: the package takes its server from get_url()."""

    def __init__(self, replicate_dir: str, base_url: str):
        self._base_url = base_url
        super().__init__(replicate_dir)

    def get_url(self, lang: str) -> str:
        return self._base_url


def _open_dataset(base: str, where: str, cfg: dict, cache_dir: Path):
    """Return (speakleash dataset, iterator of (text, meta)) through the speakleash API.

    `base` is the URL speakleash reads from; `where` names the source in messages (for a local
    mirror its directory rather than the loopback URL).
    """
    name = cfg["dataset"]
    speakleash = _Speakleash(str(cache_dir), base)
    if not speakleash.datasets:
        raise CorpusError(
            f"corpus.dataset: could not read the dataset list speakleash.json at {where}"
        )
    dataset = speakleash.get(name)
    if dataset is None:
        available = ", ".join(sorted(d.name for d in speakleash.datasets))
        raise CorpusError(
            f"corpus.dataset: {name!r} is not offered by {cfg['source']} ({where}); "
            f"available: {available}"
        )
    if not dataset.manifest:
        raise CorpusError(f"corpus.dataset: {name!r}: could not read {name}.manifest at {where}")
    local = cache_dir / f"{name}.jsonl.zst"
    try:
        stream = dataset.ext_data
    except requests.RequestException as err:
        local.unlink(missing_ok=True)  # speakleash writes straight into it: drop the partial file
        raise CorpusError(
            f"corpus.dataset: {name!r}: the download of {name}.jsonl.zst from {where} failed "
            f"({type(err).__name__}: {err}); run again, or " + offline_hint(name)
        ) from err
    # speakleash trusts any HTTP reply (an error page included) and a truncated download only
    # makes ext_data None; the manifest's file size tells a complete file apart.
    expected = dataset.jsonl_zst_file_size
    if stream is None or (expected and local.stat().st_size != expected):
        local.unlink(missing_ok=True)
        raise CorpusError(
            f"corpus.dataset: {name!r}: the download of {name}.jsonl.zst from {where} failed or "
            f"was incomplete (expected {expected} bytes); run again, or " + offline_hint(name)
        )
    return dataset, records(local)  # read here rather than by speakleash: see corpus_file


def _doc_id(meta: dict, sha: str) -> str:
    for key in ("id", "name"):
        if meta.get(key) not in (None, ""):
            return str(meta[key])
    return sha[:16]


def _split_stats(docs: list[dict]) -> dict:
    return {
        "documents": len(docs),
        "characters": sum(len(d["text"]) for d in docs),
        "words": sum(len(d["text"].split()) for d in docs),
    }


def _select(stream, cfg: dict, counts: dict) -> list[dict]:
    """Normalize and filter documents in source order until a cap is reached; fill counts."""
    allowed = set(cfg["quality"])
    max_documents, max_chars = cfg.get("max_documents"), cfg.get("max_chars")
    docs, seen, ids, kept_chars = [], set(), set(), 0
    for text, meta in tqdm(stream, desc=f"corpus {cfg['dataset']}", unit=" doc"):
        # Caps are checked before reading a document, so `capped` means a document was left unread.
        if max_documents is not None and len(docs) >= max_documents:
            counts["capped"] = "max_documents"
            break
        if max_chars is not None and kept_chars >= max_chars:
            counts["capped"] = "max_chars"
            break
        counts["documents_in"] += 1
        meta = meta or {}
        if "quality" in meta:
            counts["quality_labels_seen"] = True
            if meta["quality"] not in allowed:
                counts["dropped_quality"] += 1
                continue
        text = normalize_text(text)
        if len(text) < cfg["min_chars"] or not text:
            counts["dropped_short"] += 1
            continue
        if max_chars is not None and len(text) > max_chars - kept_chars:
            # The document crossing max_chars is cut to fit (at a paragraph break when possible)
            # rather than dropped: with a few long novels, dropping could leave too few documents.
            text = truncate(text, max_chars - kept_chars)
            if len(text) < max(cfg["min_chars"], 1):
                counts["capped"] = "max_chars"
                break
            counts["truncated"] = True
        sha = _sha256(text)
        if sha in seen:  # an exact duplicate could land in both splits and leak val into train
            counts["dropped_duplicate"] += 1
            continue
        seen.add(sha)
        doc_id = _doc_id(meta, sha)
        if doc_id in ids:  # ids name documents downstream, so a repeated one gets its hash added
            doc_id = f"{doc_id}-{sha[:8]}"
        ids.add(doc_id)
        kept_chars += len(text)
        docs.append({"id": doc_id, "text": text, "meta": meta, "_sha": sha})
    return docs


@contextmanager
def _cleaned_on_error(cache_dir: Path) -> Iterator[None]:
    """A failed fetch leaves no speakleash structure cache behind (nothing half-written)."""
    try:
        yield
    except CorpusError:
        _remove_structure_cache(cache_dir)
        raise


def prepare_corpus(
    cfg: dict, train_out: Path, val_out: Path, stats_out: Path, cache_dir: Path
) -> dict:
    """Fetch cfg's dataset into cache_dir, clean it, write the train/val JSONL and stats; return stats.

    Documents are normalized (see normalize_text), filtered by meta quality (documents without a
    quality label are kept) and min_chars, capped in source order by max_documents / max_chars, and
    split by the sha256 of their text: the first max(1, round(val_fraction * n)) in hash order are
    validation. Both files are written in hash order, so they do not depend on the source order.
    Each line is {"id", "text", "meta"}; the id is meta's id or name, else a sha256 prefix.

    Stats: dataset, source, base_url (a local mirror's directory), documents_in (documents read),
    dropped_quality, dropped_short, dropped_duplicate (exact repeats), capped (null, or the cap that
    left documents unread), truncated (the last document was cut to fit max_chars),
    quality_labels_seen, license, description, and train / val: documents, characters, words.
    """
    cache_dir = Path(cache_dir).resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    counts = {
        "documents_in": 0,
        "dropped_quality": 0,
        "dropped_short": 0,
        "dropped_duplicate": 0,
        "capped": None,
        "truncated": False,
        "quality_labels_seen": False,
    }
    with _source_url(cfg) as (base, recorded), _cleaned_on_error(cache_dir):
        _check_reachable(base, cfg)
        _remove_structure_cache(cache_dir)
        with _network_timeouts(cfg["timeout_s"]):
            dataset, stream = _open_dataset(base, recorded, cfg, cache_dir)
            try:
                docs = _select(stream, cfg, counts)
            except BrokenFile as err:
                name = cfg["dataset"]
                (cache_dir / f"{name}.jsonl.zst").unlink(missing_ok=True)
                raise CorpusError(
                    f"corpus.dataset: {name!r}: {name}.jsonl.zst from {recorded} is broken at "
                    f"{err.where}: {err.what}. The downloaded copy is deleted: run again to "
                    "download it anew. If it is broken again, so is the source: repair the "
                    "mirror's file, or choose another corpus.dataset."
                ) from None

    if len(docs) < 2:
        raise CorpusError(
            f"corpus: only {len(docs)} document(s) of {cfg['dataset']!r} remain after filtering "
            f"({counts['documents_in']} read, {counts['dropped_quality']} dropped for quality, "
            f"{counts['dropped_short']} shorter than min_chars); at least 2 are needed: lower "
            f"corpus.min_chars ({cfg['min_chars']}), widen corpus.quality ({cfg['quality']}) or "
            f"raise corpus.max_documents ({cfg.get('max_documents')}) / corpus.max_chars "
            f"({cfg.get('max_chars')})"
        )
    docs.sort(key=lambda d: d.pop("_sha"))
    n_val = max(1, round(cfg["val_fraction"] * len(docs)))
    val, train = docs[:n_val], docs[n_val:]
    _write_jsonl(train_out, train)
    _write_jsonl(val_out, val)
    stats = {
        "dataset": cfg["dataset"],
        "source": cfg["source"],
        "base_url": redact(recorded),
        **counts,
        "license": dataset.license or None,
        "description": dataset.description or None,
        "train": _split_stats(train),
        "val": _split_stats(val),
    }
    write_json(stats_out, stats)
    return stats
