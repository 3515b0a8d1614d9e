"""What a rerun of the finished smoke study plans, read off dry runs: nothing after a full run,
only the render after a template edit, only the paper after a verdict margin, every job after a
training edit, one technique's jobs after its change, and named targets."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from smoke_workflow import PDF, planned, snakemake

pytestmark = pytest.mark.slow


def test_second_run_does_nothing(smoke):
    assert planned(smoke[0]) == {}


@contextlib.contextmanager
def edited(*paths: Path):
    """Really edit files (Snakemake 9 compares checksums, not only times), then restore them."""
    saved = {p: p.read_bytes() for p in paths}
    for p in paths:
        p.write_bytes(saved[p] + b"\n")
    try:
        yield
    finally:
        for p, content in saved.items():
            p.write_bytes(content)


def test_template_edit_reruns_only_the_render(smoke):
    wd = smoke[0]
    templates = ("paper.md.j2", "prose/introduction.md.j2", "../literature.yaml")  # prose/ too
    for template in templates:
        with edited(wd / "paper/templates" / template):
            assert planned(wd) == {"render": 1, **PDF, "all": 1}, template


def test_the_equivalence_margin_reruns_only_the_paper(smoke):
    """quality.margin judges the runs, it does not make them: no quality run reruns (the
    figures draw it: the windows figure's band); and the validation windows are the quality
    runs' alone: no search or cell reruns."""
    only_paper = {"render": 1, **PDF, "all": 1}
    margin = planned(smoke[0], "--config", "quality={'margin': 0.05}")
    assert margin == {"figures": 1, **only_paper}
    # exactness.floor_factor too; a measured floor (floor: kernel) means new exactness runs.
    assert planned(smoke[0], "--config", "exactness={'floor_factor': 3}") == only_paper
    n = len(yaml.safe_load((smoke[0] / "study.yaml").read_text())["techniques"])
    for how in ("kernel", "compile"):  # only the references' searches: their floor runs
        plan = planned(smoke[0], "--config", f"exactness={{'floor': '{how}'}}")
        assert 1 <= plan["search"] < n and "quality" not in plan, plan
    plan = planned(smoke[0], "--config", "train={'eval_sequences': 6}")  # the study's: 8
    assert "quality" in plan and not {"search", "cell"} & set(plan), plan


def test_paper_code_edit_does_not_retrain(smoke):
    wd = smoke[0]
    with edited(wd / "src/memopt/report/paper.py"):
        assert planned(wd) == {"render": 1, **PDF, "all": 1}
    with edited(wd / "src/memopt/report/figures.py"):
        assert planned(wd) == {"figures": 1, "render": 1, **PDF, "all": 1}


def test_training_code_edit_retrains(smoke):
    wd = smoke[0]
    n = len(yaml.safe_load((wd / "study.yaml").read_text())["techniques"])
    with edited(wd / "src/memopt/runtime/step.py"):
        jobs = planned(wd)
    # Every cell job reruns (the baseline's `max` one writes its `same` cell again).
    assert jobs["search"] == n and jobs["cell"] == 2 * n and "baseline_max" not in jobs
    assert "corpus" not in jobs


def test_one_technique_change_reruns_only_that_technique(smoke):
    wd = smoke[0]
    assert planned(wd) == {}
    change = ["--config", "techniques={'local16': {'window': 8}}"]
    # A new window is a new function: its quality runs (one per seed) run too.
    assert planned(wd, *change) == {
        "search": 1,
        "cell": 2,
        "quality": 2,
        "aggregate": 1,
        "figures": 1,
        "render": 1,
        **PDF,
        "all": 1,
    }
    proc = snakemake(wd, "-n", *change)
    assert "output: results/search/local16.json" in proc.stdout
    assert "output: results/search/baseline.json" not in proc.stdout


def test_named_targets(smoke):
    wd = smoke[0]
    assert planned(wd, "technique_gradcp") == {}
    # --forcerun takes several values: the target goes first.
    assert planned(wd, "technique_gradcp", "--forcerun", "results/search/gradcp.json") == {
        "search": 1,
        "cell": 2,
        "technique_gradcp": 1,
    }
    assert planned(wd, "--forcerun", "results/search/gradcp.json") == {
        "search": 1,
        "cell": 2,
        "aggregate": 1,
        "figures": 1,
        "render": 1,
        **PDF,
        "all": 1,
    }
    assert planned(wd, "paper", "--forcerun", "render") == {"render": 1, **PDF, "paper": 1}
