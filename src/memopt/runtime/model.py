"""A decoder-only transformer: pre-LayerNorm, GELU MLP, learned positions, tied embeddings, dropout.

The model only knows *which* attention kernel and checkpointing policy to use; picking them from a
technique's knobs happens in memopt.runtime.techniques.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from memopt.runtime.attention import IMPLEMENTATIONS
from memopt.runtime.losses import output_loss


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    seq_len: int
    dropout: float = 0.0
    attention: str = "math"  # a concrete kernel name from memopt.runtime.attention.IMPLEMENTATIONS
    window: int | None = None
    checkpointing: str = "none"  # none | full | every_k | selective
    checkpoint_every: int = 2
    loss: str = "standard"  # standard | chunked | liger | cce (memopt.runtime.losses)
    loss_chunk: int = 4096  # rows whose logits exist at a time, for loss chunked


# Selective checkpointing keeps what is expensive to recompute (matmuls, attention) and recomputes
# the cheap, memory-heavy elementwise ops (LayerNorm, GELU, dropout, residual adds).
_SAVED_OPS = {
    getattr(torch.ops.aten, name).default
    for name in (
        "mm",
        "addmm",
        "_scaled_mm",  # FP8 matmuls (precision fp8)
        "bmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(torch.ops.aten, name)
}


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_selective_policy)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.window = cfg.n_heads, cfg.window
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attend = IMPLEMENTATIONS[cfg.attention]

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v, self.window)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc_proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.fc_proj(F.gelu(self.fc(self.ln2(x)))))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied input/output embedding
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("attn.proj.weight", "fc_proj.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def checkpointed(self, i: int) -> bool:
        mode = self.cfg.checkpointing
        return mode in ("full", "selective") or (
            mode == "every_k" and i % self.cfg.checkpoint_every == 0
        )

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device)))
        for i, block in enumerate(self.blocks):
            if self.training and self.checkpointed(i):
                # Non-reentrant checkpointing restores the RNG state, so dropout masks replay exactly.
                if self.cfg.checkpointing == "selective":
                    x = checkpoint(block, x, use_reentrant=False, context_fn=_selective_context)
                else:
                    x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        x = self.ln_f(x)
        if targets is not None and self.cfg.loss != "standard":
            return output_loss(self.cfg.loss, x, self.head.weight, targets, self.cfg.loss_chunk)
        logits = self.head(x)
        if targets is None:
            return logits
        # No explicit .float(): under BF16 autocast log_softmax reads the 16-bit logits and computes
        # in FP32 itself, so no FP32 copy of the (tokens x vocab) logits is ever materialized.
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


_INITIAL: dict[tuple, dict] = {}  # initial weights per (shapes, seed), kept for this process


def forget_initial() -> None:
    """No initial weights kept, as in a new process (the warm worker, between jobs)."""
    _INITIAL.clear()


def build_model(cfg: ModelConfig, seed: int, device: str) -> Decoder:
    """Identical initial weights for every technique: seeded, initialized on the CPU once per
    process and shapes, then copied (a search builds one model per trial)."""
    key = (cfg.vocab_size, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.seq_len, seed)
    if key not in _INITIAL:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _INITIAL.clear()  # one set at a time: a process uses one model
            _INITIAL[key] = Decoder(cfg).state_dict()
    with torch.device("meta"):
        model = Decoder(cfg)
    model.to_empty(device=device)
    model.head.weight = model.tok.weight  # to_empty unties them
    model.load_state_dict(_INITIAL[key])
    return model


def n_params(model: nn.Module) -> int:
    """Unique parameters (the tied embedding counted once)."""
    return sum(p.numel() for p in model.parameters())
