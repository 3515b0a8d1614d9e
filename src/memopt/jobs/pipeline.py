"""File-level steps shared by the Snakemake scripts and the `memopt` command: read inputs, call the
library, write one result file. No logic of their own beyond resolving a batch entry."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from memopt.data.tokens import TokenData
from memopt.errors import MemoptError
from memopt.fileio import ensure_writable
from memopt.jobs.cell import run_cell
from memopt.jobs.quality import add_floor, run_exactness, run_quality
from memopt.jobs.search import search_max_batch
from memopt.report.results import alias_cell, read_json, write_json
from memopt.runtime import parallel
from memopt.runtime.functions import reference_technique
from memopt.runtime.techniques import resolve_device


def check_batch_entry(entry: str | int) -> str:
    """A batch entry as text: `same`, `max` or a whole number >= 1; else a MemoptError."""
    entry = str(entry)
    if entry not in ("same", "max") and not (entry.isascii() and entry.isdigit() and int(entry)):
        raise MemoptError(
            f"batch entry {entry!r} is not allowed; allowed: same, max, or a number >= 1"
        )
    return entry


def resolve_batch(entry: str | int, search_json: Path | None, baseline_json: Path | None) -> int:
    """`same` -> the baseline's maximum batch, `max` -> the technique's own, a number -> itself."""
    entry = check_batch_entry(entry)
    if entry.isdigit():
        return int(entry)
    path = {"same": baseline_json, "max": search_json}.get(entry)
    if path is None or not Path(path).exists():
        raise MemoptError(f"batch entry {entry!r} needs the search result {path}; run the search")
    return int(read_json(path)["max_batch"])


def _setup(cfg: dict, threads: int | None) -> str:
    if threads:
        torch.set_num_threads(threads)
    # Before anything touches CUDA: the allocator reads its settings once, at its first use.
    conf = cfg["measure"]["cuda_alloc_conf"]
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF", conf) != conf:
        print(f"memopt: PYTORCH_CUDA_ALLOC_CONF replaced by measure.cuda_alloc_conf={conf!r}")
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return resolve_device(cfg["device"])


def search_file(
    cfg: dict,
    technique: str,
    tokens_dir: Path,
    out: Path,
    threads: int | None = None,
    exactness_out: Path | None = None,
) -> dict:
    """The technique's maximum batch -> out; with exactness_out, first its exactness run (same
    process: a second job would pay another Python, torch and CUDA start)."""
    for path in filter(None, (out, exactness_out)):
        ensure_writable(Path(path))  # now, not after the work
    device = _setup(cfg, threads)
    data = TokenData(Path(tokens_dir))
    if exactness_out is not None:  # (kept across a parallel search's launches)
        exact = parallel.saved("exactness") or run_exactness(cfg, technique, data, device)
        if (
            cfg["exactness"].get("floor", "none") != "none"
            and "floor" not in exact
            and (reference_technique(cfg["techniques"], technique) == technique)
        ):
            exact = add_floor(cfg, exact, data, device)
        parallel.save("exactness", exact)
        first, last = (
            "non-finite" if x is None else f"{x:.4f}"
            for x in (exact["losses"][0], exact["losses"][-1])
        )
        print(
            f"[exactness {technique}] {exact['steps']} steps at batch {exact['batch_size']}: "
            f"loss {first} -> {last}"
        )
    result = search_max_batch(cfg, technique, data, device)
    if parallel.is_main():  # one rank writes a parallel technique's results
        write_json(Path(out), result)
        if exactness_out is not None:
            write_json(Path(exactness_out), exact)
    return result


def quality_file(
    cfg: dict, function: str, seed: int, tokens_dir: Path, out: Path, threads: int | None = None
) -> dict:
    ensure_writable(Path(out))
    device = _setup(cfg, threads)
    result = run_quality(cfg, function, int(seed), TokenData(Path(tokens_dir)), device)
    done = f"val loss {result['val_loss']:.4f}" if result["status"] == "ok" else result["error"]
    print(
        f"[quality {function} seed {seed}] {result['steps']} steps at batch "
        f"{result['batch_size']} (kernel {result.get('kernel', '-')}): {done}"
    )
    write_json(Path(out), result)
    return result


def check_same_gpu_model(searches: list[Path], device: str) -> None:
    """A cell trains at a batch its search found: on another GPU model that batch proves nothing
    (a search without provenance, from before it was recorded, is not checked)."""
    here = torch.cuda.get_device_name() if device == "cuda" else None
    for path in searches:
        if not path.exists():
            continue
        prov = read_json(path).get("provenance")
        if prov is not None and prov.get("gpu") != here:
            raise MemoptError(
                f"{path} was searched on {prov.get('gpu') or 'a CPU'}, this cell runs on "
                f"{here or 'a CPU'}: a maximum batch holds only on the GPU model it was searched "
                f"on. Rerun the search here (snakemake --forcerun {path}), pin the study to one "
                "model (CUDA_VISIBLE_DEVICES, a SLURM constraint), or set mixed_gpus: allow "
                "(allowed: refuse, allow)"
            )


def cell_file(
    cfg: dict,
    technique: str,
    entry: str,
    tokens_dir: Path,
    search_dir: Path,
    out: Path,
    threads: int | None = None,
    same_cell: Path | None = None,
) -> dict:
    """One timing cell -> out. With same_cell (another entry's cell of this technique) at the
    batch this entry resolves to, that run is written again under this entry instead."""
    check_batch_entry(entry)
    ensure_writable(Path(out))
    device = _setup(cfg, threads)
    search_dir = Path(search_dir)
    own, baseline = search_dir / f"{technique}.json", search_dir / f"{cfg['baseline']}.json"
    if cfg.get("mixed_gpus", "refuse") == "refuse":  # the search this entry's batch comes from
        check_same_gpu_model({"max": [own], "same": [baseline]}.get(entry, []), device)
    batch = resolve_batch(entry, own, baseline)
    if same_cell is not None and read_json(Path(same_cell)).get("batch_size") == batch:
        print(
            f"[cell {technique} {entry}] batch {batch} is the {Path(same_cell).stem} cell's: reused"
        )
        return alias_cell(Path(same_cell), Path(out), entry)
    snapshot = (  # rank 0's alone under several GPUs
        Path(out).with_suffix(".memory.pickle")
        if cfg["measure"]["memory_snapshot"] and parallel.is_main()
        else None
    )
    result = run_cell(cfg, technique, entry, batch, TokenData(Path(tokens_dir)), device, snapshot)
    if parallel.is_main():
        write_json(Path(out), result)
    return result
