"""A decoder-only transformer in two block styles, side by side (`model.arch`):

- gpt2: pre-LayerNorm, GELU MLP, learned positions, biases;
- llama: pre-RMSNorm, rotary position embedding on queries and keys, SwiGLU MLP, grouped-query
  attention (`n_kv_heads` key/value heads shared by the query heads), no biases.

Both tie the output head to the token embedding and drop out on the residual paths (`dropout`),
so a block style is the only thing that changes between them. The model only knows *which* attention kernel and checkpointing policy to use; picking them from a
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
    arch: str = "gpt2"  # gpt2 | llama
    n_kv_heads: int | None = None  # llama: key/value heads (None: one per query head)
    rope_theta: float = 10000.0  # llama: the rotary embedding's base
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

    def forward(self, x):  # gpt2: positions were added to the embedding
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.fc_proj(F.gelu(self.fc(self.ln2(x)))))


def rotary_tables(seq_len: int, head_dim: int, theta: float, device) -> tuple:
    """cos and sin of every position's angles, (T, head_dim / 2) each, in FP32. Computed in the
    forward pass: tiny, and a buffer would not survive building the model on the meta device."""
    inv_freq = theta ** -(
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """The rotary embedding on x (B, H, T, D): each pair (x_i, x_{i + D/2}) turned by its
    position's angle (the GPT-NeoX and Hugging Face Llama layout), in FP32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.window = cfg.n_heads, cfg.window
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv = nn.Linear(cfg.d_model, 2 * self.n_kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.attend = IMPLEMENTATIONS[cfg.attention]

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2 * self.n_kv_heads, self.head_dim).transpose(1, 2).chunk(2, 1)
        # Fewer key/value heads than query heads: every kernel shares them (grouped-query).
        y = self.attend(rotate(q, cos, sin), rotate(k, cos, sin), v, self.window)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.ln2 = nn.RMSNorm(cfg.d_model, eps=1e-5)
        self.attn = LlamaAttention(cfg)
        self.fc = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)  # gate and up, one matmul
        self.fc_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin):
        x = x + self.drop(self.attn(self.ln1(x), cos, sin))
        gate, up = self.fc(self.ln2(x)).chunk(2, dim=-1)
        return x + self.drop(self.fc_proj(F.silu(gate) * up))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.llama = cfg.arch == "llama"
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = None if self.llama else nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        block = LlamaBlock if self.llama else Block
        self.blocks = nn.ModuleList(block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.RMSNorm(cfg.d_model, eps=1e-5) if self.llama else nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied input/output embedding
        self.apply(self._init)
        for name, p in self.named_parameters():  # scale residual projections by depth (GPT-2; both)
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
        if self.llama:
            x, extra = (
                self.drop(self.tok(idx)),
                rotary_tables(
                    T, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta, idx.device
                ),
            )
        else:
            x, extra = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device))), ()
        for i, block in enumerate(self.blocks):
            if self.training and self.checkpointed(i):
                # Non-reentrant checkpointing restores the RNG state, so dropout masks replay exactly.
                if self.cfg.checkpointing == "selective":
                    x = checkpoint(
                        block, x, *extra, use_reentrant=False, context_fn=_selective_context
                    )
                else:
                    x = checkpoint(block, x, *extra, use_reentrant=False)
            else:
                x = block(x, *extra)
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
    key = (cfg.arch, cfg.vocab_size, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads,
           cfg.d_ff, cfg.seq_len, cfg.rope_theta, seed)  # fmt: skip
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
