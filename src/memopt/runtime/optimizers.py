"""The `optimizer` and `optimizer_in_backward` knobs.

- adamw: torch.optim.AdamW, betas (0.9, 0.95), fused on CUDA: the study's default. Two FP32 state
  tensors (the moments) per parameter.
- adamw8bit / adamw4bit: torchao.optim.AdamW8bit / AdamW4bit (torchao, a dependency: the default study uses 8-bit AdamW): the moments
  block-wise quantized to 8 or 4 bits. A different arithmetic, so a function of its own
  (memopt.runtime.functions).
- adafactor: torch.optim.Adafactor: the second moment factored into row and column statistics of
  each matrix, no first moment. Its learning rate is relative (an update is scaled by the
  parameter's RMS), so it runs at ADAFACTOR_LR_SCALE x train.lr: 1e-2, torch's default, at the
  default 5e-4. A function of its own.
- sgd: torch.optim.SGD with momentum 0.9: one state tensor per parameter. A function of its own.

Weight decay applies to matrices only (not to biases, LayerNorm or other 1-D parameters).

optimizer_in_backward: each parameter is updated by its own optimizer in its post-accumulate-grad
hook, as soon as its gradient is complete, and the gradient is freed right away: the gradients
of the whole model never exist at once. The arithmetic is that of the ordinary step, except for
global gradient-norm clipping, which needs every gradient at once: the config refuses
optimizer_in_backward with train.grad_clip > 0 rather than skip the clipping (memopt.config).
Under torch.compile the backward is one compiled graph whose gradients all arrive together, so
the hooks run only after it: the same updates, without the memory saving.
"""

from __future__ import annotations

import torch

from memopt.errors import KernelUnavailable

BETAS = (0.9, 0.95)
ADAFACTOR_LR_SCALE = 20.0  # a group's lr_scale: the training step sets lr = schedule x lr_scale


def _build(
    name: str, groups: list[dict], lr: float, device: str, shard: str = "none"
) -> torch.optim.Optimizer:
    if (
        name == "adamw" and shard == "optimizer"
    ):  # ZeRO-1 (memopt.runtime.parallel; config: AdamW only)
        from memopt.runtime.parallel import zero_optimizer

        return zero_optimizer(groups, torch.optim.AdamW, lr=lr, betas=BETAS, fused=device == "cuda")
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=BETAS, fused=device == "cuda")
    if name == "adafactor":
        groups = [{**g, "lr_scale": g.get("lr_scale", 1.0) * ADAFACTOR_LR_SCALE} for g in groups]
        return torch.optim.Adafactor(groups, lr=lr * ADAFACTOR_LR_SCALE)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    try:
        from torchao.optim import AdamW4bit, AdamW8bit
    except ImportError as err:
        raise KernelUnavailable(
            f"optimizer {name!r} needs torchao's low-bit AdamW, and torchao is not installed "
            f"(pip install torchao, or pip install -e . in this repository); allowed without "
            "it: adamw, adafactor, sgd"
        ) from err
    return (AdamW8bit if name == "adamw8bit" else AdamW4bit)(groups, lr=lr, betas=BETAS)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds; a tensor subclass (torchao's quantized optimizer states report their
    logical FP32 size) by the tensors it is made of."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()  # (a DTensor's local shard: FSDP2)
        inner = (getattr(t, name) for name in names)
        return sum(tensor_bytes(x) for x in inner if isinstance(x, torch.Tensor))
    return t.numel() * t.element_size()


def state_bytes(opt) -> int:
    """The optimizer's state in bytes (its tensors; step counters included); this rank's share
    under ZeRO-1 (its inner optimizer), a sharded parameter's local shard under FSDP2."""
    return sum(
        tensor_bytes(t)
        for state in getattr(opt, "optim", opt).state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


class InBackward:
    """One optimizer per parameter, stepped in the parameter's post-accumulate-grad hook. It
    offers what the training step uses of an optimizer: param_groups (the learning rate is set
    before each forward pass), state (for the memory breakdown), step and zero_grad (no-ops: the
    hooks did both)."""

    def __init__(self, groups: list[dict], build):
        self.optimizers = []
        for group in groups:
            for p in group["params"]:
                opt = build([{**group, "params": [p]}])
                self.optimizers.append(opt)
                p.register_post_accumulate_grad_hook(self._hook(opt))

    @staticmethod
    def _hook(opt):
        def hook(param: torch.Tensor) -> None:  # must return None
            opt.step()
            opt.zero_grad(set_to_none=True)

        return hook

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for opt in self.optimizers for p, s in opt.state.items()}

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


def make_optimizer(
    model: torch.nn.Module,
    train_cfg: dict,
    device: str,
    optimizer: str = "adamw",
    in_backward: bool = False,
    shard: str = "none",
    lr_scale: float = 1.0,
):
    """The optimizer of a technique (see the module docstring) over the model's parameters;
    `lr_scale` (the technique's knob) multiplies the learning rate the step sets."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train_cfg["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    groups = [{**g, "lr_scale": lr_scale} for g in groups]

    def build(g):
        return _build(optimizer, g, train_cfg["lr"], device, shard)

    return InBackward(groups, build) if in_backward else build(groups)
