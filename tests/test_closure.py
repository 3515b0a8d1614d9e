"""Issue 31, finding 1: a rule's code inputs are the import closure of its script, computed from the
sources (tests/test_rebuild.py checks what a dry run then plans for every module's edit)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from memopt.run.closure import closure, code_inputs

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "workflow" / "scripts"
PACKAGE = ROOT / "src" / "memopt"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_closure_follows_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    write(pkg / "__init__.py", '"""a package"""\n')
    write(pkg / "a.py", "import os\n\ndef f():\n    from pkg import b  # lazy\n    return b\n")
    write(pkg / "b.py", "from . import c\nfrom .c import value\n")
    write(pkg / "c.py", "value = 1\n")
    write(pkg / "sub" / "__init__.py", "")
    write(pkg / "sub" / "d.py", "from ..e import x\n")
    write(pkg / "e.py", "x = 2\n")
    write(pkg / "unused.py", "import pkg.a\n")
    write(
        pkg / "launch.py",
        'import subprocess, sys\nsubprocess.run([sys.executable, "-m", "pkg.f"])\n',
    )
    write(pkg / "f.py", "import importlib\nimportlib.import_module('pkg.g')\nNAME = 'pkg.unused'\n")
    write(pkg / "g.py", "")
    script = write(tmp_path / "script.py", "from pkg.a import f\nimport pkg.sub.d\nimport json\n")
    got = {p.relative_to(pkg).as_posix() for p in closure([script], pkg)}
    assert got == {"__init__.py", "a.py", "b.py", "c.py", "sub/__init__.py", "sub/d.py", "e.py"}
    # A module that only imports: its own closure, not its importers'.
    assert {p.name for p in closure([pkg / "sub" / "d.py"], pkg)} == {"__init__.py", "e.py"}
    # Modules run by name: a process started with -m, importlib (a mere string is not code).
    assert {p.name for p in closure([pkg / "launch.py"], pkg)} == {"__init__.py", "f.py", "g.py"}


def test_the_rules_code_is_their_scripts_closure():
    """The modules the issue found missing from hand-written lists are in the computed ones."""
    rule_code = {s.stem: {p.stem for p in closure([s], PACKAGE)} for s in SCRIPTS.glob("*.py")}
    training = {"optimizers", "precision", "losses", "offload", "parallel", "config", "flops"}
    training |= {
        "divergence",
        "step",
        "cell",
        "outcome",
        "model",
        "attention",
        "search",
        "quality",
        "pipeline",
    }
    for rule in ("search", "cell", "quality"):
        assert training <= rule_code[rule], (rule, training - rule_code[rule])
    paper = {"paper", "paper_prose", "paper_analysis", "paper_mechanisms", "paper_gpus", "verdicts"}
    assert paper <= rule_code["render"]
    assert {"results", "steady", "verdicts"} <= rule_code["aggregate"]
    # The data rules do not depend on training or paper code, and no rule on the command line.
    for rule in ("corpus", "tokenizer", "tokens"):
        assert not rule_code[rule] & (training | paper), rule
    assert not any("cli" in code for code in rule_code.values())
    assert all("__init__" in code for code in rule_code.values())


def test_code_inputs_are_relative_to_the_working_directory(monkeypatch):
    monkeypatch.chdir(ROOT)
    paths = code_inputs(SCRIPTS / "pdf.py")
    assert paths and all(not p.is_absolute() and p.parts[:2] == ("src", "memopt") for p in paths)


def test_jobs_import_memopt_from_the_checkout_the_rules_track(monkeypatch, tmp_path):
    """The Snakefile puts the checkout's src/ first for itself and for every job it starts
    (PYTHONPATH, inherited), once, keeping what else was there."""
    from memopt.run.closure import jobs_import_from

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", str(tmp_path)]))
    monkeypatch.setattr(sys, "path", list(sys.path))
    jobs_import_from(tmp_path / ".")
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    assert sys.path[0] == str(tmp_path)
