"""What a study checks before its first job runs: the folder is its own, and its device is here.

A study's outputs (data/, results/, paper/, logs/) live in one folder: the repository itself for
the default study, `runs/<name>/` for a study run through its profile (`snakemake --profile
profiles/<name>`, whose `directory:` names the folder). The first run of a study claims its folder
by writing the study's name to `.memopt-study`; a run of another study there stops before the DAG
runs a job, so one study never deletes or overwrites another study's results.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from memopt.errors import ConfigError
from memopt.redact import redact

STAMP = ".memopt-study"
TRAINING_RULES = ("search", "cell", "quality")


def folder_owner(folder: Path) -> str | None:
    """The study that claimed `folder`, or None when none has."""
    stamp = Path(folder) / STAMP
    if not stamp.is_file():
        return None
    return stamp.read_text(encoding="utf-8").strip() or None


def check_folder(name: str, folder: Path) -> None:
    """Stop when `folder` holds another study's outputs: the message says where each study runs."""
    owner = folder_owner(folder)
    if owner is None or owner == name:
        return
    raise ConfigError(
        f"study: {name!r}, but this folder ({Path(folder).resolve()}) holds the outputs of study "
        f"{owner!r} ({STAMP}); running {name!r} here would delete or overwrite them. Each study "
        "runs in a folder of its own: the smoke study through its profile (snakemake --profile "
        "profiles/smoke, in runs/smoke/), the default study in the repository's folder, any other "
        f"through a profile whose `directory:` names its folder (or snakemake --directory "
        f"runs/{name} ...). To give this folder to {name!r}, delete study {owner!r}'s outputs "
        f"(data/ results/ paper/ logs/ {STAMP}) first"
    )


def claim_folder(name: str, folder: Path) -> None:
    """Record that `folder` holds study `name`'s outputs (atomically; a no-op when it does)."""
    if folder_owner(folder) == name:
        return
    stamp = Path(folder) / STAMP
    tmp = stamp.with_name(f"{STAMP}.{os.getpid()}.tmp")
    tmp.write_text(name + "\n", encoding="utf-8")
    os.replace(tmp, stamp)


def command_line(argv: list[str]) -> str:
    """The command as the user typed it (credentials redacted), to repeat in a message."""
    prog = Path(argv[0]).name if argv else "snakemake"
    if prog in ("__main__.py", "snakemake"):
        prog = "snakemake"
    return redact(shlex.join([prog, *argv[1:]]))


def check_device_here(study: dict, planned_rules: set[str], argv: list[str]) -> None:
    """Before any job of a local run: a study whose device is `cuda` needs a CUDA GPU here when
    it plans a training job (a paper re-rendered from copied results needs none). One message,
    with the command in use, instead of building the data first and failing at the first search."""
    if study["device"] != "cuda" or not planned_rules & set(TRAINING_RULES):
        return
    import torch

    if torch.cuda.is_available():
        return
    build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
    raise ConfigError(
        f"device: 'cuda', but this machine has no CUDA GPU that torch can use ({build}); "
        f"nothing was run.\n  command: {command_line(argv)}\n"
        "Without a GPU, run the CPU smoke study instead: snakemake --profile profiles/smoke\n"
        "or set device: auto (or cpu) in the study's config to train this study on the CPU, "
        "slowly. On a cluster, submit the jobs to GPU nodes: snakemake --profile profiles/slurm"
    )
