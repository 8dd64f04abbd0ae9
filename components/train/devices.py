"""Where a trainer runs and what steps its weights: the device, the optimizer, the
learning-rate schedule, the parameter counts (SFT, DPO and GRPO use them alike).

Plain functions; torch and transformers are imported inside them, so importing this module
costs nothing.
"""

from __future__ import annotations

import copy


def training_device(use_cpu: bool):
    """CUDA when there is one and `use_cpu` is off, else the CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not use_cpu else "cpu")


def adamw(model, learning_rate: float, weight_decay: float):
    """AdamW as transformers' Trainer builds it: no decay on biases and norm weights (the
    1-D parameters), fused kernels; only trainable parameters (LoRA: the adapters)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.999), eps=1e-8,
                             fused=fused)  # fmt: skip


def plain_adamw(model, learning_rate: float, weight_decay: float):
    """torch's AdamW with its defaults over the trainable parameters, one group (DPO, GRPO)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)


def lr_schedule(optimizer, name: str, warmup_steps: int, total_steps: int):
    """transformers' named schedule: linear / cosine after a linear warmup; "constant" is
    constant from the first step (as the Trainer runs it: no warmup)."""
    from transformers import get_scheduler

    return get_scheduler(name, optimizer, warmup_steps, total_steps)


def warmup_then_constant(warmup_steps: int):
    """A LambdaLR factor: linear warmup over `warmup_steps` steps, then constant."""
    return lambda step: min(1.0, (step + 1) / (warmup_steps + 1))


def trainable_parameters(model) -> dict:
    """{"trainable_parameters", "total_parameters"} of a model (LoRA: adapters vs all)."""
    params = list(model.parameters())
    return {
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "total_parameters": sum(p.numel() for p in params),
    }


def frozen_copy(model, reference, device):
    """The frozen reference on `device`: `reference`, or a copy of `model` as it is now."""
    reference = copy.deepcopy(model) if reference is None else reference
    return reference.to(device).eval().requires_grad_(False)
