"""Figures: every one written as PDF and PNG, non-empty, byte-identical on a rebuild."""

from test_results import TECHNIQUES, make_cell, write_study

from memopt.figures import make_figures
from memopt.results import aggregate, write_json


def test_figures_exist_as_pdf_and_png(tmp_path):
    study = write_study(tmp_path)
    aggregate(study["cells"], study["summary"])
    paths = make_figures(study["summary"], study["cells"], tmp_path / "paper" / "figures")
    names = sorted(p.name for p in paths)
    expected = [f"{n}.{e}" for n in ("loss", "memory", "throughput") for e in ("pdf", "png")]
    assert names == expected
    for path in paths:
        head = path.read_bytes()[:8]
        assert path.stat().st_size > 5000
        assert head.startswith(b"%PDF") if path.suffix == ".pdf" else head == b"\x89PNG\r\n\x1a\n"

    again = make_figures(study["summary"], study["cells"], tmp_path / "again")
    for first, second in zip(paths, again):  # reproducible: no dates or versions in the files
        assert first.read_bytes() == second.read_bytes(), first.name


def test_figures_when_every_cell_is_oom(tmp_path):
    cells = []
    for technique in TECHNIQUES:
        path = tmp_path / "cells" / technique / "same.json"
        write_json(path, make_cell(technique, "same", 8, status="oom"))
        cells.append(path)
    aggregate(cells, tmp_path / "summary.csv")
    paths = make_figures(tmp_path / "summary.csv", cells, tmp_path / "figures")
    assert all(p.stat().st_size > 0 for p in paths)
