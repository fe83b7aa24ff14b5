"""gradscope.check_module on modules as users build them (docs/python.md, "check_module").

1. peft's GPTQLoraLinear over a GPTQ QuantLinear passes in every dtype, with dropout and bias;
   its checks are named by the module's own parameter paths.
2. transformers' LlamaMLP with LoRA on gate/up/down runs its own forward and passes (kind mlp);
   the q/k/v projections of a LlamaAttention with grouped-query heads pass (kind qkv), also
   fused as fms-acceleration fuses them (all three computed at the first call).
3. Bugs planted in the module are caught, each named by the module's path: a QuantLinear that
   reads v1 zero points as v2, a LoRA layer that leaves out its scaling in backward only.
4. What the reference does not model is refused by name: a GELU MLP, a plain nn.Linear, a
   base that does not say how its zero points are stored, a LoRA layer whose adapter is off.
5. check_model over a two-layer LlamaForCausalLM with LoRA on all seven projections: six
   modules pass; a bug planted in layer 1's down_proj base is the first divergence, named by
   its path, and layer 0 still passes.
6. weights="module": the module's own packed base, bias and adapters are what every
   implementation and the reference run on. A base that caches its dequantized weight at
   construction fails on the case's weights and passes on its own; peft's zero lora_B is
   redrawn with a warning; a decoder layer's own norms are taken too.
7. A case's `tensors` file: its x, dy and adapters are the dump's inputs bit for bit (x and dy
   rounded to bf16); gradscope.make_case's tensors of a qkv case and of a two-layer stack, fed
   back as the case's file, give every max_abs and limit of the seeded run bit for bit. A file
   that does not fit the case is refused naming the file and the tensor: a wrong shape or
   dtype, a name the case does not draw, a packed base without its g_idx, a g_idx naming a
   group that does not exist, a file that is not there, a NaN, a value beyond fp16, a given x
   with a profile field that would shape a draw.
"""
import functools
import os
import types
import warnings

import h5py
import pytest
import torch
from lora_models import (ReadsV1AsV2, expect_failure, expect_refusal, lora, quant, tiny_llama,
                         tiny_llama_down_proj_bug)
from peft.tuners.lora.gptq import GPTQLoraLinear
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

import gradscope


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


class CachesItsWeight(gradscope.QuantLinear):
    """A base that dequantizes once, at first use, and keeps the result: it never sees packed
    words swapped in later (stale after a weight update)."""

    def forward(self, x):
        if not hasattr(self, "_cached"):
            self._cached = torch.ops.gradscope.dequantize(
                self.qweight, self.qzeros, self.scales, self.g_idx, self.bits, self.zero_format,
                torch.float32)
        y = x @ self._cached.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def fuse_qkv(attention):
    """Patches q/k/v as fms-acceleration does (instance-level forwards): the first call
    computes all three outputs from the three projections as they are then, the next two hand
    theirs out. Correct, and wrong if a check swapped in only the called projection's tensors."""
    outs = {}

    def forward(self, x, name):
        if not outs:
            outs.update({n: GPTQLoraLinear.forward(getattr(attention, n), x)
                         for n in ("q_proj", "k_proj", "v_proj")})
        return outs.pop(name)

    for name in ("q_proj", "k_proj", "v_proj"):
        proj = getattr(attention, name)
        proj.forward = types.MethodType(functools.partial(forward, name=name), proj)
    return attention


def filled(base, seed):
    """The module's own packed words, scales and bias: any 32-bit words are valid codes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("qweight", "qzeros"):
            t = getattr(base, name)
            t.copy_(torch.randint(-2**31, 2**31 - 1, t.shape, generator=g, dtype=torch.int64)
                    .to(torch.int32))
        base.scales.copy_(torch.rand(base.scales.shape, generator=g) * 0.02 + 0.001)
        if base.bias is not None:
            base.bias.copy_(torch.randn(base.bias.shape, generator=g))
    return base


def adapters_drawn(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for part in (m.lora_A["default"], m.lora_B["default"]):
            part.weight.copy_(torch.randn(part.weight.shape, generator=g) * 0.1)
    return m


def case_file(folder, text):
    path = os.path.join(folder, f"case{len(os.listdir(folder))}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_a_lora_linear():
    m = lora(quant(256, 96, bias=True), r=8, alpha=16.0, p=0.1)
    cases = gradscope.check_module(m)
    assert [c.status for c in cases] == ["pass"] * 3, cases
    names = {k.name for c in cases for k in c.checks}
    assert names == {"output", "input.grad", "lora_A.default.weight.grad",
                     "lora_B.default.weight.grad"}, names
    assert gradscope.check_module(lora(quant(128, 64, bits=3, group=32), rslora=True),
                                  dtypes="bf16")[0].passed


def test_transformers_mlp_and_attention():
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
    cases = gradscope.check_module(fuse_qkv(attention), kind="qkv", dtypes=["fp32", "fp16"])
    assert all(c.passed for c in cases), cases


def test_planted_bugs_named_by_the_modules_paths():
    expect_failure(lora(quant(256, 96, cls=ReadsV1AsV2)), ["output", "input.grad"])
    text = expect_failure(lora(quant(256, 96), alpha=32.0, cls=ForgetsScalingInBackward),
                          ["lora_A.default.weight.grad", "lora_B.default.weight.grad"],
                          dtypes="fp32")
    assert ("replay: gradscope.check_module(<ForgetsScalingInBackward>, kind='lora_w', "
            "dtypes='fp32'") in text, text


def test_refusals():
    gelu = LlamaMLP(LlamaConfig(hidden_size=128, intermediate_size=352, hidden_act="gelu"))
    for name, (i, o) in {"gate_proj": (128, 352), "up_proj": (128, 352),
                         "down_proj": (352, 128)}.items():
        setattr(gelu, name, lora(quant(i, o, group=32)))
    expect_refusal(gelu, "not SiLU")
    expect_refusal(torch.nn.Linear(64, 64), "not a module check_module reads")
    plain = lora(quant(128, 64, cls=V1WithoutSaying))
    expect_refusal(plain, "pass zero_format='gptq' (v1) or 'gptq_v2'")
    assert gradscope.check_module(plain, zero_format="gptq", dtypes="fp32")[0].passed
    disabled = lora(quant(128, 64, group=32))
    disabled.enable_adapters(False)  # its forward is the base alone
    expect_refusal(disabled, "does not run adapter 'default' alone")


def test_a_model_module_by_module():
    model = tiny_llama()
    report = gradscope.check_model(model)
    assert report.passed and [(m.path, m.kind) for m in report.modules] == [
        ("model.layers.0.self_attn", "qkv"), ("model.layers.0.self_attn.o_proj", "lora_w"),
        ("model.layers.0.mlp", "mlp"), ("model.layers.1.self_attn", "qkv"),
        ("model.layers.1.self_attn.o_proj", "lora_w"), ("model.layers.1.mlp", "mlp")], report
    model = tiny_llama_down_proj_bug()
    with pytest.raises(AssertionError) as e:
        gradscope.check_model(model)
    text = str(e.value)
    assert text.startswith("first divergence: model.layers.1.mlp (mlp); 1 of 6 modules"), text
    assert "  model.layers.1.mlp.output: " in text, text
    report = gradscope.check_model(model, raise_on_failure=False)
    assert [m.passed for m in report.modules] == [True] * 5 + [False], report.table()


def test_the_modules_own_weights():
    """The caching base has run once (its model's forward)."""
    def stale_module():
        m = adapters_drawn(lora(filled(quant(128, 64, bias=True, cls=CachesItsWeight), 3)), 4)
        m(torch.randn(2, 128))
        return m

    expect_failure(stale_module(), ["output"], dtypes="fp32")
    stale = stale_module()
    cases = gradscope.check_module(stale, weights="module", dtypes=["fp32", "bf16"])
    assert all(c.passed for c in cases) and ".tensors." in cases[0].id, cases
    fresh = lora(filled(quant(128, 64), 5))  # peft's init: lora_B all zeros
    assert not fresh.lora_B["default"].weight.any()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gradscope.check_module(fresh, weights="module", dtypes="bf16")[0].passed
    assert any("lora_B.default.weight is all zeros" in str(w.message) for w in caught), caught
    layer = tiny_llama(layers=1).model.layers[0]
    with torch.no_grad():
        layer.input_layernorm.weight.uniform_(0.5, 1.5)
    for proj in (layer.self_attn.q_proj, layer.mlp.down_proj):
        filled(proj.base_layer, 6)
        adapters_drawn(proj, 7)
    # A tensor of the file the case did not take (the norms among them) would be exit 2.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the other five projections' lora_B are peft's zeros
        assert gradscope.check_module(layer, weights="module", dtypes="bf16")[0].passed


def test_a_tensors_file_is_what_every_implementation_ran_on(tmp_path):
    """What a tensors file gives is what every implementation and the reference ran on (the
    dump's inputs), rounded once to the case's dtype."""
    d = str(tmp_path)
    g = torch.Generator().manual_seed(8)
    given = {"x": torch.randn(2, 5, 64, generator=g), "dy": torch.randn(2, 5, 32, generator=g),
             "o_proj.lora_A": torch.randn(8, 64, generator=g, dtype=torch.float64).float(),
             "o_proj.lora_B": torch.randn(32, 8, generator=g)}
    save_file(given, os.path.join(d, "t.safetensors"))
    with open(os.path.join(d, "c.toml"), "w") as f:
        f.write(f'kind = "lora_w"\nin_features = 64\nout_features = 32\ngroup_size = 32\n'
                f'seq = 5\ndtype = "bf16"\ntensors = "{d}/t.safetensors"\n')
    [case] = gradscope.check(os.path.join(d, "c.toml"),
                             dump=os.path.join(d, "dump.h5"))
    assert case.passed, case
    with h5py.File(os.path.join(d, "dump.h5"), "r") as f:
        inputs = f[case.id]["inputs"]
        for name, t in given.items():
            want = t.to(torch.bfloat16 if name in ("x", "dy") else torch.float32).double()
            assert torch.equal(torch.from_numpy(inputs[name][()]).double(), want), name


def test_make_case_fed_back_gives_the_same_values(tmp_path):
    """make_case gives a case's tensors under those names: fed back as the case's tensors file,
    the case judges the same values (every max_abs and limit the same, bit for bit)."""
    d = str(tmp_path)
    for text in ('kind = "qkv"\nhidden = 128\nheads = 4\nkv_heads = 2\nbias = true\n'
                 'dtype = "bf16"\nseq = 9\n',
                 'kind = "layer"\nlayers = 2\nseq = 9\ndtype = "fp16"\n'):
        plain = os.path.join(d, "plain.toml")
        with open(plain, "w") as f:
            f.write(text)
        tensors = gradscope.make_case(plain)
        assert "x" in tensors and any(k.endswith("q_proj.qweight") for k in tensors), tensors
        save_file(tensors, os.path.join(d, "t.safetensors"))
        given = os.path.join(d, "given.toml")
        with open(given, "w") as f:
            f.write(text + f'tensors = "{d}/t.safetensors"\n')
        [a], [b] = gradscope.check(plain), gradscope.check(given)
        assert a.passed and b.passed, (a, b)
        assert [(k.max_abs, k.limit) for k in a.checks] == [
            (k.max_abs, k.limit) for k in b.checks], (a.checks, b.checks)
    for args, kw, words in [
            ((plain,), {"filter": "no-such-case*"}, "no case id matches"),
            ((plain, case_file(d, 'kind = "qkv"\n[matrix]\ndtype = ["fp32", "bf16"]\n')),
             {}, "the selection holds 3 cases; select one"),
            ((case_file(d, 'kind = "dequant"\n'),), {},
             "kind 'dequant' does not list its generated tensors")]:
        with pytest.raises(gradscope.GradscopeInputError) as e:
            gradscope.make_case(list(args), **kw)
        assert words in str(e.value), (words, str(e.value))


_PACKED = {"o_proj.qweight": torch.zeros(8, 32, dtype=torch.int32),
           "o_proj.qzeros": torch.zeros(2, 4, dtype=torch.int32),
           "o_proj.scales": torch.ones(2, 32, dtype=torch.float16)}
_NAN = torch.zeros(2, 5, 64)
_NAN[1, 4, 63] = float("nan")
REFUSED_FILES = [  # (tensors, what the refusal says, more case text)
    ({"o_proj.lora_A": torch.zeros(8, 65)},
     "tensor o_proj.lora_A is F32 [8, 65]; the case expects F32, F16 or BF16 [8, 64]", ""),
    ({"o_proj.lora_a": torch.zeros(8, 64)}, "draws no tensor named o_proj.lora_a", ""),
    (_PACKED, "o_proj has only some of qweight, qzeros, scales, g_idx", ""),
    ({**_PACKED, "o_proj.g_idx": torch.full((64,), 2, dtype=torch.int32)},
     "o_proj.g_idx names groups outside [0, 2)", ""),
    (None, "tensors must name a file; there is none at", ""),
    ({"x": torch.zeros(2, 5, 64, dtype=torch.float64)},
     "tensor x is F64 [2, 5, 64]; the case expects F32, F16 or BF16 [2, 5, 64]", ""),
    ({"x": _NAN}, "tensor x holds a NaN or an infinity", ""),
    ({"x": torch.full((2, 5, 64), 1e6)}, "tensor x overflows fp16", 'dtype = "fp16"\n'),
    ({"x": torch.zeros(2, 5, 64)}, "input-profile fields (profile, x_scale", "x_scale = 2.0\n"),
]


@pytest.mark.parametrize("tensors, words, extra", REFUSED_FILES,
                         ids=[w.split(";")[0][:40] for _, w, _ in REFUSED_FILES])
def test_a_tensors_file_that_does_not_fit_is_refused(tmp_path, tensors, words, extra):
    path = str(tmp_path / "t.safetensors")
    if tensors is not None:
        save_file(tensors, path)
    toml = str(tmp_path / "c.toml")
    with open(toml, "w") as f:
        f.write(f'kind = "lora_w"\nin_features = 64\nout_features = 32\ngroup_size = 32\n'
                f'tensors = "{path}"\nseq = 5\n{extra}')
    with pytest.raises(gradscope.GradscopeInputError) as e:
        gradscope.check(toml)
    assert words in str(e.value), (words, str(e.value))
