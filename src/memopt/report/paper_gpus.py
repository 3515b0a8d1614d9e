"""Where a study ran: every GPU its jobs used (model, UUID, host), and whether the timing cells,
which the paper compares with one another, ran on more than one GPU model."""

from __future__ import annotations

KINDS = ("cells", "searches", "quality")


def _key(prov: dict) -> tuple | None:
    if not prov.get("gpu") and not prov.get("gpu_uuid"):
        return None  # a CPU job, or a result from before provenance named the GPU
    return prov.get("gpu"), prov.get("gpu_uuid"), prov.get("host")


def _flat(row: dict) -> dict:
    """The provenance of a summary.csv or quality.csv row (provenance_<key> columns)."""
    return {k.removeprefix("provenance_"): v for k, v in row.items() if k.startswith("provenance_")}


def gpus_used(cells: list[dict], searches: list[dict], runs: list[dict]) -> dict:
    """{"gpus": one entry per GPU with how many cells, searches and quality runs it ran;
    "unrecorded": per kind, the jobs whose result names no GPU (a CPU, or an older memopt);
    "labels": a short name per GPU UUID ("GPU 1", ...), "cell_models": the GPU models of the timing
    cells, "mixed": whether there are several, "split": whether the timing cells ran on more than
    one GPU (by UUID: two cards of one model differ too)}."""
    jobs = {
        "cells": [_flat(c) for c in cells if not c.get("measured_as")],  # a copy is not a job
        "searches": [s.get("provenance") or {} for s in searches],
        "quality": [_flat(r) for r in runs],
    }
    gpus: dict[tuple, dict] = {}
    unrecorded = dict.fromkeys(KINDS, 0)
    for kind in KINDS:
        for prov in jobs[kind]:
            key = _key(prov)
            if key is None:
                unrecorded[kind] += 1
                continue
            entry = gpus.setdefault(
                key, {"model": key[0], "uuid": key[1], "host": key[2]} | dict.fromkeys(KINDS, 0)
            )
            entry[kind] += 1
    models = sorted({p["gpu"] for p in jobs["cells"] if p.get("gpu")})
    ordered = sorted(gpus.values(), key=lambda g: (-g["cells"], -g["searches"], str(g["uuid"])))
    for i, g in enumerate(ordered, 1):
        g["label"] = f"GPU {i}"
    cell_gpus = {_key(p) for p in jobs["cells"]} - {None}
    return {
        "gpus": ordered,
        "labels": {g["uuid"]: g["label"] for g in ordered},
        "cell_models": models,
        "cell_gpus": len(cell_gpus),
        "unrecorded": {k: n for k, n in unrecorded.items() if n},
        "mixed": len(models) > 1,
        "split": len(cell_gpus) > 1,
    }
