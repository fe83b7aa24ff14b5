"""Reading a module as the user has it: which kind it is, its LoRA linears over GPTQ bases by
projection, a decoder layer's configuration, and the case of that configuration as the kind's
typed field values (docs/python.md, "A module as you ship it"). What gradscope does not model
is refused by name (ModuleRefused)."""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _gradscope, lora_linear
from .errors import ModuleRefused
from .lora_linear import GPTQ_BUFFERS as _BASE_BUFFERS
from .lora_linear import LoraLinear


def _lora_linear(module: torch.nn.Module, path: str, adapter: str) -> Optional[LoraLinear]:
    return lora_linear.read(module, path, adapter)


# A decoder layer's projections by the module that holds them (the engine's list).
_ATTENTION = tuple(n for n, m in _gradscope.LAYER_PROJECTIONS if m == "self_attn")
_MLP = tuple(n for n, m in _gradscope.LAYER_PROJECTIONS if m == "mlp")


def _is_decoder_layer(module: torch.nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("self_attn", "mlp", "input_layernorm",
                                            "post_attention_layernorm"))


def _layer_projections(layer: torch.nn.Module, adapter: str) -> Dict[str, LoraLinear]:
    """The seven LoRA linears of a Llama-family decoder layer, by projection name."""
    found, plain = {}, []
    for parent, names in (("self_attn", _ATTENTION), ("mlp", _MLP)):
        for name in names:
            child = getattr(getattr(layer, parent), name, None)
            p = None if child is None else _lora_linear(child, f"{parent}.{name}", adapter)
            if p is None:
                plain.append(f"{parent}.{name}")
            else:
                found[name] = p
    if plain:
        raise ModuleRefused(f"{', '.join(plain)}: not a LoRA linear over a GPTQ base (a decoder "
                            "layer is checked with LoRA on all seven projections)")
    return found


def _projections(module: torch.nn.Module, kind: Optional[str], adapter: str
                 ) -> Tuple[str, Dict[str, LoraLinear]]:
    if _is_decoder_layer(module) and kind in (None, "layer"):
        return "layer", _layer_projections(module, adapter)
    own = _lora_linear(module, "", adapter)
    if own is not None:
        if kind not in (None, "lora_w"):
            raise ModuleRefused(f"kind {kind!r}: the module is one LoRA linear (kind lora_w)")
        return "lora_w", {"": own}
    families = {"mlp": _MLP, "qkv": _ATTENTION[:3]}
    for name, members in families.items():
        if kind not in (None, name) or not all(hasattr(module, m) for m in members):
            continue
        read = {m: _lora_linear(getattr(module, m), m, adapter) for m in members}
        found = {m: f for m, f in read.items() if f is not None}
        plain = [m for m in members if m not in found]
        if plain:
            raise ModuleRefused(f"{', '.join(plain)}: not a LoRA linear over a GPTQ base "
                                f"(kind {name} needs LoRA on {', '.join(members)})")
        return name, found
    raise ModuleRefused(f"{type(module).__name__}: not a module check_module reads: a LoRA "
                        "linear over a GPTQ QuantLinear (peft's lora_A/lora_B/base_layer), an MLP "
                        "of gate_proj/up_proj/down_proj, an attention's q_proj/k_proj/v_proj, or "
                        "a Llama-family decoder layer (self_attn, mlp, input_layernorm, "
                        "post_attention_layernorm)")


def _common(projections: Dict[str, LoraLinear], field: str, zero_format: Optional[str]) -> Any:
    values = {p.where: getattr(p, field) for p in projections.values()}
    if field == "zero_format":
        values = {k: v or zero_format for k, v in values.items()}
        if None in values.values():
            raise ModuleRefused("the QuantLinear does not say how its qzeros store zero points "
                                "(no zero_format attribute): pass zero_format='gptq' (v1) or "
                                "'gptq_v2'")
    if len(set(values.values())) != 1:
        raise ModuleRefused(f"{field} differs between projections ({values}): a case has one")
    return next(iter(values.values()))


def _activation_is_silu(mlp: torch.nn.Module) -> None:
    act = getattr(mlp, "act_fn", None)
    if act is None:
        raise ModuleRefused(f"{type(mlp).__name__}: no act_fn; the reference models SwiGLU")
    probe = torch.linspace(-6, 6, 97, dtype=torch.float64)
    if not torch.allclose(act(probe), torch.nn.functional.silu(probe), rtol=1e-12, atol=1e-12):
        raise ModuleRefused(f"{type(mlp).__name__}.act_fn is {type(act).__name__}, not SiLU: the "
                            "reference models SwiGLU (down(silu(gate(x)) * up(x))) only")


@dataclasses.dataclass
class _LayerConfig:
    """What the reference needs of a decoder layer beyond its projections, read through its
    family's declaration, and how to call it."""

    family: str
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    rope_type: str  # "default" or "llama3"
    rope_scaling: Dict[str, float]  # llama3's four values, by the case's field names
    attention_scaling: float  # 0: the default 1 / sqrt(head_dim) (the family configures none)
    residual_multiplier: float
    eager: bool  # eager attention takes the causal mask; SDPA's is_causal applies it without one
    rotary: torch.nn.Module  # the model family's own rotary embedding, from the layer's config

    @property
    def attention_scale(self) -> float:
        return self.attention_scaling or self.head_dim ** -0.5


def family_of(config: Any, where: str) -> _gradscope.ModelFamily:
    """The declared family of a Hugging Face config, by its model_type (docs/model-families.md),
    or ModuleRefused: a layer is judged against its own family's reference or not at all."""
    model_type = getattr(config, "model_type", None) or ""
    families = _gradscope.families()
    for family in families:
        if model_type in family.model_types:
            return family
    declared = ", ".join(f"{t} ({f.name})" for f in families for t in f.model_types)
    raise ModuleRefused(f"{where}: config.model_type {model_type!r} is declared by no model "
                        f"family (declared: {declared}; docs/model-families.md tells how to add "
                        "one): its layer is not judged against another family's reference")


def _config_value(config: Any, attribute: str, family: _gradscope.ModelFamily) -> Any:
    value = getattr(config, attribute, None)
    if value is None:
        raise ModuleRefused(f"config has no {attribute}, which family {family.name} reads "
                            f"({family.file})")
    return value


def _rms_norm_eps(layer: torch.nn.Module, declared: float) -> float:
    """The layers' shared epsilon, after probing that each norm is weight * x / rms(x) with the
    epsilon its config declares."""
    eps = {}
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = getattr(layer, name)
        e = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        weight = getattr(norm, "weight", None)
        if e is None or weight is None:
            raise ModuleRefused(f"{name} ({type(norm).__name__}): no weight and variance_epsilon; "
                                "the reference models Hugging Face's RMSNorm")
        # Probed in the norm's own dtype, within a few of its roundings (a fused norm may round
        # x / rms(x) to that dtype before the weight's product, as Hugging Face's does in a
        # half-precision model); x is offset from zero so that a mean-centring norm is told apart.
        dtype = weight.dtype if weight.dtype.is_floating_point else torch.float32
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(3, weight.shape[0], generator=g, dtype=torch.float64) + 1.0).to(dtype)
        x64 = x.double()
        rms = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + e)
        expected = weight.detach().double().cpu() * x64 * rms
        with torch.no_grad():
            got = norm(x.to(weight.device)).double().cpu()
        # Relative to each element: every rounding is (an output in the subnormal range aside).
        tol = max(1e-4, 4 * torch.finfo(dtype).eps)
        if not torch.allclose(got, expected, rtol=tol, atol=4 * torch.finfo(dtype).tiny):
            raise ModuleRefused(f"{name} ({type(norm).__name__}) does not compute weight * x / "
                                "sqrt(mean(x^2) + eps): the reference models Llama's RMSNorm")
        eps[name] = float(e)
    if len(set(eps.values())) != 1:
        raise ModuleRefused(f"the two norms' epsilons differ ({eps}): a case has one rms_eps")
    if next(iter(eps.values())) != declared:
        raise ModuleRefused(f"the norms' epsilon {next(iter(eps.values()))} is not the config's "
                            f"{declared}, which the layer's family reads")
    return declared


def _layer_config(layer: torch.nn.Module, projections: Dict[str, LoraLinear], seq: int
                  ) -> _LayerConfig:
    """The decoder layer's configuration, read as its family declares it, or ModuleRefused
    naming what the reference does not model."""
    attn = layer.self_attn
    config = getattr(attn, "config", None)
    if config is None:
        raise ModuleRefused(f"{type(attn).__name__}: no config (num_attention_heads, "
                            "num_key_value_heads, rope_parameters): not a Hugging Face attention")
    family = family_of(config, type(layer).__name__)
    declared = family.attention
    hidden = projections["q_proj"].in_features
    heads = int(_config_value(config, declared.heads, family))
    kv_heads = int(getattr(config, declared.kv_heads, None) or heads)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if hidden % heads or head_dim != hidden // heads or projections["q_proj"].out_features != hidden:
        raise ModuleRefused(f"head_dim {head_dim} with {heads} heads over hidden {hidden}: the "
                            "reference's layer has heads x head_dim = hidden")
    for name in ("q_norm", "k_norm"):
        if getattr(attn, name, None) is not None:
            raise ModuleRefused(f"self_attn.{name}: a norm on queries or keys is not in the "
                                "reference's layer")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if not rope:  # transformers 4.x
        rope = dict(getattr(config, "rope_scaling", None) or {})
        rope.setdefault(family.rope.theta, getattr(config, family.rope.theta, 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in family.rope.types:
        raise ModuleRefused(f"rope_parameters: rope_type {rope_type!r}: the reference models the "
                            f"{' and '.join(family.rope.types)} rotary embedding only")
    # Llama 3's four values, by the case fields' names (transformers' rope_parameters keys).
    rope_scaling: Dict[str, float] = {}
    if rope_type == "llama3":
        for field, key in (("rope_factor", "factor"), ("rope_low_freq_factor", "low_freq_factor"),
                           ("rope_high_freq_factor", "high_freq_factor"),
                           ("rope_original_max_position", "original_max_position_embeddings")):
            if rope.get(key) is None:
                raise ModuleRefused(f"rope_parameters: rope_type 'llama3' without {key}")
            rope_scaling[field] = float(rope[key])
    if family.rope.theta not in rope:
        raise ModuleRefused(f"rope_parameters has no {family.rope.theta}: the RoPE base is not "
                            "known")
    partial = float(rope.get("partial_rotary_factor",
                             getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    if partial != 1.0:
        raise ModuleRefused(f"partial_rotary_factor {partial}: the reference rotates every "
                            "dimension of a head")
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) != 0.0:
        raise ModuleRefused(f"attention_dropout {config.attention_dropout}: the reference's "
                            "attention has no dropout")
    if declared.sliding_window is not None:
        window = getattr(config, declared.sliding_window, None)
        if window is not None and int(window) < seq:
            raise ModuleRefused(f"sliding_window {window} < seq {seq}: the reference's attention "
                                "is causal over the whole sequence (use seq <= sliding_window)")
    scaling = (0.0 if declared.scaling is None
               else float(_config_value(config, declared.scaling, family)))
    multiplier = (1.0 if family.residual_multiplier is None
                  else float(_config_value(config, family.residual_multiplier, family)))
    # None: the attention interface falls back to eager (a layer built outside a model).
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in ("sdpa", "eager"):
        raise ModuleRefused(f"attention implementation {implementation!r}: check_module calls the "
                            "layer with 'sdpa' or 'eager' attention")
    _activation_is_silu(getattr(layer, "mlp"))
    # The model family's rotary embedding, <Family>RotaryEmbedding beside <Family>DecoderLayer
    # (the layer's class or one it derives from); not a scaled variant defined beside it.
    found = [getattr(sys.modules.get(cls.__module__), name, None) for cls in type(layer).__mro__
             if cls.__name__.endswith("DecoderLayer")
             for name in [cls.__name__[:-len("DecoderLayer")] + "RotaryEmbedding"]]
    rotary: List[type] = [r for r in found if isinstance(r, type)]
    if not rotary:
        raise ModuleRefused(f"{type(layer).__name__}: no <Family>RotaryEmbedding beside a "
                            "<Family>DecoderLayer class it is or derives from, to compute its "
                            "cos and sin")
    device = projections["q_proj"].device
    return _LayerConfig(family.name, heads, kv_heads, head_dim,
                        _rms_norm_eps(layer, float(_config_value(config, family.norms.eps,
                                                                 family))),
                        float(rope[family.rope.theta]), rope_type, rope_scaling, scaling,
                        multiplier,
                        implementation == "eager", rotary[0](config=config).to(device))


@functools.lru_cache(maxsize=None)
def _default_case(kind: str) -> _gradscope.Case:
    return _gradscope.build_cases(kind, {}, origin="gradscope")[0]


def input_names(kind: str) -> Tuple[str, ...]:
    """The names a case of `kind` takes its activation and output gradients by, from the kind's
    declaration (a case of its default fields)."""
    return tuple(_default_case(kind).inputs)


def gradients_of(kind: str) -> Tuple[Tuple[str, str], ...]:
    """(name, output): each output gradient a case of `kind` takes and the output it is the
    gradient of (dq: q_proj; a layer's dy: "output"), from the kind's declaration."""
    return tuple(_default_case(kind).gradients)


def _module_tensors(kind: str, module: torch.nn.Module, projections: Dict[str, LoraLinear],
                    adapter: str, built: _gradscope.Case
                    ) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """The module's own weights under the names of the case's draws (docs/case-files.md,
    "Tensors from a file"; the streams are the case's `parts`), and the adapters left to the
    case's draws: a lora_B of zeros (peft's initialisation) would make every lora_A gradient
    identically zero."""
    parts = [(path, stream) for path, stream, layer in built.parts if layer in (0, 1)]
    # A module that is one LoRA linear is the case's one projection, whatever it is called.
    streams = dict(parts) if kind != "lora_w" else {"": parts[0][1]}
    tensors: Dict[str, torch.Tensor] = {}
    redrawn: List[str] = []
    for p in projections.values():
        stream = streams[p.path]
        m = p.module
        base = m.base_layer
        for b in _BASE_BUFFERS:
            tensors[f"{stream}.{b}"] = getattr(base, b).to(torch.int32 if b == "g_idx" else
                                                         getattr(base, b).dtype)
        if p.bias:
            tensors[f"{stream}.bias"] = getattr(base, "bias")
        tensors[f"{stream}.lora_A"] = getattr(m, "lora_A")[adapter].weight
        lora_b = getattr(m, "lora_B")[adapter].weight
        if bool((lora_b == 0).all()):
            redrawn.append(f"{p.where}.lora_B.{adapter}.weight")
        else:
            tensors[f"{stream}.lora_B"] = lora_b
    # The parts that are no projection: a layer's norms.
    for path, stream in parts if kind != "lora_w" else []:
        if path not in {p.path for p in projections.values()}:
            tensors[stream] = getattr(module, path).weight
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, redrawn


def _case_fields(kind: str, projections: Dict[str, LoraLinear], batch: int, seq: int,
                 seed: int, zero_format: Optional[str], layer: Optional[_LayerConfig] = None
                 ) -> Dict[str, Any]:
    """The case of the module's configuration, as the kind's typed field values."""
    def c(field: str) -> Any:
        return _common(projections, field, zero_format)

    fields: Dict[str, Any] = {}
    if kind == "layer":
        assert layer is not None
        fields.update(hidden=projections["q_proj"].in_features,
                      intermediate=projections["gate_proj"].out_features, heads=layer.heads,
                      kv_heads=layer.kv_heads, layers=1, prod_calls="decoder_layer",
                      rms_eps=layer.rms_eps, rope_theta=layer.rope_theta, family=layer.family,
                      rope_type=layer.rope_type, **layer.rope_scaling,
                      attention_scaling=layer.attention_scaling,
                      residual_multiplier=layer.residual_multiplier)
    elif kind == "lora_w":
        p = projections[""]
        fields.update(in_features=p.in_features, out_features=p.out_features)
    elif kind == "mlp":
        fields.update(hidden=projections["gate_proj"].in_features,
                      intermediate=projections["gate_proj"].out_features)
    else:
        q, k = projections["q_proj"], projections["k_proj"]
        if q.out_features != q.in_features:
            raise ModuleRefused(f"q_proj maps {q.in_features} -> {q.out_features}: kind qkv "
                                "models q_proj as hidden -> hidden (heads x head_dim = hidden)")
        # heads and kv heads only fix k/v's width here: kv_heads / heads = k_out / q_out.
        g = math.gcd(q.out_features, k.out_features)
        fields.update(hidden=q.in_features, heads=q.out_features // g,
                      kv_heads=k.out_features // g)
    fields.update(
        bits=c("bits"), group_size=c("group_size"), desc_act=c("desc_act"),
        format=c("zero_format"), scales_dtype=c("scales_dtype"), rank=c("rank"),
        alpha=float(c("alpha")), rslora=c("rslora"), dropout=float(c("dropout")),
        bias=c("bias"), adapter_dtype=c("adapter_dtype"), batch=batch, seq=seq, seed=seed,
        device="cuda" if c("device").type == "cuda" else "cpu")
    return fields




@dataclasses.dataclass
class ModuleCase:
    """A module read for check_module: its kind, its LoRA linears by projection ("" for a module
    that is one) and, for a decoder layer, the layer's configuration."""

    kind: str
    projections: Dict[str, LoraLinear]
    layer: Optional[_LayerConfig] = None

    def fields(self, batch: int, seq: int, seed: int, zero_format: Optional[str]
               ) -> Dict[str, Any]:
        return _case_fields(self.kind, self.projections, batch, seq, seed, zero_format,
                            self.layer)

    def module_tensors(self, module: torch.nn.Module, adapter: str, built: _gradscope.Case
                       ) -> Tuple[Dict[str, torch.Tensor], List[str]]:
        return _module_tensors(self.kind, module, self.projections, adapter, built)


def read(module: torch.nn.Module, kind: Optional[str], adapter: str, seq: int) -> ModuleCase:
    """The module's kind and configuration, or ModuleRefused naming what is not modelled."""
    kind, projections = _projections(module, kind, adapter)
    layer = None
    if kind == "mlp":
        _activation_is_silu(module)
    if kind == "layer":
        layer = _layer_config(module, projections, seq)
        if getattr(module, "gradient_checkpointing", False):
            raise ModuleRefused(f"{type(module).__name__}: gradient checkpointing is on; its "
                                "backward would recompute the layer outside the check (turn it "
                                "off for the check: model.gradient_checkpointing_disable())")
        with_dropout = [p.path for p in projections.values() if p.dropout]
        if with_dropout:
            raise ModuleRefused(f"{', '.join(with_dropout)}: LoRA dropout in a decoder layer is "
                                "checked per op: check_module(layer.self_attn) and "
                                "check_module(layer.mlp) draw the masks")
    return ModuleCase(kind, projections, layer)
