"""Models as users build them for gradscope's Python tests: peft's GPTQ LoRA layer over a GPTQ
QuantLinear, and LlamaForCausalLMs with LoRA on all seven projections (tiny_llama; llama_r16,
also scripts/end_to_end_specificity.py's). Also factories for `python -m gradscope model
lora_models:NAME`, and the tests' expectations of check_module."""
import torch
from peft.tuners.lora import LoraConfig
from peft.tuners.lora.gptq import GPTQLoraLinear
from transformers import LlamaConfig, LlamaForCausalLM

import gradscope


def lora(base, r=8, alpha=16.0, p=0.0, rslora=False, cls=GPTQLoraLinear):
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=p, use_rslora=rslora)
    return cls(base, "default", config=config, r=r, lora_alpha=alpha, lora_dropout=p,
               use_rslora=rslora)


def quant(inf, outf, bits=4, group=64, bias=False, cls=gradscope.QuantLinear):
    return cls(bits, group, inf, outf, bias=bias)


class ReadsV1AsV2(gradscope.QuantLinear):
    """A planted bug: a base that reads v1 zero points as v2."""

    def forward(self, x):
        w = torch.ops.gradscope.dequantize(self.qweight, self.qzeros, self.scales, self.g_idx,
                                           self.bits, "gptq_v2", x.dtype)
        return x @ w


LLAMA_SIZES = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64),
               "o_proj": (128, 128), "gate_proj": (128, 352), "up_proj": (128, 352),
               "down_proj": (352, 128)}


def tiny_llama(layers=2):
    """A LlamaForCausalLM (hidden 128, 4 heads over 2, MLP 352) with LoRA r4 over a 4-bit
    group-32 base on all seven projections of every layer."""
    model = LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=352,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         num_hidden_layers=layers, vocab_size=64))
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, (i, o) in LLAMA_SIZES.items():
                if hasattr(parent, name):
                    setattr(parent, name, lora(quant(i, o, group=32), r=4, alpha=8.0))
    return model


def tiny_llama_down_proj_bug():
    """tiny_llama with layer 1's down_proj base reading v1 zero points as v2."""
    model = tiny_llama()
    model.model.layers[1].mlp.down_proj = lora(quant(352, 128, group=32, cls=ReadsV1AsV2), r=4,
                                                alpha=8.0)
    return model


def with_own_weights(model, seed=11):
    """A model's QuantLinears filled with packed words and scales of their own (any 32-bit word
    is a valid set of codes) and its lora_B drawn non-zero, as after training: gradscope's
    QuantLinear starts all zeros, whose constant weight gives every key the same direction and
    the q/k gradients an exact zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.named_buffers():
            if name.endswith(("qweight", "qzeros")):
                t.copy_(torch.randint(-2**31, 2**31 - 1, t.shape, generator=g,
                                      dtype=torch.int64).to(torch.int32))
            elif name.endswith("scales"):
                t.copy_(torch.rand(t.shape, generator=g) * 0.004 + 0.001)
        for name, t in model.named_parameters():
            if "lora_B" in name:
                t.copy_(torch.randn(t.shape, generator=g) * 0.05)
    return model


LLAMA_SHAPES = {"small": dict(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                              num_key_value_heads=2, num_hidden_layers=4, group=32),
                "7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                           num_key_value_heads=32, num_hidden_layers=1, group=128)}


class TransposedGemm(gradscope.QuantLinear):
    """A correct base that rounds differently: x Wᵀ from W [out, in] (another GEMM layout)."""

    def forward(self, x):
        w = torch.ops.gradscope.dequantize(self.qweight, self.qzeros, self.scales, self.g_idx,
                                           self.bits, self.zero_format, x.dtype)
        return torch.nn.functional.linear(x, w.t().contiguous())


def llama_r16(shape="small", dtype=torch.float32, base=gradscope.QuantLinear, seed=0,
              last_o_proj=GPTQLoraLinear):
    """A LlamaForCausalLM of LLAMA_SHAPES[shape] (vocabulary 64) held in `dtype`, on the CPU,
    with LoRA r16 (alpha 32) on all seven projections over 4-bit `base`s (group 32 small, 128
    7b) and weights of its own (with_own_weights); the last layer's o_proj is a `last_o_proj`.
    The same model for the same seed."""
    shape = dict(LLAMA_SHAPES[shape])
    group = shape.pop("group")
    config = LlamaConfig(vocab_size=64, **shape)
    hidden, inter = config.hidden_size, config.intermediate_size
    kv = hidden // config.num_attention_heads * config.num_key_value_heads
    sizes = {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
             "o_proj": (hidden, hidden), "gate_proj": (hidden, inter),
             "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    torch.manual_seed(seed)  # transformers' and peft's initialisation: the same model every run
    model = LlamaForCausalLM(config).to(dtype)  # the adapters stay fp32, as peft keeps them
    last = len(model.model.layers) - 1
    for i, layer in enumerate(model.model.layers):
        for parent in (layer.self_attn, layer.mlp):
            for name, (n_in, n_out) in sizes.items():
                if hasattr(parent, name):
                    cls = last_o_proj if i == last and name == "o_proj" else GPTQLoraLinear
                    setattr(parent, name, lora(quant(n_in, n_out, group=group, cls=base), r=16,
                                               alpha=32.0, cls=cls))
    return with_own_weights(model)


def tiny_llama_trained():
    """tiny_llama with weights of its own (with_own_weights)."""
    return with_own_weights(tiny_llama())


class DeclinesBf16(gradscope.QuantLinear):
    """A base without bf16 kernels: it declines (NotImplementedError), as the contract says."""

    def forward(self, x):
        if x.dtype == torch.bfloat16:
            raise NotImplementedError("DeclinesBf16: no bf16 kernel")
        return super().forward(x)


def tiny_llama_declines_bf16():
    """tiny_llama whose bases decline bf16."""
    model = tiny_llama()
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, (i, o) in LLAMA_SIZES.items():
                if hasattr(parent, name):
                    setattr(parent, name, lora(quant(i, o, group=32, cls=DeclinesBf16), r=4,
                                               alpha=8.0))
    return model


def expect_failure(module, names, **kw):
    """check_module fails and names each of `names` (the module's own paths); returns the text."""
    try:
        gradscope.check_module(module, **kw)
    except AssertionError as e:
        text = str(e)
        for name in names:
            assert f"  {name}: " in text, (name, text)
        return text
    raise AssertionError(f"a planted bug in {type(module).__name__} passed")


def expect_refusal(module, words, **kw):
    """check_module refuses the module (ModuleRefused) with `words` in the message."""
    try:
        gradscope.check_module(module, **kw)
    except gradscope.ModuleRefused as e:
        assert words in str(e), (words, str(e))
        return
    raise AssertionError(f"{type(module).__name__} was not refused ({words})")


NOT_A_MODEL = 42


def raises():
    raise RuntimeError("no weights at /nowhere")
