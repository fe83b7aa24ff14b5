"""check_module: an nn.Module as the user has it, judged by gradscope's rule (docs/python.md).

The module is read for its configuration (shapes, GPTQ bits and groups, LoRA rank, alpha,
rsLoRA, dropout, bias, adapter dtype) by the names peft and GPTQ QuantLinears use; gradscope
builds the case of that configuration from typed values through the binding, registers the
module as the implementation under test of the kind's operator in a namespace of its own, and
runs the case in this process: the seeded inputs go into the module's own parameters and
buffers by name (torch.func.functional_call), the case's dropout mask replaces the module's
dropout draw, and the module's own forward runs, its own dequantization included. The fp64
reference and the baseline are gradscope's. Checks come back named by the module's own
parameter paths.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import os
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils.dlpack import to_dlpack

from . import _gradscope, api
from . import end_to_end as e2e
from . import lora_linear
from .adapters._case_dropout import MaskDropout
from .errors import GradscopeInputError, ModuleRefused
from .lora_linear import GPTQ_BUFFERS as _BASE_BUFFERS
from .lora_linear import LoraLinear
from .dtypes import ACTIVATION_DTYPES, torch_dtype
from .results import Case, CheckStatus, Outcome, failure_lines

_namespaces = itertools.count()
# The tensors a case takes for x and the output gradients: the activation dtypes.
FLOATING = tuple(torch_dtype(d) for d in ACTIVATION_DTYPES)


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
    """What the reference needs of a decoder layer beyond its projections, and how to call it."""

    heads: int
    kv_heads: int
    rms_eps: float
    rope_theta: float
    eager: bool  # eager attention takes the causal mask; SDPA's is_causal applies it without one
    rotary: torch.nn.Module  # the model family's own rotary embedding, from the layer's config


def _rms_norm_eps(layer: torch.nn.Module) -> float:
    """The layers' shared epsilon, after probing that each norm is weight * x / rms(x)."""
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
    return next(iter(eps.values()))


def _layer_config(layer: torch.nn.Module, projections: Dict[str, LoraLinear], seq: int
                  ) -> _LayerConfig:
    """The decoder layer's configuration, or ModuleRefused naming what the reference does not
    model."""
    attn = layer.self_attn
    config = getattr(attn, "config", None)
    if config is None:
        raise ModuleRefused(f"{type(attn).__name__}: no config (num_attention_heads, "
                            "num_key_value_heads, rope_parameters): not a Hugging Face attention")
    hidden = projections["q_proj"].in_features
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
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
        rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ModuleRefused(f"rope_parameters: rope_type {rope_type!r}: the reference models the "
                            "default rotary embedding only")
    if "rope_theta" not in rope:
        raise ModuleRefused("rope_parameters has no rope_theta: the RoPE base is not known")
    partial = float(rope.get("partial_rotary_factor",
                             getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    if partial != 1.0:
        raise ModuleRefused(f"partial_rotary_factor {partial}: the reference rotates every "
                            "dimension of a head")
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) != 0.0:
        raise ModuleRefused(f"attention_dropout {config.attention_dropout}: the reference's "
                            "attention has no dropout")
    window = getattr(config, "sliding_window", None)
    if window is not None and int(window) < seq:
        raise ModuleRefused(f"sliding_window {window} < seq {seq}: the reference's attention is "
                            "causal over the whole sequence (use seq <= sliding_window)")
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
    return _LayerConfig(heads, kv_heads, _rms_norm_eps(layer), float(rope["rope_theta"]),
                        implementation == "eager", rotary[0](config=config).to(device))


# The case's names of a kind's input and output gradients (docs/case-files.md).
_INPUT_NAMES = {"lora_w": ("x", "dy"), "mlp": ("x", "dy"), "layer": ("x", "dy"),
                "qkv": ("x", "dq", "dk", "dv")}


def _module_tensors(kind: str, module: torch.nn.Module, projections: Dict[str, LoraLinear],
                    adapter: str) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """The module's own weights under the names of the case's draws (docs/case-files.md,
    "Tensors from a file"), and the adapters left to the case's draws: a lora_B of zeros
    (peft's initialisation) would make every lora_A gradient identically zero."""
    tensors: Dict[str, torch.Tensor] = {}
    redrawn: List[str] = []
    for name, p in projections.items():
        stream = {"lora_w": "o_proj", "layer": f"layers.1.{name}"}.get(kind, name)
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
    if kind == "layer":
        for norm, stream in (("input_layernorm", "input_norm"),
                             ("post_attention_layernorm", "post_attention_norm")):
            tensors[f"layers.1.{stream}"] = getattr(module, norm).weight
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
                      rms_eps=layer.rms_eps, rope_theta=layer.rope_theta)
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


def _require_whole(name: str, value: object) -> None:
    """A whole-number argument as the case's field takes it: an int, not a bool, a float or a
    str (the engine refuses those too; this names the argument before anything reads it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise GradscopeInputError(f"{name}={value!r}: expected a whole number (an int)")


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


def _register(ns: str, kind: str, module: torch.nn.Module, projections: Dict[str, LoraLinear],
              adapter: str, layer: Optional[_LayerConfig] = None):
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

    def decoder_layer(x, input_norm, post_attention_norm, q, k, v, o, gate, up, down, bits,
                      zero_format, lora_alpha, use_rslora, heads, kv_heads, rms_eps, rope_theta,
                      position_offset):
        # The case was written from the layer's configuration: anything else is a harness bug.
        assert layer is not None
        asked = (heads, kv_heads, rms_eps, rope_theta)
        if asked != (layer.heads, layer.kv_heads, layer.rms_eps, layer.rope_theta):
            raise RuntimeError(f"check_module: the case asks heads, kv_heads, rms_eps, rope_theta "
                               f"{asked}, the layer has {layer}")
        tensors = {"input_layernorm.weight": input_norm,
                   "post_attention_layernorm.weight": post_attention_norm}
        for name, t in zip(_ATTENTION + _MLP, (q, k, v, o, gate, up, down)):
            p = projections[name]
            tensors.update(_tensors(p, t, adapter, p.path + "."))
        return _layer_call(module, layer, x, tensors, position_offset)

    library.impl(op, {"lora_w": lora_w, "lora_qkv": lora_qkv, "lora_mlp": lora_mlp,
                      "decoder_layer": decoder_layer}[op], "CompositeImplicitAutograd")
    return library


def _parameter_name(check_path: str, kind: str, adapter: str) -> str:
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


def _in_training_mode(check: Callable[..., List[Case]]) -> Callable[..., List[Case]]:
    """Runs `check` with the module in training mode, restored after: dropout draws as in
    training, and GPTQModel's QuantLinears switch their zero points to the v2 words their
    training kernel reads before anything of them is read."""

    @functools.wraps(check)
    def in_training(module: torch.nn.Module, **kwargs) -> List[Case]:
        __tracebackhide__ = True
        if not isinstance(module, torch.nn.Module):
            raise GradscopeInputError(f"module: a {type(module).__name__}, expected a "
                                      "torch.nn.Module")
        was_training = module.training
        module.train()
        try:
            return check(module, **kwargs)
        finally:
            module.train(was_training)

    return in_training


@_in_training_mode
def check_module(
    module: torch.nn.Module,
    *,
    kind: Optional[str] = None,
    adapter: str = "default",
    dtypes: Union[str, Sequence[str]] = ("fp32", "fp16", "bf16"),
    batch: int = 2,
    seq: int = 17,
    seed: int = 1,
    zero_format: Optional[str] = None,
    weights: str = "case",
    inputs: Optional[Dict[str, torch.Tensor]] = None,
    dump: Optional[str] = None,
    raise_on_failure: bool = True,
) -> List[Case]:
    """Judges `module` by gradscope's rule on the case of its own configuration, once per dtype.

    `module`: a LoRA linear over a GPTQ QuantLinear (peft's LoraLayer names: base_layer,
    lora_A/lora_B/lora_dropout[adapter], r, lora_alpha, use_rslora; the base's qweight, qzeros,
    scales, g_idx, bits), an MLP whose gate_proj, up_proj and down_proj are such linears and
    whose act_fn is SiLU (kind mlp), or a module with such q_proj, k_proj, v_proj (kind qkv: the
    three projections of one input), or a Llama-family decoder layer with such linears on all
    seven projections (kind layer: transformers' LlamaDecoderLayer or MistralDecoderLayer called
    whole, its own RMSNorm, rotary embedding, attention and residuals included; checks its
    output, input gradient and every adapter gradient). `zero_format` says how the base's
    qzeros store zero points where the base has no `zero_format` attribute. `weights`: "case"
    draws every weight from the seeded case; "module" runs on the module's own packed bases,
    biases, adapters (and a layer's norms), a lora_B of zeros excepted (redrawn, with a
    warning: it would make every lora_A gradient zero). `inputs`: the activation and output
    gradients to use instead of seeded ones, by the case's names ({"x", "dy"}; "dq", "dk", "dv"
    for kind qkv), e.g. captured from the model (check_model(..., inputs="model")). `dump`: an
    HDF5 file that gets every compared tensor and input of the cases (docs/reports.md). Returns
    gradscope.check's Cases, each check's `name` the module's own path
    (`q_proj.lora_A.default.weight.grad`); raises AssertionError naming each failing tensor by
    that path unless raise_on_failure is False, and ModuleRefused (a GradscopeInputError) for a
    module or feature gradscope does not model. A dtype whose checks ran but could not be judged
    (out of range, or an attention past the floor's model: docs/verification.md) raises
    GradscopeInputError with the reason, or with raise_on_failure False comes back as a Case of
    status "invalid".
    """
    __tracebackhide__ = True
    for name, value in (("batch", batch), ("seq", seq), ("seed", seed)):
        _require_whole(name, value)
    for name, t in (inputs or {}).items():
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOATING:
            raise GradscopeInputError(
                f"inputs[{name!r}]: a {getattr(t, 'dtype', type(t).__name__)}, expected a "
                f"floating tensor ({', '.join(str(d) for d in FLOATING)})")
    kind, projections = _projections(module, kind, adapter)
    x = (inputs or {}).get("x")
    if x is not None and x.dim() == 3:  # the case's tokens are the given activation's
        batch, seq = int(x.shape[0]), int(x.shape[1])
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
    if weights not in ("case", "module"):
        raise GradscopeInputError(f"weights={weights!r}: expected 'case' or 'module'")
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    given: Dict[str, torch.Tensor] = {}
    if weights == "module":
        given, redrawn = _module_tensors(kind, module, projections, adapter)
        for name in redrawn:
            warnings.warn(f"check_module: {name} is all zeros (peft's initialisation), "
                          "which makes every lora_A gradient zero: drawn from the case "
                          "instead", stacklevel=2)
    for name, t in (inputs or {}).items():
        if name not in _INPUT_NAMES[kind]:
            raise GradscopeInputError(f"inputs: {name!r} is not an input of kind {kind} "
                                      f"(expected {', '.join(_INPUT_NAMES[kind])})")
        given[name] = t.detach().float().cpu().contiguous()
    origin = f"check_module(<{type(module).__name__}>)"
    built = _gradscope.build_cases(
        kind, _case_fields(kind, projections, batch, seq, seed, zero_format, layer),
        {"dtype": dtypes}, origin=origin)
    if given:  # each case consumes its own capsules
        source = f"{origin}: " + ("weights='module'" if weights == "module" else "inputs=")
        built = [c.with_tensors({n: to_dlpack(t) for n, t in given.items()}, source)
                 for c in built]
    ns = f"gradscope_module_{os.getpid()}_{next(_namespaces)}"
    library = None
    try:
        library = _register(ns, kind, module, projections, adapter, layer)
        cases = api.judge(api.run_cases(built, impl=ns, dump=dump), f"module {origin}",
                          raise_on_failure=False, raise_on_invalid=False)
    finally:
        if library is not None:
            library._destroy()
    for case in cases:
        for check in case.checks:
            check.name = _parameter_name(check.path, kind, adapter)
        # The namespace lives as long as this call: the replay is this call for the case's dtype.
        case.replay = (f"gradscope.check_module(<{type(module).__name__}>, kind={kind!r}, "
                       f"dtypes={case.id.split('.')[1]!r}, batch={batch}, seq={seq}, seed={seed}"
                       + (f", zero_format={zero_format!r}" if zero_format else "")
                       + (", weights='module'" if weights == "module" else "")
                       + (f", inputs=<{', '.join(sorted(inputs))}>" if inputs else "") + ")")
    failing = [c for c in cases if c.outcome is Outcome.FAIL]
    if failing and raise_on_failure:
        lines = [f"{len(failing)} of {len(cases)} dtypes failed for {type(module).__name__} "
                 f"(kind {kind})"]
        for c in failing:
            lines += failure_lines(c, named=True)
        raise AssertionError("\n".join(lines))
    # Checks that ran and could not be judged: a result for check_model's report, an input
    # problem for a caller who asked for a verdict on this module.
    invalid = [c for c in cases if c.outcome is Outcome.INVALID]
    if invalid and raise_on_failure:
        lines = [f"{len(invalid)} of {len(cases)} dtypes could not be judged for "
                 f"{type(module).__name__} (kind {kind})"]
        for c in invalid:
            lines += [f"  {k.message}" for k in c.checks
                      if k.verdict is CheckStatus.OUT_OF_RANGE][:1]
        raise GradscopeInputError("\n".join(lines))
    return cases


@dataclasses.dataclass
class ModuleResult:
    """One module of a model, judged by check_module."""

    path: str  # the module's path in the model, e.g. model.layers.3.mlp
    kind: str  # lora_w, qkv, mlp or layer
    cases: List[Case]  # one per dtype

    @property
    def passed(self) -> bool:
        """No case failed; a dtype the module declined (unsupported) or one that could not be
        judged (invalid, e.g. an attention past the floor's model) is not a failure."""
        return all(c.passed or c.status in ("unsupported", "invalid") for c in self.cases)

    @property
    def unsupported(self) -> List[str]:
        """The dtypes the module declined."""
        return [c.id.split(".")[1] for c in self.cases if c.status == "unsupported"]

    @property
    def not_judged(self) -> List[str]:
        """The dtypes whose checks ran but could not be judged (their messages say why)."""
        return [c.id.split(".")[1] for c in self.cases if c.status == "invalid"]

    def worst(self) -> Tuple[float, str]:
        """The largest err/limit over the module's checks, and the tensor it is on."""
        ratios = [(k.max_abs / k.limit, f"{self.path}.{k.name}") for c in self.cases
                  for k in c.checks
                  if k.max_abs is not None and k.limit and k.status != "out_of_range"]
        return max(ratios, default=(0.0, self.path))


@dataclasses.dataclass
class ModelReport:
    """check_model's result: every module it found, in the model's order, then the model end
    to end (path "end_to_end", kind "model") where it ran, or a note saying why it did not."""

    modules: List[ModuleResult]
    note: str = ""

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.modules)

    @property
    def first_failure(self) -> Optional[ModuleResult]:
        return next((m for m in self.modules if not m.passed), None)

    @property
    def not_judged(self) -> List[ModuleResult]:
        """The modules with a dtype whose checks could not be judged (no verdict there)."""
        return [m for m in self.modules if m.not_judged]

    def divergence_lines(self) -> List[str]:
        """The first failing module and each of its failing tensors, by path; empty if none."""
        first = self.first_failure
        if first is None:
            return []
        lines = [f"first divergence: {first.path} ({first.kind}); "
                 f"{sum(not m.passed for m in self.modules)} of {len(self.modules)} modules "
                 "failed"]
        for c in first.cases:
            lines += [f"  {first.path}.{k.name}: {k.message}" for k in c.checks
                      if k.status == "fail"]
        return lines

    def table(self) -> str:
        """One line per module: verdict, the worst err/limit and where."""
        width = max((len(m.path) for m in self.modules), default=4)
        lines = [f"{'module':<{width}}  kind    verdict  worst err/limit"]
        for m in self.modules:
            ratio, where = m.worst()
            declined = f"  ({', '.join(m.unsupported)} unsupported)" if m.unsupported else ""
            if m.not_judged:
                declined += f"  ({', '.join(m.not_judged)} not judged)"
            verdict = "FAIL" if not m.passed else "invalid" if m.not_judged else "pass"
            lines.append(f"{m.path:<{width}}  {m.kind:<6}  {verdict:<7}  "
                         f"{ratio:.3g}  {where[len(m.path) + 1:]}{declined}")
        return "\n".join(lines + ([self.note] if self.note else []))


def _model_modules(model: torch.nn.Module, by: str) -> Iterator[Tuple[str, str]]:
    """(path, kind) of every module check_module reads, in the model's order: with by="layer"
    each decoder layer whole (layer); otherwise, and for what is outside the layers, an
    attention's q/k/v together (qkv) and its o_proj (lora_w), an MLP (mlp), any other LoRA
    linear (lora_w)."""
    covered: set = set()
    for path, module in model.named_modules():
        if any(path.startswith(c + ".") for c in covered):
            continue
        if by == "layer" and _is_decoder_layer(module) and all(
                lora_linear.is_lora(getattr(getattr(module, parent), name, None))
                for parent, names in (("self_attn", _ATTENTION), ("mlp", _MLP))
                for name in names):
            covered.add(path)
            yield path, "layer"
        elif all(lora_linear.is_lora(getattr(module, m, None)) for m in ("gate_proj", "up_proj", "down_proj")):
            covered.add(path)
            yield path, "mlp"
        elif all(lora_linear.is_lora(getattr(module, m, None)) for m in ("q_proj", "k_proj", "v_proj")):
            yield path, "qkv"
            covered.update(f"{path}.{m}" for m in ("q_proj", "k_proj", "v_proj"))
        elif lora_linear.is_lora(module) and path not in covered:
            covered.add(path)
            yield path, "lora_w"


def _captured_inputs(model: torch.nn.Module, modules: Dict[str, torch.nn.Module],
                     found: List[Tuple[str, str]], batch: int, seq: int, seed: int
                     ) -> Dict[str, Dict[str, torch.Tensor]]:
    """Each module's input and output gradients in one forward and backward of the model on
    seeded token ids, to the mean next-token cross-entropy."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        raise ModuleRefused(f"{type(model).__name__}: no config.vocab_size; inputs='model' runs "
                            "a causal LM on token ids")
    if getattr(model, "is_gradient_checkpointing", False):
        raise ModuleRefused(f"{type(model).__name__}: gradient checkpointing is on; turn it off "
                            "for the check (model.gradient_checkpointing_disable())")
    captured: Dict[str, Dict[str, torch.Tensor]] = {path: {} for path, _ in found}
    outputs: List[Tuple[str, str, torch.Tensor]] = []  # (path, name, the module's output)
    handles = []

    def keep_input(path: str):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
            captured[path]["x"] = x.detach().clone()
        return hook

    def keep_output(path: str, name: str):
        def hook(module, args, output):
            outputs.append((path, name, output[0] if isinstance(output, tuple) else output))
        return hook

    for path, kind in found:
        module = modules[path]
        first = getattr(module, "q_proj") if kind == "qkv" else module
        handles.append(first.register_forward_pre_hook(keep_input(path), with_kwargs=True))
        heads = ({"dq": "q_proj", "dk": "k_proj", "dv": "v_proj"} if kind == "qkv"
                 else {"dy": None})
        for name, child in heads.items():
            target = getattr(module, child) if child else module
            handles.append(target.register_forward_hook(keep_output(path, name)))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    was_training = model.training
    model.train()
    # The model's own random draws (dropout) from the seed, and its parameters' .grad untouched:
    # the output gradients come from torch.autograd.grad, not backward().
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            torch.manual_seed(seed)
            logits = model(input_ids=tokens[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            frozen = [f"{p}" for p, _, y in outputs if not y.requires_grad]
            if frozen:
                raise ModuleRefused(f"inputs='model': no gradient reaches {', '.join(frozen)} "
                                    "(no parameter upstream of it requires grad)")
            grads = torch.autograd.grad(loss, [y for _, _, y in outputs], allow_unused=True)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    for (path, name, _), grad in zip(outputs, grads):
        if grad is not None:
            captured[path][name] = grad.detach().clone()
    missing = [f"{p}: {sorted(set(_INPUT_NAMES[k]) - set(captured[p]))}" for p, k in found
               if set(_INPUT_NAMES[k]) - set(captured[p])]
    if missing:
        raise ModuleRefused("inputs='model': the model's forward and backward did not reach "
                            + "; ".join(missing))
    return captured


def check_model(
    model: torch.nn.Module,
    *,
    adapter: str = "default",
    dtypes: Union[str, Sequence[str]] = ("bf16",),
    batch: int = 1,
    seq: int = 17,
    seed: int = 1,
    zero_format: Optional[str] = None,
    by: str = "module",
    inputs: str = "case",
    dump_dir: Optional[str] = None,
    end_to_end: Union[str, bool] = "auto",
    steps: int = 0,
    lr: float = 1e-3,
    raise_on_failure: bool = True,
) -> ModelReport:
    """Judges every LoRA module of `model` by check_module, one module at a time, in the
    model's order: each decoder layer's q/k/v (kind qkv) and o_proj (lora_w) and its MLP
    (mlp), and any other LoRA linear over a GPTQ base. Each module gets the seeded case of its
    own configuration (module i: seed + i), so a bug shows in the module that has it and not in
    every layer after. by="layer" judges each decoder layer whole instead (kind layer: the
    layer's own norms, rotary embedding, attention and residuals under test too).
    inputs="model" judges each module on what the model itself gives it: the model runs seeded
    token ids (batch x seq, its own vocabulary) to the mean next-token loss and back, hooks keep
    each module's input and output gradients, and each module is then checked on those and on
    its own weights (weights="module"), so a module is judged where the model puts it without a
    bug upstream reaching it. `dump_dir`: an existing folder that gets one HDF5 dump per module,
    <module path>.h5, and end_to_end.h5.
    `end_to_end`: also judge the model as it is (its own dtype and device) end to end, its
    loss and every LoRA gradient against the same model in fp64 on the CPU, with a plain
    baseline (gradscope/end_to_end.py; seeded token ids, at least 256): "auto" where the model
    allows it (a causal LM, no dropout, trained lora_B, copies within half the free memory, ...)
    and a note why not otherwise, True to require it (ModuleRefused if it cannot), False to
    skip it. `steps` > 0 (end to end only): that many AdamW steps (`lr`) of the reference, each
    step's losses of the model and the baseline judged on the reference's adapters of that step,
    so that state a kernel keeps across steps shows; the model's adapters are restored after.
    Returns a ModelReport (`table()`, `first_failure`); raises AssertionError naming the first
    failing module and its failing tensors unless raise_on_failure is False.
    """
    __tracebackhide__ = True
    if by not in ("module", "layer"):
        raise GradscopeInputError(f"by={by!r}: expected 'module' or 'layer'")
    found = list(_model_modules(model, by))
    if not found:
        raise ModuleRefused(f"{type(model).__name__}: no LoRA module over a GPTQ base found "
                            "(peft's base_layer/lora_A/lora_B names)")
    if inputs not in ("case", "model"):
        raise GradscopeInputError(f"inputs={inputs!r}: expected 'case' or 'model'")
    if dump_dir is not None and not os.path.isdir(dump_dir):
        raise GradscopeInputError(f"dump_dir {dump_dir}: not a folder")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise GradscopeInputError(f"steps={steps!r}: expected a whole number >= 0")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise GradscopeInputError(f"lr={lr!r}: expected a finite number > 0")
    if steps and end_to_end is False:
        raise GradscopeInputError("steps: the optimizer steps are judged end to end; "
                                      "end_to_end=False leaves none")
    if not (isinstance(end_to_end, bool) or end_to_end == "auto"):
        raise GradscopeInputError(f"end_to_end={end_to_end!r}: expected 'auto', True or "
                                      "False")
    modules = {path: module for path, module in model.named_modules()}
    captured = (_captured_inputs(model, modules, found, batch, seq, seed) if inputs == "model"
                else {})
    own = "module" if inputs == "model" else "case"
    # Module i draws from seed + i: layers of one shape still see different values.
    report = ModelReport([
        ModuleResult(path, kind, check_module(modules[path], kind=kind, adapter=adapter,
                                              dtypes=dtypes, batch=batch, seq=seq, seed=seed + i,
                                              zero_format=zero_format, weights=own,
                                              inputs=captured.get(path),
                                              dump=os.path.join(dump_dir, f"{path}.h5")
                                              if dump_dir else None,
                                              raise_on_failure=False))
        for i, (path, kind) in enumerate(found)
    ])
    if end_to_end is not False:
        loras = [p for path, m in model.named_modules() if lora_linear.is_lora(m)
                 for p in [_lora_linear(m, path, adapter)] if p is not None]
        try:
            case = e2e.judge(model, loras, adapter, batch, seq, seed, zero_format,
                             os.path.join(dump_dir, "end_to_end.h5") if dump_dir else None,
                             steps=steps, lr=lr)
            report.modules.append(ModuleResult("end_to_end", "model", [case]))
        except e2e.NotRun as e:
            if end_to_end is True:
                raise ModuleRefused(f"end_to_end=True: {e}") from None
            report.note = f"end to end: not run: {e}"
    if report.first_failure is not None and raise_on_failure:
        raise AssertionError("\n".join(report.divergence_lines() + ["", report.table()]))
    if report.not_judged and raise_on_failure:  # no verdict there: not a pass either
        raise GradscopeInputError("\n".join(
            [f"{len(report.not_judged)} of {len(report.modules)} modules could not be judged "
             "in some dtype (their checks say why):"]
            + [f"  {m.path}: {k.message}" for m in report.not_judged for c in m.cases
               if c.status == "invalid"
               for k in [k for k in c.checks if k.status == "out_of_range"][:1]]
            + ["", report.table()]))
    return report
