"""gradscope.check_module on a Hugging Face decoder layer (docs/python.md, "A decoder layer"),
on --device.

1. transformers' LlamaDecoderLayer with LoRA on all seven projections runs whole as the
   implementation under test (its own RMSNorm, rotary embedding, attention, MLP and residuals)
   and passes in fp32, bf16 and fp16, with SDPA and with eager attention, at the model's RMSNorm
   epsilon and RoPE base; checks are named by the layer's own parameter paths.
2. A MistralDecoderLayer (grouped-query heads, a sliding window wider than the sequence) passes.
3. Bugs planted in the layer, in no fault list of gradscope's, are caught and named: attention
   scaled by 1/head_dim instead of 1/sqrt(head_dim), and a residual whose gradient is cut.
4. check_model(by="layer") judges a two-layer LlamaForCausalLM layer by layer; a bug planted in
   layer 1's down_proj base makes model.layers.1 the first divergence; a layer without LoRA on
   all seven projections is judged module by module. With inputs="model" each
   layer (or module) is judged on the input and output gradient the model's own forward and
   backward give it, and on its own weights: the model passes; the bug is found in layer 1
   (module model.layers.1.mlp) while layer 0, upstream of it in the forward and downstream in
   the backward, still passes.
5. What the reference does not model is refused by name: a YaRN rope scaling, Qwen2 (no
   family declares it: its bias on q/k/v alone), a sliding window narrower than the sequence,
   LoRA dropout inside the layer, a head_dim that does not divide hidden into the heads, a
   partial rotary factor, gradient checkpointing, a norm that centres its rows (fp32, fp16,
   bf16). A fused RMSNorm that rounds x / rms(x) to an fp16 or bf16 weight's dtype before the
   product (as unsloth's and FOAK's do) is accepted, its norm weights other than ones.
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch
from lora_models import (LLAMA_SIZES, expect_failure, expect_refusal, lora, quant, tiny_llama,
                         tiny_llama_down_proj_bug, with_own_weights)
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, Qwen2Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

import gradscope
from gradscope.model_check import _captured_inputs


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """transformers' initialisation from torch's global generator: each test draws the same
    weights whichever tests run before it."""
    torch.manual_seed(0)


def fused_norms(layer, centred=False):
    """The layer's two RMSNorms replaced the way a fused kernel patches them (unsloth's, FOAK's):
    x / rms(x) in fp32, rounded to the weight's dtype, times the weight; `centred` subtracts the
    row's mean first (a LayerNorm without bias: not what the reference models)."""
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        def forward(x, norm=norm):
            xf = x.float()
            if centred:
                xf = xf - xf.mean(-1, keepdim=True)
            rms = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            return (xf * rms).to(norm.weight.dtype) * norm.weight
        norm.forward = forward
    return layer


def llama_config(**kw) -> LlamaConfig:
    return LlamaConfig(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                       num_key_value_heads=2, **kw)


class DetachedResidual(LlamaDecoderLayer):
    """A planted bug: the attention block's residual is added without its gradient."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                position_embeddings=None, **kwargs):
        h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                              attention_mask=attention_mask, position_ids=position_ids,
                              position_embeddings=position_embeddings, **kwargs)
        h = hidden_states.detach() + h
        return h + self.mlp(self.post_attention_layernorm(h))


WithLora = Callable[..., torch.nn.Module]


@pytest.fixture
def with_lora(device: str) -> WithLora:
    """The layer with LoRA r4 over 4-bit group-32 bases on every projection in `sizes`, on
    --device."""
    def with_lora(layer, sizes=LLAMA_SIZES, bias=lambda name: False, p=0.0):
        for parent in (layer.self_attn, layer.mlp):
            for name, (i, o) in sizes.items():
                if hasattr(parent, name):
                    setattr(parent, name, lora(quant(i, o, group=32, bias=bias(name)), r=4,
                                               alpha=8.0, p=p))
        return layer.to(device)
    return with_lora


@pytest.fixture
def llama_layer(device: str) -> LlamaDecoderLayer:
    """The layer of a LlamaForCausalLM as built: SDPA attention, rms_norm_eps 1e-6."""
    return tiny_llama(layers=1).model.layers[0].to(device)


# 1. Llama layers pass.

def test_a_llama_layer_as_built_passes_named_by_its_paths(llama_layer: LlamaDecoderLayer) -> None:
    assert llama_layer.self_attn.config._attn_implementation == "sdpa"  # as the model set it
    cases = gradscope.check_module(llama_layer)
    assert [c.status for c in cases] == ["pass"] * 3, [(c.id, c.status) for c in cases]
    assert ".eps1e-06." in cases[0].id and ".whole." in cases[0].id, cases[0].id
    names = {k.name for k in cases[0].checks}
    assert {"output", "input.grad", "self_attn.q_proj.lora_A.default.weight.grad",
            "mlp.down_proj.lora_B.default.weight.grad"} <= names and len(names) == 16, names


def test_eager_attention_at_another_rope_base_passes(with_lora: WithLora) -> None:
    eager = with_lora(LlamaDecoderLayer(llama_config(attn_implementation="eager",
                                                     rope_theta=500000.0), 0))
    eager.self_attn.config._attn_implementation = "eager"
    cases = gradscope.check_module(eager, dtypes=["bf16", "fp16"], seq=33)
    assert all(c.passed for c in cases) and ".theta500000" in cases[0].id, cases[0].id


# 2. Mistral.

def test_a_mistral_layer_passes(with_lora: WithLora) -> None:
    mistral = with_lora(MistralDecoderLayer(MistralConfig(
        hidden_size=128, intermediate_size=352, num_attention_heads=4, num_key_value_heads=1,
        sliding_window=64), 0), sizes={**LLAMA_SIZES, "k_proj": (128, 32), "v_proj": (128, 32)})
    assert gradscope.check_module(mistral, dtypes="bf16")[0].passed


# 3. Planted bugs.

def test_attention_scaled_by_one_over_head_dim_fails(llama_layer: LlamaDecoderLayer) -> None:
    llama_layer.self_attn.scaling = llama_layer.self_attn.head_dim ** -1.0
    expect_failure(llama_layer,
                   ["output", "input.grad", "self_attn.q_proj.lora_A.default.weight.grad"],
                   dtypes="fp32")


def test_a_residual_without_its_gradient_fails_input_grad_only(with_lora: WithLora) -> None:
    cut = with_lora(DetachedResidual(llama_config(), 0))
    text = expect_failure(cut, ["input.grad"], dtypes="bf16")
    assert "  output: " not in text, text  # the forward is right; only the gradient is not


# 4. A model, layer by layer.

def test_a_model_passes_layer_by_layer(device: str) -> None:
    report = gradscope.check_model(tiny_llama().to(device), by="layer")
    assert [(m.path, m.kind) for m in report.modules] == [
        ("model.layers.0", "layer"), ("model.layers.1", "layer")], report.table()


def test_a_bug_in_layer_1_is_the_first_divergence_by_layer(device: str) -> None:
    report = gradscope.check_model(tiny_llama_down_proj_bug().to(device), by="layer",
                                   raise_on_failure=False)
    assert [m.passed for m in report.modules] == [True, False], report.table()
    assert report.divergence_lines()[0].startswith("first divergence: model.layers.1 (layer)")
    print(report.table())


def test_a_layer_without_lora_everywhere_goes_module_by_module(device: str) -> None:
    partial_lora = tiny_llama()
    partial_lora.model.layers[0].mlp.gate_proj = torch.nn.Linear(128, 352, bias=False)
    report = gradscope.check_model(partial_lora.to(device), by="layer")
    assert report.passed and [(m.path, m.kind) for m in report.modules] == [
        ("model.layers.0.self_attn", "qkv"), ("model.layers.0.self_attn.o_proj", "lora_w"),
        ("model.layers.0.mlp.up_proj", "lora_w"), ("model.layers.0.mlp.down_proj", "lora_w"),
        ("model.layers.1", "layer")], report.table()


# ... on what the model gives each layer and module (its own weights; lora_B drawn non-zero).

OwnWeights = Callable[[LlamaForCausalLM], LlamaForCausalLM]


@pytest.fixture
def own_weights(device: str) -> OwnWeights:
    def own_weights(model):
        return with_own_weights(model).to(device)
    return own_weights


def test_each_layer_gets_what_the_model_gives_it(own_weights: OwnWeights, device: str) -> None:
    model = own_weights(tiny_llama())
    captured = _captured_inputs(model, dict(model.named_modules()),
                                [("model.layers.0", "layer"), ("model.layers.1", "layer")],
                                batch=2, seq=9, seed=1)
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    hidden = model(input_ids=tokens[:, :-1].to(device), output_hidden_states=True).hidden_states
    assert torch.equal(captured["model.layers.1"]["x"], hidden[1])  # layer 0's output
    assert captured["model.layers.1"]["dy"].shape == (2, 9, 128)


def test_a_model_passes_layer_by_layer_on_its_own_inputs(own_weights: OwnWeights) -> None:
    report = gradscope.check_model(own_weights(tiny_llama()), by="layer", inputs="model", seq=9,
                                   batch=2, dtypes=["fp32", "bf16"])
    assert [m.passed for m in report.modules] == [True, True, True], report.table()
    assert report.modules[-1].path == "end_to_end", report.table()
    assert ".tensors." in report.modules[0].cases[0].id, report.modules[0].cases[0].id


def test_a_bug_in_layer_1_on_the_models_inputs_by_module(own_weights: OwnWeights) -> None:
    report = gradscope.check_model(own_weights(tiny_llama_down_proj_bug()), inputs="model",
                                   raise_on_failure=False)
    assert [m.passed for m in report.modules] == [True] * 5 + [False] * 2, report.table()


def test_a_bug_in_layer_1_on_the_models_inputs_by_layer(own_weights: OwnWeights) -> None:
    report = gradscope.check_model(own_weights(tiny_llama_down_proj_bug()), by="layer",
                                   inputs="model", raise_on_failure=False)
    assert [m.passed for m in report.modules] == [True, False, False], report.table()
    print(report.table())


# 5. Refusals.

def yarn(with_lora: WithLora) -> torch.nn.Module:
    # Llama 3's scaling is modelled (test_model_families.py); YaRN is not.
    config = llama_config(rope_parameters={
        "rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
        "original_max_position_embeddings": 8192}, max_position_embeddings=65536)
    return with_lora(LlamaDecoderLayer(config, 0))


def qwen2(with_lora: WithLora) -> torch.nn.Module:
    config = Qwen2Config(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                         num_key_value_heads=2)
    return with_lora(Qwen2DecoderLayer(config, 0),
                     bias=lambda name: name in ("q_proj", "k_proj", "v_proj"))


def narrow_window(with_lora: WithLora) -> torch.nn.Module:
    config = MistralConfig(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                           num_key_value_heads=2, sliding_window=8)
    return with_lora(MistralDecoderLayer(config, 0))


def lora_dropout(with_lora: WithLora) -> torch.nn.Module:
    return with_lora(LlamaDecoderLayer(llama_config(), 0), p=0.1)


def wide_heads(with_lora: WithLora) -> torch.nn.Module:
    return with_lora(LlamaDecoderLayer(llama_config(head_dim=64), 0),
                     sizes={**LLAMA_SIZES, "q_proj": (128, 256), "k_proj": (128, 128),
                            "v_proj": (128, 128), "o_proj": (256, 128)})


def partial_rotary(with_lora: WithLora) -> torch.nn.Module:
    partial = with_lora(LlamaDecoderLayer(llama_config(), 0))
    partial.self_attn.config.partial_rotary_factor = 0.5
    return partial


def checkpointed(with_lora: WithLora) -> torch.nn.Module:
    layer = with_lora(LlamaDecoderLayer(llama_config(), 0))
    layer.gradient_checkpointing = True
    return layer


REFUSALS = [(yarn, "rope_type 'yarn'"),
            (qwen2, "config.model_type 'qwen2' is declared by no model family"),
            (narrow_window, "sliding_window 8 < seq 17"),
            (lora_dropout, "LoRA dropout in a decoder layer is checked per op"),
            (wide_heads, "head_dim 64 with 4 heads over hidden 128"),
            (partial_rotary, "partial_rotary_factor 0.5"),
            (checkpointed, "gradient checkpointing is on")]


@pytest.mark.parametrize("make, words", REFUSALS, ids=[make.__name__ for make, _ in REFUSALS])
def test_an_unmodelled_layer_is_refused_by_name(with_lora: WithLora,
                                                make: Callable[[WithLora], torch.nn.Module],
                                                words: str) -> None:
    expect_refusal(make(with_lora), words)


DTYPES = [(torch.float32, "fp32"), (torch.float16, "fp16"), (torch.bfloat16, "bf16")]


Fused = Callable[..., LlamaDecoderLayer]


@pytest.fixture
def fused(with_lora: WithLora) -> Fused:
    """A Llama layer in `dtype` whose norms are fused_norms, their weights other than ones."""
    def fused(dtype, centred=False):
        layer = with_lora(LlamaDecoderLayer(llama_config(), 0))
        if dtype != torch.float32:  # (an fp32 layer keeps its bases' fp16 scales)
            layer = layer.to(dtype)
        with torch.no_grad():  # norm weights other than ones: their product rounds too
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))
        return fused_norms(layer, centred)
    return fused


@pytest.mark.parametrize("dtype, name", DTYPES, ids=[name for _, name in DTYPES])
def test_a_fused_norm_rounding_to_the_weights_dtype_is_accepted(fused: Fused, dtype: torch.dtype,
                                                                name: str) -> None:
    cases = gradscope.check_module(fused(dtype), dtypes=[name])
    assert [c.status for c in cases] == ["pass"], [(c.id, c.status) for c in cases]


@pytest.mark.parametrize("dtype", [dtype for dtype, _ in DTYPES], ids=[n for _, n in DTYPES])
def test_a_norm_that_centres_its_rows_is_refused(fused: Fused, dtype: torch.dtype) -> None:
    expect_refusal(fused(dtype, centred=True), "does not compute weight * x / sqrt(mean(x^2)")
