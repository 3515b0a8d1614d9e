"""Which function a technique computes, for the quality runs and the exactness check.

Two techniques compute the same function when they do the same arithmetic on the same inputs:
the same precision, the same attention pattern (window), the same optimizer, learning rate and
block. The attention kernel, activation checkpointing, compilation (and its memory budget), the
loss's kernel, in-backward updates, offloading, gradient accumulation and data parallelism (with
or without sharding) change how the function is computed (speed, memory), not what it is, so
they share one quality run; the exactness check verifies that they do. Torch-free: the Snakefile imports it to build the DAG.
"""

from __future__ import annotations

from memopt.knobs import KNOBS, defaults, function_knobs

FUNCTION = function_knobs()  # precision, window, optimizer, lr_scale, block: what it is
# The knobs that change how a function is computed (their subordinates follow them).
HOW = tuple(k for k in KNOBS if not k.function and not k.subordinate)


def function_of(spec: dict) -> str:
    """A short name: the precision, plus a block if set, plus the window if any, plus an
    optimizer other than AdamW, plus a learning-rate scale other than 1 (`bf16`, `bf16_llama`,
    `bf16_w128`, `fp32`, `bf16_adamw8bit`, `bf16_lr0.5`)."""
    name = spec["precision"]
    if spec.get("block") is not None:
        name += f"_{spec['block']}"
    if spec.get("window") is not None:
        name += f"_w{spec['window']}"
    optimizer = spec.get("optimizer", "adamw")
    name = name if optimizer == "adamw" else f"{name}_{optimizer}"
    scale = spec.get("lr_scale", 1.0)
    return name if scale == 1.0 else f"{name}_lr{scale:g}"


def functions(techniques: dict[str, dict]) -> dict[str, list[str]]:
    """Function name -> the techniques (config order) that compute it, in first-seen order."""
    out: dict[str, list[str]] = {}
    for name, spec in techniques.items():
        out.setdefault(function_of(spec), []).append(name)
    return out


def quality_spec(techniques: dict[str, dict], function: str) -> dict:
    """How a function's quality runs train: its precision and window, with the fastest exact
    kernel for them (`auto`, resolved and recorded at run time), no checkpointing, no compile."""
    members = functions(techniques).get(function)
    if not members:
        raise KeyError(function)
    spec = techniques[members[0]]
    # The function's knobs as its first technique sets them; every other knob at its default.
    function = {k: spec.get(k, default) for k, default in defaults().items() if k in FUNCTION}
    return defaults() | function | {"attention": "auto"}


def reference_technique(techniques: dict[str, dict], technique: str) -> str:
    """The technique the exactness check compares `technique` against: the plainest one of its
    function in the study (explicit attention, no checkpointing, no compile; then config order).
    A technique that is its own reference passes trivially."""
    members = functions(techniques)[function_of(techniques[technique])]

    def plainness(name):  # which of the how-knobs are away from their default, registry order
        return tuple(k.value_in(techniques[name]) != k.default for k in HOW)

    return min(members, key=lambda n: (plainness(n), members.index(n)))
