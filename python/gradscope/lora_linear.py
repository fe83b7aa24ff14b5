"""A LoRA linear over a GPTQ base as the user's module holds it, read by the names peft's
LoraLayer and GPTQ QuantLinears use: the one reader check_module, check_model and end to end
share (docs/python.md)."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from .dtypes import name_of
from .errors import ModuleRefused

GPTQ_BUFFERS = ("qweight", "qzeros", "scales", "g_idx")


@dataclasses.dataclass
class LoraLinear:
    """One LoRA linear: the module, where it sits, and the configuration a case takes."""

    module: torch.nn.Module
    path: str  # its path in the module checked ("" for the module itself)
    in_features: int
    out_features: int
    bits: int
    group_size: int
    desc_act: bool
    rank: int
    alpha: float
    rslora: bool
    dropout: float
    bias: bool
    adapter_dtype: Optional[str]
    scales_dtype: Optional[str]
    zero_format: Optional[str]  # None: the base does not say (the caller passes it)
    device: torch.device

    @property
    def where(self) -> str:
        return self.path or "module"

    def scaling(self) -> float:
        """From r and alpha as the adapter's configuration states them (docs/lora-math.md),
        not from the module's own `scaling`, so that a wrong scaling in the model is not
        copied."""
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def zero_format_of(base: torch.nn.Module) -> Optional[str]:
    """How a GPTQ base's qzeros store zero points: a `zero_format` attribute (gradscope's
    QuantLinear), GPTQModel's `qzero_format()` (1 or 2, which its QuantLinears change on
    train()), or None: the caller says."""
    named = getattr(base, "zero_format", None)
    if named is not None:
        return named
    numbered = getattr(base, "qzero_format", None)
    return {1: "gptq", 2: "gptq_v2"}.get(numbered()) if callable(numbered) else None


def is_lora(module: Optional[torch.nn.Module]) -> bool:
    return module is not None and all(hasattr(module, a) for a in ("base_layer", "lora_A",
                                                                     "lora_B"))


def is_gptq(module: torch.nn.Module) -> bool:
    return all(getattr(module, b, None) is not None for b in GPTQ_BUFFERS) and hasattr(
        module, "bits")


def read(module: torch.nn.Module, path: str, adapter: str) -> Optional[LoraLinear]:
    """The configuration of a LoRA linear over a GPTQ base (peft's LoraLayer names), None for
    a module that is not a LoRA layer, ModuleRefused for one gradscope does not model."""
    base = getattr(module, "base_layer", None)
    lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
    if base is None or lora_a is None or lora_b is None:
        return None
    where = path or "module"
    if adapter not in lora_a:
        raise ModuleRefused(f"{where}: no LoRA adapter named {adapter!r} "
                            f"(it has {sorted(lora_a.keys())})")
    if adapter in getattr(module, "lora_magnitude_vector", {}) or getattr(
            module, "use_dora", {}).get(adapter, False):
        raise ModuleRefused(f"{where}: adapter {adapter!r} is DoRA (a magnitude vector): "
                            "gradscope's LoRA is B A x · scaling (docs/lora-math.md)")
    active = getattr(module, "active_adapters", [adapter])
    if list(active) != [adapter] or getattr(module, "disable_adapters", False) or getattr(
            module, "merged", False):
        raise ModuleRefused(f"{where}: the module's forward does not run adapter {adapter!r} "
                            f"alone (active: {list(active)}, disabled: "
                            f"{bool(getattr(module, 'disable_adapters', False))}, merged: "
                            f"{bool(getattr(module, 'merged', False))})")
    missing = [b for b in GPTQ_BUFFERS if getattr(base, b, None) is None]
    if missing:
        raise ModuleRefused(f"{where}.base_layer ({type(base).__name__}): not a GPTQ "
                            f"QuantLinear, it has no {', '.join(missing)}")
    k, n = base.g_idx.shape[0], base.scales.shape[1]
    groups = base.scales.shape[0]
    g_idx = base.g_idx.long().cpu()
    desc_act = bool(getattr(base, "desc_act", False)) or bool((g_idx[1:] < g_idx[:-1]).any())
    group_size = getattr(base, "group_size", None) or (-1 if groups == 1 else k // groups)
    dropout = getattr(module, "lora_dropout")[adapter] if hasattr(module, "lora_dropout") else None
    p = float(getattr(dropout, "p", 0.0)) if isinstance(dropout, torch.nn.Dropout) else 0.0
    if dropout is not None and not isinstance(dropout, (torch.nn.Dropout, torch.nn.Identity)):
        raise ModuleRefused(f"{path}.lora_dropout.{adapter}: {type(dropout).__name__} is neither "
                            "nn.Dropout nor nn.Identity: gradscope models dropout only")

    def per_adapter(attribute: str, default):
        values = getattr(module, attribute, None)
        return values[adapter] if isinstance(values, dict) else default

    r = per_adapter("r", lora_a[adapter].out_features)
    if getattr(lora_b[adapter], "bias", None) is not None:
        raise ModuleRefused(f"{path}.lora_B.{adapter}: a bias on lora_B is not in gradscope's "
                            "LoRA (docs/lora-math.md)")
    return LoraLinear(
        module=module, path=path, in_features=int(k), out_features=int(n),
        bits=int(base.bits), group_size=int(group_size), desc_act=desc_act, rank=int(r),
        alpha=float(per_adapter("lora_alpha", r)), rslora=bool(per_adapter("use_rslora", False)),
        dropout=p, bias=getattr(base, "bias", None) is not None,
        adapter_dtype=name_of(lora_a[adapter].weight.dtype),
        scales_dtype=name_of(base.scales.dtype), zero_format=zero_format_of(base),
        device=base.qweight.device)
