"""The `block` knob: a technique's model with another block style than `model.arch`.

The study's model is one shape (`model`); a technique with `block: llama` (or `gpt2`) trains that
shape with the other block (memopt.runtime.model), parameters kept comparable so that the block is
the one change: the MLP's hidden width scales by 2/3 into SwiGLU's three matrices (Llama's
8/3 d_model for GPT-2's 4 d_model: 2,048 for 3,072) and back by 3/2, and a GPT-2 model gives the
Llama block one key/value head per query head (its `n_kv_heads`, when the model is a Llama, goes
with the Llama block only). Another block is another function: its seeds start from another
initialization (the batches are the same).

Torch-free: the cell's FLOPs, the paper's and the plan's arithmetic read it.
"""

from __future__ import annotations


def technique_model(model_cfg: dict, spec: dict) -> dict:
    """The model a technique trains: `model_cfg` itself unless the spec's block differs from
    its arch."""
    arch = model_cfg.get("arch", "gpt2")
    block = spec.get("block")
    block = block if isinstance(block, str) else arch  # null (NaN in a summary row): the model's
    if block == arch:
        return model_cfg
    f = model_cfg["d_ff"]
    if block == "llama":
        return {**model_cfg, "arch": "llama", "n_kv_heads": None, "d_ff": round(2 * f / 3)}
    return {**model_cfg, "arch": "gpt2", "n_kv_heads": None, "d_ff": round(3 * f / 2)}
