"""gradscope.check_module on modules as users build them (docs/python.md, "check_module").

Usage: check_module.py   (with gradscope on PYTHONPATH; peft and transformers installed)
1. peft's GPTQLoraLinear over a GPTQ QuantLinear passes in every dtype, with dropout and bias;
   its checks are named by the module's own parameter paths.
2. transformers' LlamaMLP with LoRA on gate/up/down runs its own forward and passes (kind mlp);
   the q/k/v projections of a LlamaAttention with grouped-query heads pass (kind qkv).
3. Bugs planted in the module are caught, each named by the module's path: a QuantLinear that
   reads v1 zero points as v2, a LoRA layer that leaves out its scaling in backward only.
4. What the reference does not model is refused by name: a GELU MLP, a plain nn.Linear, a
   base that does not say how its zero points are stored.
5. check_model over a two-layer LlamaForCausalLM with LoRA on all seven projections: six
   modules pass; a bug planted in layer 1's down_proj base is the first divergence, named by
   its path, and layer 0 still passes.
"""
import torch
from lora_models import ReadsV1AsV2, lora, quant, tiny_llama, tiny_llama_down_proj_bug
from peft.tuners.lora.gptq import GPTQLoraLinear
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

import gradscope


def expect_failure(module, names, **kw):
    try:
        gradscope.check_module(module, **kw)
    except AssertionError as e:
        text = str(e)
        for name in names:
            assert f"  {name}: " in text, (name, text)
        return text
    raise AssertionError(f"a planted bug in {type(module).__name__} passed")


def expect_refusal(module, words, **kw):
    try:
        gradscope.check_module(module, **kw)
    except gradscope.ModuleRefused as e:
        assert words in str(e), (words, str(e))
        return
    raise AssertionError(f"{type(module).__name__} was not refused")



class V1WithoutSaying(gradscope.QuantLinear):
    """A base that stores v1 zero points and carries no attribute saying so."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        del self.zero_format

    def forward(self, x):
        w = torch.ops.gradscope.dequantize(self.qweight, self.qzeros, self.scales, self.g_idx,
                                           self.bits, "gptq", x.dtype)
        return x @ w


class _UnscaledBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, scaling):
        ctx.scaling = scaling
        return y * scaling

    @staticmethod
    def backward(ctx, dy):
        return dy, None  # the scaling left out of the adapters' gradients


class ForgetsScalingInBackward(GPTQLoraLinear):
    def forward(self, x):
        a, b = self.lora_A["default"], self.lora_B["default"]
        drop = self.lora_dropout["default"]
        lora = b(a(drop(x.to(a.weight.dtype))))
        scaled = _UnscaledBackward.apply(lora, self.scaling["default"])
        return self.base_layer(x) + scaled.to(x.dtype)


def main():
    # 1. A LoRA linear.
    m = lora(quant(256, 96, bias=True), r=8, alpha=16.0, p=0.1)
    cases = gradscope.check_module(m)
    assert [c.status for c in cases] == ["pass"] * 3, cases
    names = {k.name for c in cases for k in c.checks}
    assert names == {"output", "input.grad", "lora_A.default.weight.grad",
                     "lora_B.default.weight.grad"}, names
    assert gradscope.check_module(lora(quant(128, 64, bits=3, group=32), rslora=True),
                                  dtypes="bf16")[0].passed

    # 2. transformers' modules.
    config = LlamaConfig(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                         num_key_value_heads=2, hidden_act="silu")
    mlp = LlamaMLP(config)
    for name, (i, o) in {"gate_proj": (128, 352), "up_proj": (128, 352),
                         "down_proj": (352, 128)}.items():
        setattr(mlp, name, lora(quant(i, o, group=32), r=4, alpha=8.0))
    cases = gradscope.check_module(mlp, dtypes=["fp32", "bf16"])
    assert all(c.passed for c in cases), cases
    assert "down_proj.lora_B.default.weight.grad" in {k.name for k in cases[0].checks}
    attention = LlamaAttention(config, layer_idx=0)
    for name, o in {"q_proj": 128, "k_proj": 64, "v_proj": 64}.items():
        setattr(attention, name, lora(quant(128, o, group=32), r=4, alpha=8.0))
    cases = gradscope.check_module(attention, kind="qkv", dtypes="fp16")
    assert cases[0].passed and "k_proj.lora_A.default.weight.grad" in {
        k.name for k in cases[0].checks}, cases

    # 3. Planted bugs, named by the module's paths.
    expect_failure(lora(quant(256, 96, cls=ReadsV1AsV2)), ["output", "input.grad"])
    text = expect_failure(lora(quant(256, 96), alpha=32.0, cls=ForgetsScalingInBackward),
                          ["lora_A.default.weight.grad", "lora_B.default.weight.grad"],
                          dtypes="fp32")
    assert "replay: gradscope.check_module(<ForgetsScalingInBackward>, dtypes='fp32'" in text, text

    # 4. Refusals.
    gelu = LlamaMLP(LlamaConfig(hidden_size=128, intermediate_size=352, hidden_act="gelu"))
    for name, (i, o) in {"gate_proj": (128, 352), "up_proj": (128, 352),
                         "down_proj": (352, 128)}.items():
        setattr(gelu, name, lora(quant(i, o, group=32)))
    expect_refusal(gelu, "not SiLU")
    expect_refusal(torch.nn.Linear(64, 64), "not a module check_module reads")
    plain = lora(quant(128, 64, cls=V1WithoutSaying))
    expect_refusal(plain, "pass zero_format='gptq' (v1) or 'gptq_v2'")
    assert gradscope.check_module(plain, zero_format="gptq", dtypes="fp32")[0].passed
    # 5. A model, module by module.
    model = tiny_llama()
    report = gradscope.check_model(model)
    assert report.passed and [(m.path, m.kind) for m in report.modules] == [
        ("model.layers.0.self_attn", "qkv"), ("model.layers.0.self_attn.o_proj", "lora_w"),
        ("model.layers.0.mlp", "mlp"), ("model.layers.1.self_attn", "qkv"),
        ("model.layers.1.self_attn.o_proj", "lora_w"), ("model.layers.1.mlp", "mlp")], report
    model = tiny_llama_down_proj_bug()
    try:
        gradscope.check_model(model)
        raise RuntimeError("a planted bug in layer 1 passed check_model")
    except AssertionError as e:
        text = str(e)
        assert text.startswith("first divergence: model.layers.1.mlp (mlp); 1 of 6 modules"), text
        assert "  model.layers.1.mlp.output: " in text, text
    report = gradscope.check_model(model, raise_on_failure=False)
    assert [m.passed for m in report.modules] == [True] * 5 + [False], report.table()
    print(report.table())
    print("check_module: a LoRA linear, LlamaMLP and LlamaAttention's q/k/v pass; two planted "
          "bugs fail by parameter path; three unmodelled modules refused by name; check_model "
          "finds the first divergence in a two-layer Llama")


if __name__ == "__main__":
    main()
