"""The real stack (docs/python.md, "The real stack"): a GPTQ checkpoint written by `gradscope
export`, loaded the way a user loads one (transformers' from_pretrained through its GPTQ
integration: optimum, and GPTQModel's torch QuantLinear on the CPU), LoRA by peft's
get_peft_model, judged by check_module and check_model.

The model: a 4-layer Llama (hidden 128, 4 query heads over 2, MLP 352, vocabulary 64) whose
seven projections per layer are the export's 4-bit group-32 v1 (auto_gptq's) weights, the rest
a seeded transformers initialisation; LoRA r16 (alpha 32) on all seven, lora_B drawn non-zero.
1. fp16 and bf16: peft's LoRA linear over GPTQModel's QuantLinear passes check_module; the model
   passes check_model module by module, layer by layer on its own activations, and end to end.
2. fp32: every module fails, and end to end too: GPTQModel's torch kernel dequantizes to the
   scales' dtype (fp16) and then casts to fp32, so an fp32 model computes with weights rounded
   to fp16 (a relative 2^-11 where fp32 holds them exactly); the first divergence is layer 0's
   q/k/v outputs.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any, Callable, Tuple, TypeVar

import pytest
import torch
from gptqmodel.nn_modules.qlinear import BaseQuantLinear
from peft import LoraConfig, get_peft_model
from peft.tuners.lora.gptq import GPTQLoraLinear
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import gradscope
from gradscope.model_check import ModelReport

SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAYERS = "base_model.model.model.layers"
T = TypeVar("T")


@pytest.fixture(scope="module")
def model_dir(gradscope_bin: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A transformers GPTQ checkpoint: the export's packed projections, the rest seeded."""
    folder = str(tmp_path_factory.mktemp("gradscope-gptqmodel-"))
    quant = os.path.join(folder, "export")
    subprocess.run([gradscope_bin, "export", "--out", quant, "--layers", "4", "--hidden", "128",
                    "--intermediate", "352", "--heads", "4", "--kv-heads", "2", "--group-size",
                    "32", "--seed", "5"], check=True, capture_output=True)
    model_dir = os.path.join(folder, "model")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=352,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 num_hidden_layers=4)).save_pretrained(model_dir)
    weights = os.path.join(model_dir, "model.safetensors")
    state = {k: v for k, v in load_file(weights).items() if not k.endswith("_proj.weight")}
    state.update(load_file(os.path.join(quant, "model.safetensors")))
    save_file(state, weights, metadata={"format": "pt"})
    config_file = os.path.join(model_dir, "config.json")
    with open(config_file) as f:
        config = json.load(f)
    with open(os.path.join(quant, "quantize_config.json")) as f:
        config["quantization_config"] = json.load(f)
    with open(config_file, "w") as f:
        json.dump(config, f, indent=1)
    return model_dir


def load(model_dir: str, dtype: torch.dtype) -> Any:
    """As a user fine-tunes a GPTQ model: from_pretrained, then get_peft_model."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="cpu", dtype=dtype)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=SEVEN))
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, GPTQLoraLinear), type(q_proj)
    assert isinstance(q_proj.base_layer, BaseQuantLinear), type(q_proj.base_layer)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # trained adapters: peft's zero lora_B makes lora_A's gradient zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def timed(what: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    result = fn()
    print(f"{what}: {time.perf_counter() - start:.1f} s")
    return result


@pytest.fixture(scope="module", params=[("fp16", torch.float16), ("bf16", torch.bfloat16)],
                ids=["fp16", "bf16"])
def half_model(request: pytest.FixtureRequest, model_dir: str) -> Tuple[str, Any]:
    """The model loaded in fp16 or bf16, with its dtype's name."""
    name, dtype = request.param
    model = load(model_dir, dtype)
    print(f"{name}: {type(model.base_model.model.model.layers[0].mlp.up_proj.base_layer)}")
    return name, model


def test_check_module_passes_peft_over_quant_linear(half_model: Tuple[str, Any]) -> None:
    name, model = half_model
    o_proj = model.base_model.model.model.layers[2].self_attn.o_proj
    # Raises on a failing check.
    timed(f"check_module, peft's LoRA linear over GPTQModel's QuantLinear, {name}",
          lambda: gradscope.check_module(o_proj, dtypes=[name]))


def test_check_model_passes_by_module_and_end_to_end(half_model: Tuple[str, Any]) -> None:
    name, model = half_model
    report = timed(f"check_model, {name}, by module and end to end",
                   lambda: gradscope.check_model(model, dtypes=[name], end_to_end=True))
    print(report.table())


def test_check_model_passes_layer_by_layer(half_model: Tuple[str, Any]) -> None:
    name, model = half_model
    report = timed(f"check_model, {name}, layer by layer on the model's activations",
                   lambda: gradscope.check_model(model, dtypes=[name], by="layer",
                                                 inputs="model", end_to_end=False))
    assert [m.kind for m in report.modules] == ["layer"] * 4, report.table()


@pytest.fixture(scope="module")
def fp32(model_dir: str) -> Tuple[Any, ModelReport]:
    """The model in fp32 and its check_model report, by module and end to end."""
    model = load(model_dir, torch.float32)
    report = timed("check_model, fp32", lambda: gradscope.check_model(
        model, dtypes=["fp32"], end_to_end=True, raise_on_failure=False))
    print(report.table())
    return model, report


def test_fp32_fails_every_module_and_end_to_end(fp32: Tuple[Any, ModelReport]) -> None:
    _, report = fp32
    assert not any(m.passed for m in report.modules), report.table()


def test_fp32_first_divergence_is_layer_0_qkv(fp32: Tuple[Any, ModelReport]) -> None:
    _, report = fp32
    first = report.first_failure
    assert first.path == f"{LAYERS}.0.self_attn", first.path
    failing = {k.name for c in first.cases for k in c.checks if not k.passed}
    assert {"q_proj.output", "k_proj.output", "v_proj.output"} <= failing, failing
    print(report.divergence_lines()[0])


def test_fp32_cause_weights_dequantized_to_fp16(fp32: Tuple[Any, ModelReport]) -> None:
    """The cause, read off the QuantLinear: its dequantized weight is the exact one (fp32
    holds it: an fp16 scale times a code difference of at most 9 bits) rounded to fp16."""
    model, _ = fp32
    base = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    fmt = {1: "gptq", 2: "gptq_v2"}[base.qzero_format()]
    exact = torch.ops.gradscope.dequantize(base.qweight, base.qzeros, base.scales, base.g_idx,
                                           base.bits, fmt, torch.float32)
    weight = base.dequantize_weight(num_itr=1)
    assert weight.dtype == torch.float16, weight.dtype
    assert torch.equal(weight.float(), exact.half().float())
    assert not torch.equal(weight.float(), exact)
