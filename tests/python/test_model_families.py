"""Model families as declarations (docs/model-families.md).

1. transformers' GraniteDecoderLayer (scores scaled by attention_multiplier, each residual
   branch by residual_multiplier) with LoRA on all seven projections passes check_module in
   fp32, bf16 and fp16, judged as family granite; check_model(by="layer") judges a two-layer
   GraniteForCausalLM layer by layer and passes.
2. A bug in a part the family adds is caught: a layer that leaves the multiplier off its MLP
   branch fails on its output; the same correct Granite layer read as Llama fails too (what
   judging a family against another's reference does).
3. Layers of families that only look like Llama (SmolLM3, Helium) are refused naming their
   model_type, not judged against Llama's reference.
4. A Llama 3.1 layer (rope_type llama3, its four scaling values) passes in every dtype; read as
   the default rotary embedding, the same layer fails: the scaling is what is judged.
5. check_model never gives up on a whole model: a module it cannot read as its kind is judged
   by its parts (a GELU MLP by its three projections; with by="layer", each layer of an
   undeclared family by its attention and MLP), each refusal in the report; a LoRA linear
   judged by nothing raises, naming it, or with raise_on_failure=False is listed as unjudged.
6. A malformed declaration is refused naming its file and key, in Python and on the command
   line (exit 2); a version 3 decoder_layer is refused showing both signatures.
"""
import dataclasses
import pathlib
import shutil
import subprocess

import pytest
import torch
from lora_models import LLAMA_SIZES, lora, quant, tiny_llama
from transformers import (GraniteConfig, GraniteForCausalLM, HeliumConfig, LlamaConfig,
                          SmolLM3Config)
from transformers.models.granite.modeling_granite import GraniteDecoderLayer
from transformers.models.helium.modeling_helium import HeliumDecoderLayer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from transformers.models.smollm3.modeling_smollm3 import SmolLM3DecoderLayer

import gradscope
from gradscope import readers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZES = dict(hidden_size=128, intermediate_size=352, num_attention_heads=4,
             num_key_value_heads=2)


def with_lora(layer):
    for parent in (layer.self_attn, layer.mlp):
        for name, (i, o) in LLAMA_SIZES.items():
            if hasattr(parent, name):
                setattr(parent, name, lora(quant(i, o, group=32), r=4, alpha=8.0))
    return layer


def granite_config(**kw):
    # Granite 3's multipliers are of this order (attention 1/64 .. 1/128, residual 0.22).
    return GraniteConfig(**SIZES, attention_multiplier=0.03, residual_multiplier=0.22, **kw)


def granite_layer(cls=GraniteDecoderLayer):
    torch.manual_seed(0)
    return with_lora(cls(granite_config(), 0))


def test_granite_layer_is_judged_as_granite():
    cases = gradscope.check_module(granite_layer())
    assert [c.status for c in cases] == ["pass"] * 3
    assert all(".granite.as0.03.rm0.22." in c.id for c in cases), [c.id for c in cases]


def test_granite_model_by_layer():
    torch.manual_seed(0)
    model = GraniteForCausalLM(granite_config(num_hidden_layers=2, vocab_size=64))
    for layer in model.model.layers:
        with_lora(layer)
    report = gradscope.check_model(model, by="layer", end_to_end=False)
    assert report.passed, report
    assert [m.kind for m in report.modules] == ["layer", "layer"]


class MlpBranchUnscaled(GraniteDecoderLayer):
    """A planted bug: the MLP's residual branch added without residual_multiplier (as a fused
    residual-add kernel that ignores the multiplier would)."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None,
                position_embeddings=None, **kwargs):
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                 attention_mask=attention_mask, position_ids=position_ids,
                                 position_embeddings=position_embeddings, **kwargs)
        h = hidden_states + attn * self.residual_multiplier
        return h + self.mlp(self.post_attention_layernorm(h))


def failing_paths(layer):
    cases = gradscope.check_module(layer, dtypes="fp32", raise_on_failure=False)
    return [c.path for case in cases for c in case.checks if c.status == "fail"]


def test_a_bug_in_a_granite_part_is_caught():
    failed = failing_paths(granite_layer(MlpBranchUnscaled))
    assert any(p.endswith("hidden/output") for p in failed), failed


def test_a_family_judged_against_another_fails():
    layer = granite_layer()
    layer.self_attn.config.model_type = "llama"  # read as Llama: no multipliers
    failed = failing_paths(layer)
    assert any(p.endswith("hidden/output") for p in failed), failed


@pytest.mark.parametrize("cls, config", [
    (SmolLM3DecoderLayer, SmolLM3Config(**SIZES)),
    (HeliumDecoderLayer, HeliumConfig(**SIZES, head_dim=32)),
])
def test_lookalikes_are_refused_by_model_type(cls, config):
    layer = with_lora(cls(config, 0))
    with pytest.raises(gradscope.ModuleRefused,
                       match=f"model_type '{config.model_type}' is declared by no model family"):
        gradscope.check_module(layer)


def llama31_layer():
    torch.manual_seed(0)
    config = LlamaConfig(**SIZES, max_position_embeddings=131072, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    return with_lora(LlamaDecoderLayer(config, 0))


def test_llama31_rope_scaling_is_judged():
    cases = gradscope.check_module(llama31_layer())
    assert [c.status for c in cases] == ["pass"] * 3
    assert all(".theta500000.llama3." in c.id for c in cases), [c.id for c in cases]


def test_llama31_read_with_the_default_rope_fails(monkeypatch):
    read = readers._layer_config

    def without_scaling(*args, **kwargs):
        return dataclasses.replace(read(*args, **kwargs), rope_type="default", rope_scaling={})

    monkeypatch.setattr(readers, "_layer_config", without_scaling)
    failed = failing_paths(llama31_layer())
    assert any(p.endswith("hidden/output") for p in failed), failed


def test_a_module_refused_as_its_kind_is_judged_by_its_parts():
    model = tiny_llama()
    model.model.layers[1].mlp.act_fn = torch.nn.GELU()  # the reference's MLP is SwiGLU
    report = gradscope.check_model(model, end_to_end=False)
    assert report.passed, report.table()
    [refusal] = report.refused
    assert refusal.path == "model.layers.1.mlp" and "not SiLU" in refusal.reason
    assert refusal.judged_by == [f"model.layers.1.mlp.{n}" for n in
                                 ("gate_proj", "up_proj", "down_proj")]
    kinds = {m.path: m.kind for m in report.modules}
    assert all(kinds[p] == "lora_w" for p in refusal.judged_by)
    assert kinds["model.layers.0.mlp"] == "mlp"
    assert "refused" in report.table() and "1 modules refused" in report.note


def test_by_layer_judges_an_undeclared_family_by_its_modules():
    model = tiny_llama()
    model.config.model_type = "toy_undeclared"  # the attention modules share this config
    report = gradscope.check_model(model, by="layer", end_to_end=False)
    assert report.passed, report.table()
    assert [r.path for r in report.refused] == ["model.layers.0", "model.layers.1"]
    assert all("declared by no model family" in r.reason for r in report.refused)
    assert {m.kind for m in report.modules} == {"qkv", "lora_w", "mlp"}


class V1WithoutSaying(gradscope.QuantLinear):
    """A base that stores v1 zero points and carries no attribute saying so."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        del self.zero_format


def test_a_linear_judged_by_nothing_is_named():
    model = tiny_llama()
    model.model.layers[0].self_attn.o_proj = lora(quant(128, 128, group=32,
                                                        cls=V1WithoutSaying), r=4, alpha=8.0)
    with pytest.raises(gradscope.GradscopeInputError,
                       match=r"1 LoRA modules could not be judged at all:\n"
                             r"  model.layers.0.self_attn.o_proj: .*zero_format"):
        gradscope.check_model(model, end_to_end=False)
    report = gradscope.check_model(model, end_to_end=False, raise_on_failure=False)
    assert [r.path for r in report.unjudged] == ["model.layers.0.self_attn.o_proj"]
    assert "NOT JUDGED" in report.table()
    assert len(report.modules) == 5  # the rest of the model was judged


@pytest.fixture
def bad_families(tmp_path, monkeypatch):
    for shipped in (ROOT / "families").glob("*.toml"):
        shutil.copy(shipped, tmp_path)
    text = (tmp_path / "granite.toml").read_text()
    (tmp_path / "granite.toml").write_text(text.replace('activation = "silu"',
                                                        'activation = "gelu_tanh"'))
    monkeypatch.setenv("GRADSCOPE_FAMILIES_DIR", str(tmp_path))
    return tmp_path / "granite.toml"


def test_a_malformed_declaration_is_refused_naming_file_and_key(bad_families):
    with pytest.raises(gradscope.GradscopeInputError,
                       match=rf"{bad_families}:\d+: mlp.activation is 'gelu_tanh'"):
        gradscope.families()


def test_the_command_line_refuses_it_too(bad_families, gradscope_bin, cases_dir):
    r = subprocess.run([gradscope_bin, "run", f"{cases_dir}/smoke/layer.toml", "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{bad_families}" in r.stderr and "mlp.activation" in r.stderr, r.stderr


def test_a_version_3_decoder_layer_is_refused(cases_dir):
    v3 = ("decoder_layer(Tensor x, Tensor input_norm, Tensor post_attention_norm, Tensor[] q, "
          "Tensor[] k, Tensor[] v, Tensor[] o, Tensor[] gate, Tensor[] up, Tensor[] down, "
          "int bits, str zero_format, float lora_alpha, bool use_rslora, int heads, "
          "int kv_heads, float rms_eps, float rope_theta, int position_offset) -> Tensor")
    library = torch.library.Library("family_v3", "DEF")
    try:
        gradscope.define_ops(library)
        library.define(v3)
        with pytest.raises(gradscope.GradscopeInputError,
                           match=r"(?s)family_v3::decoder_layer has a different signature.*"
                                 r"Dict\(str, Tensor\) norms.*schema version 4"):
            gradscope.check(f"{cases_dir}/smoke/layer_whole.toml", impl="family_v3")
    finally:
        library._destroy()
