"""A map study's points (config key `map`): every named model at every sequence length, each the
study's `model` with that model's keys and that length. Torch-free: the workflow names its jobs
from it, the config rules check every point's shape with it."""

from __future__ import annotations


def map_points(cfg: dict) -> dict[str, dict]:
    """{point name: its model config} in the config's order (models, then lengths), or {} when
    the study has no map. A point is named `<model>_<seq_len>`, e.g. llama_350m_4096."""
    plan = cfg.get("map")
    if not plan:
        return {}
    return {
        f"{name}_{seq_len}": {**cfg["model"], **overrides, "seq_len": seq_len}
        for name, overrides in plan["models"].items()
        for seq_len in plan["seq_lens"]
    }


def point_study(cfg: dict, point: str) -> dict:
    """The study as one point's jobs see it: its model in place of the study's."""
    return {**cfg, "model": map_points(cfg)[point]}


def point_models(cfg: dict) -> dict[str, str]:
    """{point name: the name of its model in map.models}."""
    plan = cfg.get("map") or {"models": {}, "seq_lens": []}
    return {f"{name}_{n}": name for name in plan["models"] for n in plan["seq_lens"]}


def map_reference(cfg: dict) -> str:
    """The technique the map's findings compare every other with: `map.reference`, else the
    study's baseline."""
    return (cfg["map"] or {}).get("reference") or cfg["baseline"]
