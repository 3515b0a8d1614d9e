"""FLOPs per trained token, from the model's shape: what the model needs (model FLOPs, for MFU)
and what a technique's recomputation adds (hardware FLOPs, for HFU). Torch-free: the paper
computes HFU from the results.

MFU counts useful work only, so it hides what checkpointing costs; HFU counts every FLOP the
hardware ran, recomputation included (the Megatron-LM and PyTorch FSDP write-ups report both).
"""

from __future__ import annotations


def block_matmul_params(model_cfg: dict) -> int:
    """Weights of one block's matrix multiplications.

    gpt2: Q, K, V and output projections (4 d^2) and a two-matrix MLP (2 d d_ff); llama: Q and
    output (2 d^2), K and V for n_kv_heads heads (2 d n_kv d / n_heads) and SwiGLU's three
    matrices (3 d d_ff)."""
    d, f = model_cfg["d_model"], model_cfg["d_ff"]
    if model_cfg.get("arch", "gpt2") != "llama":
        return 4 * d * d + 2 * d * f
    heads = model_cfg["n_heads"]
    kv = model_cfg.get("n_kv_heads") or heads
    return 2 * d * d + 2 * d * (kv * (d // heads)) + 3 * d * f


def matmul_params(model_cfg: dict, vocab_size: int) -> int:
    """N_matmul: every block's matmul weights and the (tied) output head, d * vocabulary."""
    return (
        model_cfg["n_layers"] * block_matmul_params(model_cfg) + model_cfg["d_model"] * vocab_size
    )


def param_count(model_cfg: dict, vocab_size: int) -> int:
    """Trainable parameters: the token embedding (the output head shares it), the blocks'
    matmul weights, and per arch: gpt2 adds learned positions, the biases of every linear layer
    and two LayerNorms per block (weight and bias) plus a final one; llama has no biases and no
    position table, and RMSNorms with a weight only."""
    d, L, f = (model_cfg[k] for k in ("d_model", "n_layers", "d_ff"))
    weights = vocab_size * d + L * block_matmul_params(model_cfg)
    if model_cfg.get("arch", "gpt2") == "llama":
        return weights + L * 2 * d + d
    biases = 3 * d + d + f + d
    return weights + model_cfg["seq_len"] * d + L * (biases + 4 * d) + 2 * d


def flops_per_token(model_cfg: dict, vocab_size: int, window: int | None) -> float:
    """Model FLOPs per trained token (forward + backward; recomputation is not counted).

    6 * N_matmul (every weight matrix, the tied output head included) plus attention's two
    matmuls: 4 * d_model * keys per layer forward, times 3 with the backward pass, where keys is
    the average number of keys a query sees (causal: (T + 1) / 2; with window W: min(i + 1, W)).
    Grouped-query attention shares keys and values, not the scores: every query head still
    multiplies, so the attention term is the same for both block styles.
    """
    return 6 * matmul_params(model_cfg, vocab_size) + attention_flops_per_token(model_cfg, window)


def attention_flops_per_token(model_cfg: dict, window: int | None) -> float:
    """Attention's two matmuls per trained token (forward + backward), over the keys a query
    sees on average: (T + 1) / 2 causally, fewer with a window."""
    d, L, T = (model_cfg[k] for k in ("d_model", "n_layers", "seq_len"))
    w = T if window is None else min(window, T)
    keys = (w * (w + 1) / 2 + (T - w) * w) / T
    return 12 * L * d * keys


def recompute_flops_per_token(model_cfg: dict, vocab_size: int, spec: dict) -> float | None:
    """FLOPs per token that `spec`'s recomputation adds to the model FLOPs (forward passes run
    again in the backward pass); None where the amount is not known from the knobs.

    - checkpointing full / every_k: each checkpointed block's forward again: 2 FLOPs per weight
      of its matmuls plus attention's two matmuls, 4 * d_model * keys (see flops_per_token);
      `selective` keeps the matmuls and attention and recomputes only elementwise work: nothing.
    - loss chunked and cce: the logits again, 2 * d_model * vocabulary (liger computes the
      gradients in its forward pass: nothing).
    - compile with a memory budget: the compiler chooses what to recompute: unknown (None).
    """
    if spec.get("compile") and spec.get("compile_memory_budget") is not None:
        return None
    d, L, f, T = (model_cfg[k] for k in ("d_model", "n_layers", "d_ff", "seq_len"))
    mode = spec.get("checkpointing", "none")
    if mode == "full":
        blocks = L
    elif mode == "every_k":
        blocks = len(range(0, L, spec.get("checkpoint_every", 2)))  # blocks 0, k, 2k, ...
    else:
        blocks = 0
    w = T if spec.get("window") is None else min(spec["window"], T)
    keys = (w * (w + 1) / 2 + (T - w) * w) / T
    extra = blocks * (2 * block_matmul_params(model_cfg) + 4 * d * keys)
    if spec.get("loss") in ("chunked", "cce"):
        extra += 2 * d * vocab_size
    return extra
