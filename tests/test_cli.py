"""The `memopt` command in its own terms: defaults in every --help, a one-line validate, no silent
overwrite of a workflow result, messages that name its own options (issue 32)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import write_random_tokens

from memopt.run import cli

ROOT = Path(__file__).resolve().parents[1]


def memopt(*args, cwd) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "memopt.run.cli", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_option_shows_its_default_in_help():
    subs = _subparsers(cli.build_parser())
    assert set(subs) == {"validate", "search", "cell", "plan", "paper", "unlock"}
    for name, sub in subs.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if action.help is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings or action.nargs == "?":
                flag = action.option_strings[0] if action.option_strings else action.dest
                assert f"(default: {action.default})" in text, (name, flag, text)


def _study(tmp_path: Path, **extra) -> Path:
    study = {
        "device": "cpu",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 16},
        "search": {"cpu_memory_budget_gib": 0.01},
        "techniques": {"baseline": {}},
    } | extra
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(study))
    return path


def test_validate_says_valid_in_one_line_and_shows_the_filled_config_on_request(
    tmp_path, memopt_cli
):
    config = _study(tmp_path)
    proc = memopt_cli("validate", "--config", config, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith(f"{config}: valid")
    shown = memopt_cli("validate", "--config", config, "--show", cwd=tmp_path)
    filled = yaml.safe_load(shown.stdout)
    assert filled["study"] == "default" and filled["train"]["lr"] == 5e-4  # defaults filled
    assert filled["model"]["d_model"] == 16  # and the config's own values kept


def test_search_and_cell_refuse_to_replace_a_workflow_result_without_force(tmp_path, memopt_cli):
    tokens = write_random_tokens(tmp_path / "data" / "tokens")
    config = _study(tmp_path)
    existing = {
        ("search", "baseline"): tmp_path / "results/search/baseline.json",
        ("cell", "baseline", "4"): tmp_path / "results/cells/baseline/4.json",
    }
    for args, path in existing.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"kept": true}')
        proc = memopt_cli(*args, "--config", config, "--tokens", tokens, cwd=tmp_path)
        assert proc.returncode == 1, proc.stdout
        assert f"--out {path.relative_to(tmp_path)} exists" in proc.stderr
        assert "--force" in proc.stderr and "Traceback" not in proc.stderr
        assert path.read_text() == '{"kept": true}'
    # --force replaces it (a real search on random tokens, a second or two)
    args = ("search", "baseline", "--config", config, "--tokens", tokens, "--force")
    proc = memopt_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(existing["search", "baseline"].read_text())["max_batch"] >= 1


def test_no_gpu_message_speaks_the_commands_terms(tmp_path, monkeypatch, capsys):
    config = _study(tmp_path, device="cuda")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "baseline", "--config", str(config), "--out", str(tmp_path / "x")])
    message = capsys.readouterr().err
    assert stop.value.code == 1
    assert "device 'cuda'" in message and "--config config/smoke.yaml" in message
    assert "snakemake" not in message and not (tmp_path / "x").exists()


def test_paper_with_missing_results_asks_whether_the_config_matches(tmp_path, memopt_cli):
    config = _study(tmp_path)
    (tmp_path / "results").mkdir()
    proc = memopt_cli("paper", "--config", config, "--results", tmp_path / "results", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "result(s) missing" in proc.stderr
    assert f"--config {config}: is that the config these results were made with?" in proc.stderr


def test_unlock_takes_the_studys_folder(tmp_path):
    proc = memopt("unlock", tmp_path / "nowhere", cwd=tmp_path)
    assert proc.returncode == 1 and "is not a directory" in proc.stderr
    (tmp_path / "runs/smoke/.snakemake/locks").mkdir(parents=True)
    (tmp_path / "runs/smoke/.snakemake/locks/0.input.lock").write_text("")
    proc = memopt("unlock", "runs/smoke", "--wait", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "removed the Snakemake lock" in proc.stdout
    assert not any((tmp_path / "runs/smoke/.snakemake/locks").iterdir())
