"""tools/gpu_study.sh with STUDY_PARTIAL=pairs: a map point cut off mid-way keeps its whole
technique pairs (search and cell) in the saved state, and the next machine runs only the rest."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml
from conftest import DATASET
from smoke_workflow import ROOT, mirror, workdir  # noqa: F401
from test_gpu_study import gpu_study

pytestmark = pytest.mark.slow


def machine(path, mirror_path):  # noqa: F811
    wd = workdir(path, {"source": "mirror", "mirror": ".corpus", "dataset": DATASET})
    study = yaml.safe_load((wd / "study.yaml").read_text())
    study["techniques"] = {
        k: v for k, v in study["techniques"].items() if k in ("baseline", "gradcp")
    }
    study["map"] = {"models": {"a": {}}, "seq_lens": [32]}
    study["batch_sizes"] = ["max"]
    (wd / "study.yaml").write_text(yaml.safe_dump(study))
    shutil.copytree(ROOT / "tools", wd / "tools")
    shutil.copytree(mirror_path, wd / ".corpus")
    return wd


def names(wd) -> list[str]:
    tar = ["tar", "tzf", "out/state.tar.gz"]
    return subprocess.run(tar, cwd=wd, capture_output=True, text=True, check=True).stdout.split()


def test_a_cut_point_keeps_its_pairs_and_the_next_machine_runs_the_rest(mirror, tmp_path):  # noqa: F811
    a = machine(tmp_path / "a", mirror.path)
    gpu_study(a, "start", "1000")
    log = gpu_study(a, "wait", "600")
    assert "== piece finished" in log and "FAILED" not in log, log
    # The machine is lost after gradcp's search, before its cell: a search without its cell.
    (a / "results/map/a_32/cells/gradcp/max.json").unlink()
    pair = ("results/map/a_32/search/baseline.json", "results/map/a_32/cells/baseline/max.json")
    kept = [(a / f).read_bytes() for f in pair]
    # Without STUDY_PARTIAL the cut point is left out whole (the default) ...
    assert "left out of the state (it runs again, whole)" in gpu_study(a, "save")
    assert not [n for n in names(a) if "a_32" in n]
    # ... with STUDY_PARTIAL=pairs its whole pair stays, and gradcp's search, log and benchmark go
    out = gpu_study(a, "save", STUDY_PARTIAL="pairs")
    assert (
        "map point a_32 has 1/2 techniques done: those kept (STUDY_PARTIAL=pairs), gradcp left"
        in out
    )
    saved = [n for n in names(a) if "a_32" in n]
    assert "results/map/a_32/search/baseline.json" in saved
    assert "results/map/a_32/cells/baseline/max.json" in saved
    assert "logs/map/a_32/search/baseline.log" in saved
    assert not [n for n in saved if "gradcp" in n], saved
    # The next machine restores it and runs gradcp's search and cell only.
    b = machine(tmp_path / "b", mirror.path)
    (b / ".study").mkdir()
    shutil.copy(a / "out/state.tar.gz", b / ".study/state.tar.gz")
    gpu_study(b, "start", "1000")
    log = gpu_study(b, "wait", "600")
    assert "== piece finished" in log and "FAILED" not in log, log
    runlog = (b / "logs/study-run.log").read_text()
    # what is left of the point's 20 s: gradcp (checkpointing) by its usual share, 3.5 of 4.5
    assert "point:a_32 (estimate 15s" in runlog, runlog
    assert [(b / f).read_bytes() for f in pair] == kept  # not run again (provenance times)
    assert (b / "results/map/a_32/search/gradcp.json").exists()
    assert (b / "results/map/a_32/cells/gradcp/max.json").exists()


def test_a_piece_call_runs_the_frozen_tree_and_saves_every_time(mirror, tmp_path):  # noqa: F811
    """tools/gpu_map_piece.sh: `first` unpacks the frozen tree elsewhere with this checkout's
    gpu_study scripts, starts, waits and saves; `next` waits and saves again; on a machine that
    is gone (its folder missing) `next` says so and exits 4."""
    repo = machine(tmp_path / "repo", mirror.path)
    (repo / ".study").mkdir()
    sha = "c0ffee1" + "0" * 33
    files = [p.name for p in repo.iterdir() if p.name not in (".study", ".corpus")]
    subprocess.run(["tar", "czf", f".study/frozen-{sha[:7]}.tar.gz", *files], cwd=repo, check=True)
    piece = tmp_path / "piece"
    env = {"PIECE_DIR": str(piece), "PIECE_GPU": "none", "MAP_COMMIT": sha,
           "STUDY_CONFIG": "study.yaml", "PIECE_TAIL": "40"}  # fmt: skip
    out = gpu_study(repo, "first", "1000", "300", "point:a_32$", **env, SCRIPT="gpu_map_piece.sh")
    assert "== piece finished" in out and "FAILED" not in out, out
    state = [n for n in names(repo) if "a_32" in n]
    assert "results/map/a_32/cells/gradcp/max.json" in state
    cell = (piece / "results/map/a_32/cells/gradcp/max.json").read_text()
    assert f'"git_commit": "{sha}"' in cell  # the frozen commit, as the cells record it
    # next: the config `start` recorded (STUDY_CONFIG unset)
    nxt = gpu_study(repo, "next", "5", **(env | {"STUDY_CONFIG": ""}), SCRIPT="gpu_map_piece.sh")
    assert "== piece finished" in nxt
    with open(piece / "logs/study-run.log", "a") as log:  # a piece still running there
        log.write("== piece start 10:00:00\n")
    proc = subprocess.run(["bash", "tools/gpu_map_piece.sh", "first", "1000", "5"], cwd=repo,
                          env={**os.environ, **env}, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 5 and "a piece still runs" in proc.stdout
    shutil.rmtree(piece)
    proc = subprocess.run(["bash", "tools/gpu_map_piece.sh", "next", "5"], cwd=repo,
                          env={**os.environ, **env}, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 4 and "gone: a new machine" in proc.stdout
