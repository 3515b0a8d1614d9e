"""Shared fixtures: a tiny speakleash-layout corpus mirror, built on disk, never fetched.

    speakleash_mirror                 -> Mirror(path, dataset): the default fixture corpus (read-only,
                                         built once per session)
    speakleash_documents              -> its documents, [(raw text, meta)] in source order
    make_speakleash_mirror(docs, ...) -> Mirror: a fresh mirror holding your own documents
    tiny_study                        -> (config, TokenData): a 2-layer CPU study on random tokens

Point the corpus at it with {"source": "mirror", "mirror": str(mirror.path), "dataset":
mirror.dataset}. The layout is what speakleash serves: speakleash.json (the dataset list), and per
dataset NAME.manifest (file_size = size of the .zst), NAME.jsonl.zst ({"text", "meta"} per line)
and NAME.sample.
"""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import NamedTuple

import pytest
import zstandard

DATASET = "fixture_corpus"
OTHER_DATASET = "fixture_other"  # a second dataset, so "unknown dataset" has a list to show

_WORDS = (  # noqa: SIM905 - the word list reads better as prose than as 140 quoted strings
    "dom las rzeka miasto droga okno ogród wieczór poranek słońce deszcz wiatr śnieg chleb mleko "
    "książka list pióro stół krzesło szkoła nauczyciel uczeń matka ojciec siostra brat dziecko "
    "przyjaciel sąsiad żołnierz kupiec chłop pan pani wieś kościół rynek ulica most zamek góra "
    "dolina pole łąka jezioro morze statek koń pies kot ptak drzewo kwiat trawa kamień złoto "
    "srebro żelazo ogień woda ziemia niebo gwiazda księżyc noc dzień rok miesiąc tydzień godzina "
    "chwila życie śmierć miłość radość smutek strach nadzieja pamięć myśl słowo pieśń muzyka "
    "szedł patrzył mówił pisał czytał myślał wiedział chciał musiał mógł widział słyszał "
    "czekał wracał stał siedział leżał biegł jechał płynął śpiewał płakał śmiał się "
    "wielki mały stary młody dobry zły piękny cichy głośny ciemny jasny zimny ciepły długi krótki "
    "i a ale lecz bo że gdy jak tak nie już jeszcze tylko bardzo zawsze nigdy tam tu potem"
).split()


def _prose(seed: int, n_paragraphs: int = 3, words: int = 45) -> str:
    """Deterministic Polish-looking paragraphs (enough distinct text for a ~400-piece tokenizer)."""
    rng = random.Random(seed)
    paragraphs = []
    for _ in range(n_paragraphs):
        sentences, left = [], words
        while left > 0:
            n = min(left, rng.randint(5, 12))
            sentence = " ".join(rng.choice(_WORDS) for _ in range(n))
            sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".!?."))
            left -= n
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def fixture_documents() -> list[tuple[str, dict]]:
    """The default corpus: 12 documents, (text, meta) in source order.

    doc01 has soft hyphens, doc02 NFD characters, doc03 messy whitespace and line endings, doc04 is
    too short for min_chars=200, doc05 has quality LOW, doc11 has no name (its id is a hash prefix).
    """
    docs = [(_prose(i), {"name": f"doc{i:02d}", "quality": "HIGH"}) for i in range(12)]
    docs[1] = ("Przy\u00adkład: roz\u00adpo\u00adczę\u00adcie. " + docs[1][0], docs[1][1])
    docs[2] = (unicodedata.normalize("NFD", docs[2][0]), {"name": "doc02", "quality": "MEDIUM"})
    messy = "  Początek\u00a0\u00a0z\ttabem.  \r\n\r\n\r\n\r\nŚrodek   linii.   \r\n" + docs[3][0]
    docs[3] = (messy + "\n\n\n  ", docs[3][1])
    docs[4] = ("Za krótki tekst.", {"name": "doc04", "quality": "HIGH"})
    docs[5] = (docs[5][0], {"name": "doc05", "quality": "LOW"})
    docs[11] = (docs[11][0], {"quality": "MEDIUM"})
    return docs


class Mirror(NamedTuple):
    path: Path  # the mirror directory (speakleash.json, NAME.manifest, NAME.jsonl.zst, NAME.sample)
    dataset: str  # the dataset name to ask for


def _write_dataset(root: Path, name: str, docs: list[tuple[str, dict]]) -> None:
    lines = "".join(json.dumps({"text": t, "meta": m}, ensure_ascii=False) + "\n" for t, m in docs)
    data = zstandard.ZstdCompressor().compress(lines.encode("utf-8"))
    (root / f"{name}.jsonl.zst").write_bytes(data)
    manifest = {
        "name": name,
        "description": f"{name}: a tiny test corpus",
        "license": "CC0 (test fixture)",
        "category": "Test",
        "language": "pl",
        "file_size": len(data),
        "stats": {"documents": len(docs), "characters": sum(len(t) for t, _ in docs)},
    }
    (root / f"{name}.manifest").write_text(json.dumps(manifest, ensure_ascii=False), "utf-8")
    sample = [{"text": t, "meta": m} for t, m in docs[:3]]
    (root / f"{name}.sample").write_text(json.dumps(sample, ensure_ascii=False), "utf-8")


def write_speakleash_mirror(
    root: Path, docs: list[tuple[str, dict]], dataset: str = DATASET
) -> Mirror:
    """Write `docs` as `dataset` (plus a small second dataset) in speakleash layout under root."""
    root.mkdir(parents=True, exist_ok=True)
    _write_dataset(root, dataset, docs)
    _write_dataset(root, OTHER_DATASET, [(_prose(100 + i), {"name": f"o{i}"}) for i in range(3)])
    names = [{"name": dataset}, {"name": OTHER_DATASET}]
    (root / "speakleash.json").write_text(json.dumps(names), "utf-8")
    return Mirror(root, dataset)


@pytest.fixture(scope="session")
def speakleash_mirror(tmp_path_factory) -> Mirror:
    """The default fixture corpus (fixture_documents()) as a mirror; shared, do not modify it."""
    return write_speakleash_mirror(tmp_path_factory.mktemp("speakleash"), fixture_documents())


@pytest.fixture
def speakleash_documents() -> list[tuple[str, dict]]:
    """The default corpus's documents, (raw text, meta) in source order (see fixture_documents)."""
    return fixture_documents()


@pytest.fixture
def make_speakleash_mirror(tmp_path):
    """Factory: make_speakleash_mirror(docs, dataset=DATASET) -> Mirror in a fresh directory."""
    count = 0

    def make(docs: list[tuple[str, dict]], dataset: str = DATASET) -> Mirror:
        nonlocal count
        count += 1
        return write_speakleash_mirror(tmp_path / f"mirror{count}", docs, dataset)

    return make


def write_random_tokens(folder: Path, train: int = 40_000, val: int = 4_000) -> Path:
    """Token files of random ids below 300 (seeded) with a meta.json that matches them."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 300, train).astype(np.uint16).tofile(folder / "train.bin")
    rng.integers(0, 300, val).astype(np.uint16).tofile(folder / "val.bin")
    meta = {"vocab_size": 300, "dtype": "uint16", "train_tokens": train, "val_tokens": val}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture
def tiny_study(tmp_path):
    """A tiny CPU study: (validated config, TokenData of random tokens written to tmp_path)."""

    from memopt.config import validate_config
    from memopt.data.tokens import TokenData

    write_random_tokens(tmp_path)
    cfg = validate_config(
        {
            "device": "cpu",
            "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 32},
            "train": {"warmup_steps": 2, "eval_sequences": 4, "eval_batch_size": 2},
            "measure": {"warmup_steps": 2},
            "search": {"cpu_memory_budget_gib": 8 / 1024, "max_batch": 512},
            "techniques": {"baseline": {}},
        }
    )
    return cfg, TokenData(tmp_path)


# The smoke study through Snakemake (tests/smoke_workflow.py): `mirror` and `smoke`, run once per
# session for tests/test_workflow.py and tests/test_interrupt.py.
from smoke_workflow import mirror, smoke  # noqa: E402, F401


class CliResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def memopt_cli(capsys, monkeypatch):
    """`memopt ARGS` in this process (no torch import per call): run(*args, cwd=...) ->
    CliResult. An exception other than the command's own exit fails the test: no traceback."""
    from memopt.run import cli

    def run(*args, cwd: Path) -> CliResult:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            cli.main([str(a) for a in args])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


@pytest.fixture(scope="session")
def paper_study(tmp_path_factory):
    """The synthetic study of tests/test_results.py, aggregated and with its figures drawn (once
    a session: drawing takes seconds): its paths, `root` and `figures`."""
    from synthetic_study import write_study

    from memopt.report.figures import make_figures
    from memopt.report.results import aggregate

    root = tmp_path_factory.mktemp("study")
    paths = write_study(root)
    aggregate(paths["cells"], paths["summary"])
    make_figures(
        paths["summary"],
        root / "paper" / "figures",
        search_paths=paths["searches"],
        quality_paths=paths["quality"],
        processes=2,
    )
    return paths | {"root": root, "figures": root / "paper" / "figures"}


@pytest.fixture
def study(paper_study):
    """The synthetic study with its figures (paper_study: drawn once per session)."""
    return paper_study
