"""Issue 31, findings 7 and 8: nothing memopt reads is trusted, and a mistake a user can fix ends
in one message that names the file or key, never a traceback: token files against meta.json, the
tokenizer model, non-finite numbers in result JSONs, and the `memopt` command's arguments."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import write_random_tokens

from memopt.data.tokenizer import load_model
from memopt.data.tokens import TokenData
from memopt.errors import MemoptError
from memopt.fileio import ensure_writable, read_json, write_json
from memopt.jobs.pipeline import check_batch_entry, resolve_batch
from memopt.report.results import aggregate

ROOT = Path(__file__).resolve().parents[1]


def test_intact_token_files_load(tmp_path):
    data = TokenData(write_random_tokens(tmp_path))
    assert len(data.train) == 40_000 and len(data.val) == 4_000


@pytest.mark.parametrize(
    "keep_bytes, fragment",
    [
        (2_000, "holds 2,000 bytes (1,000 uint16 tokens), meta.json says 40,000 tokens"),
        (2_001, "holds 2,001 bytes (1,000.5 uint16 tokens)"),  # numpy would raise on the odd size
    ],
)
def test_a_truncated_token_file_is_refused_by_name(tmp_path, keep_bytes, fragment):
    write_random_tokens(tmp_path)
    train = tmp_path / "train.bin"
    train.write_bytes(train.read_bytes()[:keep_bytes])
    with pytest.raises(MemoptError) as err:
        TokenData(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{train}: ") and fragment in message
    assert "snakemake --forcerun tokens" in message


COUNTS = {"train_tokens": 40_000, "val_tokens": 4_000}


@pytest.mark.parametrize(
    "meta, fragment",
    [
        ({"vocab_size": 300, "dtype": "uint16"}, "train_tokens is None, not a positive integer"),
        (
            {"vocab_size": 300, "dtype": "float32", **COUNTS},
            "dtype 'float32' is not one of uint16, uint32",
        ),
        (
            {"vocab_size": 70_000, "dtype": "uint16", **COUNTS},
            "vocab_size 70000 does not fit dtype uint16",
        ),
    ],
)
def test_a_meta_json_that_cannot_describe_the_files(tmp_path, meta, fragment):
    write_random_tokens(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(MemoptError, match=fragment):
        TokenData(tmp_path)


def test_a_damaged_tokenizer_model_is_refused_by_name(tmp_path):
    import sentencepiece as spm

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"zdanie numer {i} o kocie i psie" for i in range(400)))
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "spm"), vocab_size=60, minloglevel=2
    )
    model = tmp_path / "spm.model"
    assert load_model(model).get_piece_size() == 60
    intact = model.read_bytes()
    model.write_bytes(intact[:1000])  # unchecked, sentencepiece reads what is left (or fails)
    with pytest.raises(MemoptError) as err:
        load_model(model)
    assert str(err.value).startswith(f"{model}: not a sentencepiece model")
    assert "snakemake --forcerun tokenizer" in str(err.value)
    # With the record train_tokenizer writes beside it, any change is caught.
    record = {"vocab_size": 60, "sha256": hashlib.sha256(intact).hexdigest()}
    model.with_suffix(".json").write_text(json.dumps(record))
    for damaged in (intact[:500], intact[:-3], intact[:1000]):
        model.write_bytes(damaged)
        with pytest.raises(MemoptError, match="SHA-256 differs from the one spm.json recorded"):
            load_model(model)
    model.write_bytes(intact)
    assert load_model(model).get_piece_size() == 60


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_result_json_with_a_non_finite_number_is_refused_by_name(tmp_path, constant):
    search = tmp_path / "search" / "flash.json"
    search.parent.mkdir()
    search.write_text('{"max_batch": 8, "fit": {"slope_mib": %s}}' % constant)
    with pytest.raises(MemoptError) as err:
        resolve_batch("max", search, None)
    assert str(err.value).startswith(f"{search}: not valid JSON")
    assert f"a non-finite number ({constant})" in str(err.value)
    cell = tmp_path / "cells" / "flash" / "max.json"
    cell.parent.mkdir(parents=True)
    cell.write_text('{"status": "ok", "tokens_per_s": %s}' % constant)
    with pytest.raises(MemoptError, match="max.json: not valid JSON"):
        aggregate([cell], tmp_path / "summary.csv")
    assert not (tmp_path / "summary.csv").exists()


def test_a_truncated_result_json_says_what_to_do(tmp_path):
    path = tmp_path / "cell.json"
    path.write_text('{"status": "ok", "tokens_')
    with pytest.raises(MemoptError, match="delete it and rerun"):
        read_json(path)


def test_no_non_finite_number_is_written(tmp_path):
    with pytest.raises(MemoptError, match="refusing to write .*out.json"):
        write_json(tmp_path / "out.json", {"loss": float("nan")})
    assert not (tmp_path / "out.json").exists()
    write_json(tmp_path / "out.json", {"loss": None})  # what a result records instead


def test_an_unwritable_output_is_found_before_the_work(tmp_path):
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "file" / "out.json", tmp_path):
        with pytest.raises(MemoptError, match=f"cannot write {bad}"):
            ensure_writable(bad)
    ensure_writable(tmp_path / "new" / "out.json")
    assert [p.name for p in (tmp_path / "new").iterdir()] == []  # the probe is gone


@pytest.mark.parametrize("entry", ["0", "-3", "²", "1.5", "biggest"])
def test_batch_entries_are_same_max_or_a_positive_number(entry):
    with pytest.raises(MemoptError, match="allowed: same, max, or a number >= 1"):
        check_batch_entry(entry)
    assert check_batch_entry(16) == "16" and check_batch_entry("max") == "max"


def test_the_command_line_refuses_bad_arguments_with_one_message(tmp_path, memopt_cli):
    tokens = write_random_tokens(tmp_path)
    config = tmp_path / "study.yaml"
    study = {
        "device": "cpu",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 16},
        "search": {"cpu_memory_budget_gib": 0.01},
        "techniques": {"baseline": {}},
    }
    config.write_text(json.dumps(study))
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "file").write_text("")
    cell = ["cell", "baseline", "--config", config, "--tokens", tokens]
    cases = [
        ([*cell, "0"], "batch entry '0' is not allowed; allowed: same, max, or a number >= 1"),
        (
            [*cell, "4", "--threads", "-1"],
            "--threads: '-1' is not allowed; allowed: an integer >= 1",
        ),
        (["validate", "--config", tmp_path / "binary.yaml"], "not UTF-8 text"),
        (
            [*cell, "4", "--out", tmp_path / "file" / "cell.json"],
            f"cannot write {tmp_path / 'file' / 'cell.json'}: {tmp_path / 'file'} is a file",
        ),
    ]
    for args, fragment in cases:
        proc = memopt_cli(*args, cwd=tmp_path)
        assert proc.returncode in (1, 2), (args, proc.stdout)
        assert fragment in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout, args
    assert not (tmp_path / "results").exists()  # no cell was written, not even an "oom" one
