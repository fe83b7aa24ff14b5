"""The real stack (docs/python.md, "The real stack"): a GPTQ checkpoint written by `gradscope
export`, loaded the way a user loads one (transformers' from_pretrained through its GPTQ
integration: optimum, and GPTQModel's torch QuantLinear on the CPU), LoRA by peft's
get_peft_model, judged by check_module and check_model.

Usage: gptqmodel_stack.py GRADSCOPE   (the CLI binary; CTest python_gptqmodel_stack)
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
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from gptqmodel.nn_modules.qlinear import BaseQuantLinear
from peft import LoraConfig, get_peft_model
from peft.tuners.lora.gptq import GPTQLoraLinear
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import gradscope

SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_checkpoint(gradscope_cli: str, folder: str) -> str:
    """A transformers GPTQ checkpoint: the export's packed projections, the rest seeded."""
    quant = os.path.join(folder, "export")
    subprocess.run([gradscope_cli, "export", "--out", quant, "--layers", "4", "--hidden", "128",
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
    config = json.load(open(config_file))
    config["quantization_config"] = json.load(open(os.path.join(quant, "quantize_config.json")))
    json.dump(config, open(config_file, "w"), indent=1)
    return model_dir


def load(model_dir: str, dtype: torch.dtype):
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


def timed(what, fn):
    start = time.perf_counter()
    result = fn()
    print(f"{what}: {time.perf_counter() - start:.1f} s")
    return result


def main():
    with tempfile.TemporaryDirectory(prefix="gradscope-gptqmodel-") as folder:
        model_dir = write_checkpoint(sys.argv[1], folder)
        layers = "base_model.model.model.layers"
        for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            model = load(model_dir, dtype)
            print(f"{name}: {type(model.base_model.model.model.layers[0].mlp.up_proj.base_layer)}")
            o_proj = model.base_model.model.model.layers[2].self_attn.o_proj
            timed(f"check_module, peft's LoRA linear over GPTQModel's QuantLinear, {name}",
                  lambda: gradscope.check_module(o_proj, dtypes=[name]))
            report = timed(f"check_model, {name}, by module and end to end",
                           lambda: gradscope.check_model(model, dtypes=[name], end_to_end=True))
            print(report.table())
            report = timed(f"check_model, {name}, layer by layer on the model's activations",
                           lambda: gradscope.check_model(model, dtypes=[name], by="layer",
                                                         inputs="model", end_to_end=False))
            assert [m.kind for m in report.modules] == ["layer"] * 4, report.table()

        model = load(model_dir, torch.float32)
        report = timed("check_model, fp32", lambda: gradscope.check_model(
            model, dtypes=["fp32"], end_to_end=True, raise_on_failure=False))
        print(report.table())
        assert not any(m.passed for m in report.modules), report.table()
        first = report.first_failure
        assert first.path == f"{layers}.0.self_attn", first.path
        failing = {k.name for c in first.cases for k in c.checks if not k.passed}
        assert {"q_proj.output", "k_proj.output", "v_proj.output"} <= failing, failing
        print(report.divergence_lines()[0])
        # The cause, read off the QuantLinear: its dequantized weight is the exact one (fp32
        # holds it: an fp16 scale times a code difference of at most 9 bits) rounded to fp16.
        base = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
        fmt = {1: "gptq", 2: "gptq_v2"}[base.qzero_format()]
        exact = torch.ops.gradscope.dequantize(base.qweight, base.qzeros, base.scales, base.g_idx,
                                               base.bits, fmt, torch.float32)
        weight = base.dequantize_weight(num_itr=1)
        assert weight.dtype == torch.float16, weight.dtype
        assert torch.equal(weight.float(), exact.half().float())
        assert not torch.equal(weight.float(), exact)
    print("GPTQModel's QuantLinear under peft, loaded from gradscope's export: passes in fp16 and "
          "bf16 by module, by layer and end to end; in fp32 every module fails (its weights "
          "dequantized to fp16)")


if __name__ == "__main__":
    main()
