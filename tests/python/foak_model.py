"""check_model on a small Llama patched by fms-acceleration-foak (docs/peers.md, the
fms-acceleration sections: what it finds per op, here per layer).

Usage: foak_model.py   (CUDA; fms-acceleration and fms-acceleration-foak installed; gradscope and
tests/python on PYTHONPATH). The model: test_model_llama.py's small Llama (4 layers, hidden 128,
4 query heads over 2, MLP 352, vocabulary 64), LoRA r16 (alpha 32) on all seven projections
over 4-bit group-32 GPTQ bases with v2 zero points (FOAK reads v1 zero points without their
offset: docs/peers.md), fp16 throughout, adapters included (FOAK's fused ops compute in fp16;
with fp32 adapters they need autocast). Patched the way FOAK's plugin patches a model
(`register_foak_model_patch_rules`, then `ModelPatcher.patch`) with fused_lora and
fast_rms_layernorm: instance-level forwards on each attention's q/k/v and o_proj, each MLP and
each RMSNorm. Runs:
1. LoRA dropout 0.1, module by module: the input gradient of each layer's q/k/v and o_proj
   (the dropout mask guessed from zeros, without its 1 / (1 - p)); each MLP's fused backward.
2. No dropout, module by module, and the model end to end: each MLP's fused backward raises,
   in its module check and end to end.
3. No dropout, FOAK's MLP patch taken off: the fused q/k/v, o_proj and RMSNorm judged end to
   end and layer by layer on the model's activations (every layer passes: asserted); then end
   to end again with the final norm (outside every decoder layer) back to transformers' own.
Runs 1 and 2 assert what docs/peers.md found per op, per layer.
"""
import functools
import time

import torch
from fms_acceleration.model_patcher import ModelPatcher
from fms_acceleration_foak.framework_plugin_fast_kernels import register_foak_model_patch_rules
from lora_models import lora, quant, with_own_weights
from transformers import LlamaConfig, LlamaForCausalLM

import gradscope

SIZES = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64), "o_proj": (128, 128),
         "gate_proj": (128, 352), "up_proj": (128, 352), "down_proj": (352, 128)}
CONFIG = LlamaConfig(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                     num_key_value_heads=2, num_hidden_layers=4, vocab_size=64)
V2 = functools.partial(gradscope.QuantLinear, zero_format="gptq_v2")


def build(dropout):
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, (n_in, n_out) in SIZES.items():
                if hasattr(parent, name):
                    setattr(parent, name, lora(quant(n_in, n_out, group=32, cls=V2), r=16,
                                               alpha=32.0, p=dropout))
    model = with_own_weights(model).half().cuda()
    ModelPatcher.patch(model)
    return model


def patched(model):
    return sorted({type(m).__name__ for m in model.modules() if "forward" in m.__dict__})


def failing(report):
    return {m.path: sorted({k.name for c in m.cases for k in c.checks if not k.passed})
            for m in report.modules if not m.passed}


def run(what, fn):
    start = time.perf_counter()
    report = fn()
    print(f"\n== {what} ({time.perf_counter() - start:.1f} s)")
    print(report.table())
    for line in report.divergence_lines():
        print(line[:600])
    return report


def main():
    register_foak_model_patch_rules("auto_gptq", {"qkvo", "mlp", "rms"}, CONFIG)
    layers = [f"model.layers.{i}" for i in range(CONFIG.num_hidden_layers)]

    model = build(dropout=0.1)
    print("instance-level forwards after FOAK's patch:", patched(model))
    report = run("1. LoRA dropout 0.1, module by module",
                 lambda: gradscope.check_model(model, dtypes=["fp16"], raise_on_failure=False))
    found = failing(report)
    for layer in layers:
        assert "input.grad" in found.get(f"{layer}.self_attn", []), found
        assert "input.grad" in found.get(f"{layer}.self_attn.o_proj", []), found
        assert found.get(f"{layer}.mlp") == ["error"], found
    assert "dropout" in report.note, report.note

    model = build(dropout=0.0)
    report = run("2. no dropout, module by module and end to end",
                 lambda: gradscope.check_model(model, dtypes=["fp16"], raise_on_failure=False))
    found = failing(report)
    print("failing:", found)
    for layer in layers:
        assert found.get(f"{layer}.mlp") == ["error"], found
    assert found.get("end_to_end") == ["error"], found

    for layer in model.model.layers:
        del layer.mlp.__dict__["forward"]  # the class's MLP forward over peft's LoRA linears
    run("3a. no dropout, FOAK's MLP patch off, module by module and end to end",
        lambda: gradscope.check_model(model, dtypes=["fp16"], raise_on_failure=False))
    report = run("3b. the same, layer by layer on the model's activations",
                 lambda: gradscope.check_model(model, dtypes=["fp16"], by="layer", inputs="model",
                                               end_to_end=False, raise_on_failure=False))
    assert report.passed, failing(report)  # FOAK's fused q/k/v, o_proj and RMSNorm, per layer
    # The final norm back to transformers' own (it sits outside every decoder layer).
    print("final norm patched by FOAK:", model.model.norm.__dict__.pop("forward", None) is not None)
    run("3c. the same, the final norm's FOAK patch also off, end to end",
        lambda: gradscope.check_model(model, dtypes=["fp16"], raise_on_failure=False))


if __name__ == "__main__":
    main()
