"""A module registered as the implementation under test: the kind's operator in a namespace
of its own, whose kernel calls the module's own forward with the case's tensors in place of its
parameters and buffers (torch.func.functional_call) and the case's dropout masks in place of its
dropout; and the module's own names for the checks."""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, List, Sequence

import torch

from . import api
from .adapters._case_dropout import MaskDropout
from .lora_linear import GPTQ_BUFFERS as _BASE_BUFFERS
from .lora_linear import LoraLinear
from .readers import _ATTENTION, _MLP, ModuleCase, _LayerConfig


@contextlib.contextmanager
def _case_dropout(p: LoraLinear, adapter: str, mask, rate: float) -> Iterator[None]:
    """The case's mask in place of the module's dropout, for one call."""
    module = p.module
    if mask is None or not hasattr(module, "lora_dropout"):
        yield
        return
    dropouts = getattr(module, "lora_dropout")
    saved = dropouts[adapter]
    dropouts[adapter] = MaskDropout(mask, rate)
    try:
        yield
    finally:
        dropouts[adapter] = saved


def _tensors(p: LoraLinear, proj: Sequence[torch.Tensor], adapter: str, prefix: str) -> dict:
    """The case's tensors under the module's own names."""
    names = [f"base_layer.{b}" for b in _BASE_BUFFERS] + [f"lora_A.{adapter}.weight",
                                                          f"lora_B.{adapter}.weight"]
    if p.bias:
        names.append("base_layer.bias")
    return {prefix + n: t for n, t in zip(names, proj)}


def _layer_call(layer: torch.nn.Module, config: _LayerConfig, x: torch.Tensor,
                tensors: dict, position_offset: int) -> torch.Tensor:
    """The layer's own forward as its model calls it: the family's rotary embedding for the
    positions, and the causal mask where the attention needs one."""
    batch, seq = x.shape[0], x.shape[1]
    positions = torch.arange(position_offset, position_offset + seq, device=x.device)
    positions = positions.unsqueeze(0).expand(batch, seq)
    cos, sin = config.rotary(x, positions)
    mask = None
    if config.eager:
        mask = torch.full((seq, seq), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device)
        mask = mask.triu(1).expand(batch, 1, seq, seq)
    out = torch.func.functional_call(layer, tensors, (x,), {
        "attention_mask": mask, "position_ids": positions, "position_embeddings": (cos, sin)})
    return out[0] if isinstance(out, tuple) else out


class _CallsInOrder(torch.nn.Module):
    """Calls the named children of `parent` on one input, in order, and returns their outputs."""

    def __init__(self, parent: torch.nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.parent = parent
        self.names = tuple(names)

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [getattr(self.parent, name)(x) for name in self.names]


def register(ns: str, case: ModuleCase, module: torch.nn.Module, adapter: str
             ) -> torch.library.Library:
    """The case's operator in namespace `ns`, over `module`; destroy it (library._destroy())
    when done."""
    kind, projections, layer = case.kind, case.projections, case.layer
    library = torch.library.Library(ns, "DEF")
    op = {"lora_w": "lora_w", "qkv": "lora_qkv", "mlp": "lora_mlp",
          "layer": "decoder_layer"}[kind]
    api.define_ops(library, [op])

    def linear(name, x, proj, mask, rate):
        p = projections[name]
        with _case_dropout(p, adapter, mask, rate):
            return torch.func.functional_call(p.module, _tensors(p, proj, adapter, ""), (x,))

    def lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
               dropout_p=0.0):
        return linear("", x, proj, dropout_mask, dropout_p)

    def lora_qkv(x, q, k, v, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
                 dropout_p=0.0):
        # All three projections' tensors in place for all three calls: a fused q/k/v (as
        # fms-acceleration installs one) computes every output at the first call.
        tensors = {}
        for name, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            tensors.update(_tensors(projections[name], t, adapter, f"parent.{name}."))
        with contextlib.ExitStack() as stack:
            for name in ("q_proj", "k_proj", "v_proj"):
                stack.enter_context(_case_dropout(projections[name], adapter, dropout_mask,
                                                  dropout_p))
            return torch.func.functional_call(_CallsInOrder(module, ("q_proj", "k_proj",
                                                                     "v_proj")), tensors, (x,))

    def lora_mlp(x, gate, up, down, bits, zero_format, lora_alpha, use_rslora, dropout_x=None,
                 dropout_h=None, dropout_p=0.0):
        # The module's own forward (e.g. transformers' LlamaMLP), every projection's tensors
        # swapped in by name, each projection's dropout the case's mask for its input.
        tensors = {}
        for name, t in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
            tensors.update(_tensors(projections[name], t, adapter, name + "."))
        with contextlib.ExitStack() as stack:
            for name, mask in (("gate_proj", dropout_x), ("up_proj", dropout_x),
                               ("down_proj", dropout_h)):
                stack.enter_context(_case_dropout(projections[name], adapter, mask, dropout_p))
            return torch.func.functional_call(module, tensors, (x,))

    def decoder_layer(x, norms, layer_projections, bits, zero_format, lora_alpha, use_rslora,
                      family, rope_type, sizes, values):
        # The case was written from the layer's configuration: anything else is a harness bug.
        assert layer is not None
        asked = (family, rope_type, sizes["heads"], sizes["kv_heads"], values["rms_eps"],
                 values["rope_theta"], values["residual_multiplier"],
                 {k: values[k] for k in layer.rope_scaling})
        have = (layer.family, layer.rope_type, layer.heads, layer.kv_heads, layer.rms_eps,
                layer.rope_theta, layer.residual_multiplier, layer.rope_scaling)
        if asked != have or not math.isclose(values["attention_scale"], layer.attention_scale,
                                             rel_tol=1e-12):
            raise RuntimeError(f"check_module: the case asks family, rope_type, heads, kv_heads, "
                               f"rms_eps, rope_theta, residual_multiplier, rope scaling {asked} "
                               f"and attention_scale "
                               f"{values['attention_scale']}, the layer has {layer}")
        tensors = {f"{name}.weight": norms[name]
                   for name in ("input_layernorm", "post_attention_layernorm")}
        for name in _ATTENTION + _MLP:
            p = projections[name]
            tensors.update(_tensors(p, layer_projections[name], adapter, p.path + "."))
        return _layer_call(module, layer, x, tensors, sizes["position_offset"])

    library.impl(op, {"lora_w": lora_w, "lora_qkv": lora_qkv, "lora_mlp": lora_mlp,
                      "decoder_layer": decoder_layer}[op], "CompositeImplicitAutograd")
    return library


def parameter_name(check_path: str, kind: str, adapter: str) -> str:
    """The module's own name for a check, e.g. .../q_proj/lora_A.grad ->
    q_proj.lora_A.<adapter>.weight.grad."""
    parts = check_path.split("/")
    proj, tensor = parts[-2], parts[-1]
    if kind == "layer":  # .../layer0/self_attn/q_proj/lora_A.grad, .../layer0/hidden/output
        if tensor in ("lora_A.grad", "lora_B.grad"):
            return f"{parts[-3]}.{proj}.{tensor.split('.')[0]}.{adapter}.weight.grad"
        return tensor
    prefix = "" if kind == "lora_w" else proj + "."
    if tensor in ("lora_A.grad", "lora_B.grad"):
        return f"{prefix}{tensor.split('.')[0]}.{adapter}.weight.grad"
    if tensor == "output":
        return f"{prefix}output" if kind == "qkv" else "output"
    return tensor  # input.grad


