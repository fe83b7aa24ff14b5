"""check_model on a small Llama patched by fms-acceleration-foak (docs/peers.md, the
fms-acceleration sections: what it finds per op, here per layer).

CUDA, with fms-acceleration and fms-acceleration-foak installed (scripts/device-peers.sh,
STEPS=foak_model); skipped without them unless GRADSCOPE_REQUIRE_CUDA is set. The model:
test_model_llama.py's small Llama (4 layers, hidden 128, 4 query heads over 2, MLP 352,
vocabulary 64), LoRA r16 (alpha 32) on all seven projections over 4-bit group-32 GPTQ bases with
v2 zero points (FOAK reads v1 zero points without their offset: docs/peers.md), fp16
throughout, adapters included (FOAK's fused ops compute in fp16; with fp32 adapters they need
autocast). Patched the way FOAK's plugin patches a model
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
from __future__ import annotations

import functools
import os
import time
from typing import Callable, Dict, List

import pytest
import torch
from lora_models import lora, quant, with_own_weights
from transformers import LlamaConfig, LlamaForCausalLM

import gradscope
from gradscope.model_check import ModelReport

# Skipped where the peers or a GPU are absent; GRADSCOPE_REQUIRE_CUDA (scripts/device-peers.sh)
# makes their absence a failure instead.
if not os.environ.get("GRADSCOPE_REQUIRE_CUDA"):
    if not torch.cuda.is_available():
        pytest.skip("FOAK's fused kernels need CUDA", allow_module_level=True)
    pytest.importorskip("fms_acceleration")
    pytest.importorskip("fms_acceleration_foak")
from fms_acceleration.model_patcher import ModelPatcher  # noqa: E402
from fms_acceleration_foak.framework_plugin_fast_kernels import (  # noqa: E402
    register_foak_model_patch_rules)

SIZES = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64), "o_proj": (128, 128),
         "gate_proj": (128, 352), "up_proj": (128, 352), "down_proj": (352, 128)}
CONFIG = LlamaConfig(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                     num_key_value_heads=2, num_hidden_layers=4, vocab_size=64)
V2 = functools.partial(gradscope.QuantLinear, zero_format="gptq_v2")
LAYERS = [f"model.layers.{i}" for i in range(CONFIG.num_hidden_layers)]


@pytest.fixture(scope="module", autouse=True)
def _rules() -> None:
    register_foak_model_patch_rules("auto_gptq", {"qkvo", "mlp", "rms"}, CONFIG)


def build(dropout: float) -> LlamaForCausalLM:
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


def patched(model: torch.nn.Module) -> List[str]:
    return sorted({type(m).__name__ for m in model.modules() if "forward" in m.__dict__})


def failing(report: ModelReport) -> Dict[str, List[str]]:
    return {m.path: sorted({k.name for c in m.cases for k in c.checks if not k.passed})
            for m in report.modules if not m.passed}


def run(what: str, fn: Callable[[], ModelReport]) -> ModelReport:
    start = time.perf_counter()
    report = fn()
    print(f"\n== {what} ({time.perf_counter() - start:.1f} s)")
    print(report.table())
    for line in report.divergence_lines():
        print(line[:600])
    return report


def test_with_dropout_qkv_o_proj_input_grads_and_mlps_fail() -> None:
    model = build(dropout=0.1)
    print("instance-level forwards after FOAK's patch:", patched(model))
    report = run("1. LoRA dropout 0.1, module by module",
                 lambda: gradscope.check_model(model, dtypes=["fp16"], raise_on_failure=False))
    found = failing(report)
    for layer in LAYERS:
        assert "input.grad" in found.get(f"{layer}.self_attn", []), found
        assert "input.grad" in found.get(f"{layer}.self_attn.o_proj", []), found
        assert found.get(f"{layer}.mlp") == ["error"], found
    assert "dropout" in report.note, report.note


def test_without_dropout_each_mlp_raises_by_module_and_end_to_end() -> None:
    model = build(dropout=0.0)
    report = run("2. no dropout, module by module and end to end",
                 lambda: gradscope.check_model(model, dtypes=["fp16"], raise_on_failure=False))
    found = failing(report)
    print("failing:", found)
    for layer in LAYERS:
        assert found.get(f"{layer}.mlp") == ["error"], found
    assert found.get("end_to_end") == ["error"], found


def test_with_the_mlp_patch_off_every_layer_passes() -> None:
    model = build(dropout=0.0)
    for layer in model.model.layers:
        del layer.mlp.__dict__["forward"]  # the class's MLP forward over peft's LoRA linears
    # Reported, not asserted: the end-to-end figures docs/peers.md gives.
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
