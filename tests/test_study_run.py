"""A study's folder is its own, and a study that cannot run here stops before any work
(memopt.run.study_run; the workflow side is in tests/test_workflow.py)."""

from __future__ import annotations

import pytest

from memopt.errors import ConfigError
from memopt.run.study_run import (
    STAMP,
    check_device_here,
    check_folder,
    claim_folder,
    command_line,
    folder_owner,
)


def test_a_folder_is_claimed_once_and_refused_to_another_study(tmp_path):
    check_folder("smoke", tmp_path)  # a fresh folder takes any study
    claim_folder("smoke", tmp_path)
    assert folder_owner(tmp_path) == "smoke" and (tmp_path / STAMP).read_text() == "smoke\n"
    check_folder("smoke", tmp_path)  # its own study goes on
    claim_folder("smoke", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [STAMP]  # no temporary file left
    with pytest.raises(ConfigError) as err:
        check_folder("default", tmp_path)
    message = str(err.value)
    assert "holds the outputs of study 'smoke'" in message
    assert "snakemake --profile profiles/smoke" in message and STAMP in message
    assert "snakemake --directory runs/default" in message


def test_the_command_is_repeated_as_typed_without_credentials():
    argv = ["/x/site-packages/snakemake/__main__.py", "paper", "--cores", "1", "--config",
            "corpus={'mirror': 'https://me:hunter2@host/m'}"]  # fmt: skip
    line = command_line(argv)
    assert line.startswith("snakemake paper --cores 1 --config ")
    assert "hunter2" not in line and "host/m" in line


@pytest.mark.parametrize(
    ("device", "rules", "has_cuda", "stops"),
    [
        ("cuda", {"search", "corpus"}, False, True),
        ("cuda", {"quality"}, False, True),
        ("cuda", {"aggregate", "figures", "render"}, False, False),  # a paper from copied results
        ("cuda", {"search"}, True, False),
        ("auto", {"search"}, False, False),
        ("cpu", {"cell"}, False, False),
    ],
)
def test_a_study_stops_before_work_only_when_it_would_train_without_its_gpu(
    monkeypatch, device, rules, has_cuda, stops
):
    monkeypatch.setattr("torch.cuda.is_available", lambda: has_cuda)
    argv = ["snakemake", "--cores", "all", "--resources", "gpu=1"]
    if not stops:
        check_device_here({"device": device}, rules, argv)
        return
    with pytest.raises(ConfigError) as err:
        check_device_here({"device": device}, rules, argv)
    message = str(err.value)
    assert "command: snakemake --cores all --resources gpu=1" in message
    assert "nothing was run" in message and "snakemake --profile profiles/smoke" in message
