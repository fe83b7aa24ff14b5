"""check_model on a Llama as users build it (docs/python.md, "A model, module by module").

Usage: check_model_llama.py [--device cuda] [--shape small|7b]
  small (CTest python_check_model_llama): 4 layers, hidden 128, 4 query heads over 2 key/value
  heads, MLP 352, vocabulary 64; 7b: one layer of Llama-2-7B's shape (hidden 4096, 32 heads,
  MLP 11008). LoRA r16 (alpha 32) on all seven projections over 4-bit GPTQ bases
  (gradscope.QuantLinear, group 32 / 128), weights of their own (lora_models.with_own_weights).
1. The unmodified transformers + peft model passes check_model in fp32, bf16 and fp16, module by
   module and, on the model's own activations, layer by layer.
2. A copy whose o_proj in the last layer computes its LoRA path through an autograd function
   that leaves the scaling out of lora_B's gradient fails, and the first divergence names that
   layer, o_proj and lora_B's gradient, with every other module passing; end to end, only that
   gradient fails.
3. End to end (the loss and every LoRA gradient against the model in fp64): the fp32 model and
   the same model held in bf16 and in fp16 pass, as does an fp16 model whose bases round
   differently (another GEMM layout); a final norm patched to forget its weight (an
   instance-level forward, as model patchers install fused kernels) passes every module check
   and fails end to end, as does a GPTQ linear without LoRA that reads v1 zero points as v2;
   an MLP whose backward raises fails by module and end to end. The unmodified stack's
   end-to-end err/limit is 0.5 exactly: it computes the baseline's bits.
4. Optimizer steps end to end: three pass; an o_proj that keeps lora_B transposed from its first
   call passes step 0 (layer by layer and end to end) and fails from step 1 on; the model's
   adapters are restored after.
Prints each run's wall time.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

import torch
from lora_models import ReadsV1AsV2, lora, quant, with_own_weights
from peft.tuners.lora.gptq import GPTQLoraLinear
from transformers import LlamaConfig, LlamaForCausalLM

import gradscope

try:  # in CTest's environment; a GPU machine may lack it (the dump is then not written)
    import h5py
except ImportError:
    h5py = None

DEVICE = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
SHAPE = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "small"
SHAPES = {"small": dict(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                        num_key_value_heads=2, num_hidden_layers=4, group=32),
          "7b": dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                     num_key_value_heads=32, num_hidden_layers=1, group=128)}


class _LoraB(torch.autograd.Function):
    """(x A^T) B^T s; backward leaves s out of B's gradient (the planted bug)."""

    @staticmethod
    def forward(ctx, h, b, s):
        ctx.save_for_backward(h, b)
        ctx.s = s
        return (h @ b.t()) * s

    @staticmethod
    def backward(ctx, dy):
        h, b = ctx.saved_tensors
        dh = (dy @ b) * ctx.s
        db = dy.reshape(-1, dy.shape[-1]).t() @ h.reshape(-1, h.shape[-1])  # no ctx.s
        return dh, db.to(b.dtype), None


class LoraBGradUnscaled(GPTQLoraLinear):
    def forward(self, x):
        a, b = self.lora_A["default"], self.lora_B["default"]
        h = a(self.lora_dropout["default"](x.to(a.weight.dtype)))
        lora_out = _LoraB.apply(h, b.weight, self.scaling["default"])
        return self.base_layer(x) + lora_out.to(x.dtype)


class TransposedGemm(gradscope.QuantLinear):
    """A correct base that rounds differently: x Wᵀ from W [out, in] (another GEMM layout)."""

    def forward(self, x):
        w = torch.ops.gradscope.dequantize(self.qweight, self.qzeros, self.scales, self.g_idx,
                                           self.bits, self.zero_format, x.dtype)
        return torch.nn.functional.linear(x, w.t().contiguous())


def build(bug=False, dtype=torch.float32, base=gradscope.QuantLinear, seed=0,
          lora_cls=LoraBGradUnscaled):
    shape = dict(SHAPES[SHAPE])
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
                    cls = lora_cls if bug and i == last and name == "o_proj" else \
                        GPTQLoraLinear
                    setattr(parent, name, lora(quant(n_in, n_out, group=group, cls=base), r=16,
                                               alpha=32.0, cls=cls))
    return with_own_weights(model).to(DEVICE), last


def timed(what, fn):
    start = time.perf_counter()
    result = fn()
    print(f"{what}: {time.perf_counter() - start:.1f} s")
    return result


def end_to_end(report):
    """The end-to-end result of a report (it must have run)."""
    assert report.modules[-1].path == "end_to_end", report.table()
    return report.modules[-1]


def forgets_norm_weight(self, x):
    """A fused RMSNorm as a patcher installs it (module.forward = MethodType(...)), without the
    weight."""
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)


class _CachedBt(torch.autograd.Function):
    """(x A^T) B^T with B^T taken from a cache; the gradients are right for the cached B."""

    @staticmethod
    def forward(ctx, h, b, bt):
        ctx.save_for_backward(h, bt)
        return h @ bt

    @staticmethod
    def backward(ctx, dy):
        h, bt = ctx.saved_tensors
        db = dy.reshape(-1, dy.shape[-1]).t() @ h.reshape(-1, h.shape[-1])
        return dy @ bt.t(), db.to(bt.dtype), None


class CachesLoraBTransposed(GPTQLoraLinear):
    """Keeps lora_B transposed from its first call (a layout a fused kernel wants): stale once
    the optimizer has stepped. Every single forward and backward is right."""

    def forward(self, x):
        a, b = self.lora_A["default"], self.lora_B["default"]
        if not hasattr(self, "_bt"):
            self._bt = b.weight.detach().t().contiguous()
        h = a(self.lora_dropout["default"](x.to(a.weight.dtype)))
        lora_out = _CachedBt.apply(h, b.weight, self._bt) * self.scaling["default"]
        return self.base_layer(x) + lora_out.to(x.dtype)


class _RaisesInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        raise RuntimeError("shapes do not match (planted)")


def backward_raises(self, x):
    """An MLP patched with a fused op whose backward raises."""
    h = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
    return _RaisesInBackward.apply(self.down_proj(h))


def main():
    dtypes = ["fp32", "bf16", "fp16"]
    model, last = build()
    report = timed(f"check_model, {SHAPE}, modules, 3 dtypes, fp32 model end to end",
                   lambda: gradscope.check_model(model, dtypes=dtypes))
    print(report.table())
    if DEVICE == "cpu":  # base's bits exactly (shown on the CPU; another device may differ)
        assert end_to_end(report).worst()[0] == 0.5, report.table()
    report = timed(f"check_model, {SHAPE}, layers on the model's activations, 3 dtypes",
                   lambda: gradscope.check_model(model, dtypes=dtypes, by="layer",
                                                 inputs="model", end_to_end=False))
    print(report.table())
    # The model as a user holds it in each dtype (adapters fp32, as peft keeps them), end to end.
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        report = timed(f"check_model, {SHAPE}, {name} model, end to end",
                       lambda: gradscope.check_model(build(dtype=dtype)[0], dtypes=[name],
                                                     end_to_end=True))
        print(f"  end to end: worst err/limit {end_to_end(report).worst()[0]:.3g}")
        # The unmodified stack computes what the baseline computes, bit for bit on the CPU.
        if DEVICE == "cpu":
            assert end_to_end(report).worst()[0] == 0.5, report.table()
    # Correct and rounding differently from the baseline (on the CPU in fp16, the other GEMM
    # layout rounds differently; bf16 and fp32 give the same bits): within the limit.
    report = timed(f"check_model, {SHAPE}, fp16 model over a transposed GEMM, end to end",
                   lambda: gradscope.check_model(build(dtype=torch.float16, base=TransposedGemm)[0],
                                                 dtypes=["fp16"], end_to_end=True))
    print(f"  end to end: worst err/limit {end_to_end(report).worst()[0]:.3g}")

    model, last = build(bug=True)
    dumps = tempfile.mkdtemp(prefix="gradscope-dumps-") if h5py else None
    report = timed(f"check_model, {SHAPE}, o_proj of layer {last} with the bug, 3 dtypes",
                   lambda: gradscope.check_model(model, dtypes=dtypes, dump_dir=dumps,
                                                 raise_on_failure=False))
    first = report.first_failure
    where = f"model.layers.{last}.self_attn.o_proj"
    assert first is not None and first.path == where, report.table()
    assert [m.path for m in report.modules if not m.passed] == [where, "end_to_end"], \
        report.table()
    failing = {k.name for c in first.cases for k in c.checks if not k.passed}
    assert failing == {"lora_B.default.weight.grad"}, failing
    failing = {k.name for c in end_to_end(report).cases for k in c.checks if not k.passed}
    assert failing == {f"{where}.lora_B.default.weight.grad"}, failing
    lines = report.divergence_lines()
    assert lines[0].startswith(f"first divergence: {where} (lora_w)"), lines
    assert any(line.startswith(f"  {where}.lora_B.default.weight.grad: ") for line in lines)
    print("\n".join(lines[:2]))
    if dumps:  # the end-to-end dump beside the modules' (docs/reports.md): gradscope show reads it
        case = end_to_end(report).cases[0]
        with h5py.File(os.path.join(dumps, "end_to_end.h5"), "r") as f:
            check = f[f"{case.id}/{where}.lora_B.default.weight.grad"]
            assert check.attrs["status"] == b"fail" and check["ref"].attrs["dtype"] == b"fp64"
            assert f[f"{case.id}/loss/prod"].shape == (1,), f[f"{case.id}/loss/prod"].shape
        out = subprocess.run([sys.executable, "-m", "gradscope", "show",
                              os.path.join(dumps, "end_to_end.h5")], capture_output=True,
                             text=True)
        assert out.returncode == 0 and "status=fail" in out.stdout, out.stdout + out.stderr
        shutil.rmtree(dumps)

    # Outside every LoRA module: a final norm that forgets its weight passes every module check
    # and fails end to end, its loss and the gradients upstream of it.
    model, last = build()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.model.norm.forward = types.MethodType(forgets_norm_weight, model.model.norm)
    report = timed(f"check_model, {SHAPE}, final norm without its weight",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], raise_on_failure=False))
    assert [m.path for m in report.modules if not m.passed] == ["end_to_end"], report.table()
    failing = {k.name for c in end_to_end(report).cases for k in c.checks if not k.passed}
    assert {"loss", "per_token_loss"} <= failing and len(failing) > 2, failing
    print(report.divergence_lines()[0])
    # Optimizer steps (end to end, teacher-forced): the unmodified model passes every step; an
    # o_proj that keeps lora_B from its first call passes every check of step 0, by layer on
    # the model's activations and end to end, and fails from the first step on.
    model, last = build()
    report = timed(f"check_model, {SHAPE}, 3 optimizer steps",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], end_to_end=True,
                                                 steps=3))
    names = [k.name for k in end_to_end(report).cases[0].checks]
    assert "step3.per_token_loss" in names and "step3.loss" in names, names
    model, last = build(bug=True, lora_cls=CachesLoraBTransposed)
    before = [p.detach().clone() for p in model.parameters()]
    report = timed(f"check_model, {SHAPE}, o_proj caching lora_B, by layer, 2 steps",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], by="layer",
                                                 inputs="model", end_to_end=True, steps=2,
                                                 raise_on_failure=False))
    assert [m.path for m in report.modules if not m.passed] == ["end_to_end"], report.table()
    failing = {k.name for c in end_to_end(report).cases for k in c.checks if not k.passed}
    assert failing and all(n.startswith(("step1.", "step2.")) for n in failing), failing
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # restored
    print(report.divergence_lines()[1][:160])
    # A GPTQ linear without LoRA is no module check's: end to end computes it plainly in base
    # and ref, so a bug in it (v1 zero points read as v2) fails end to end.
    model, last = build()
    own = model.model.layers[0].mlp.down_proj.base_layer
    bare = quant(own.in_features, own.out_features, group=own.group_size, cls=ReadsV1AsV2)
    bare.load_state_dict(own.state_dict())
    bare.to(own.qweight.device)  # the model's device (--device cuda)
    model.model.layers[0].mlp.down_proj = bare
    report = timed(f"check_model, {SHAPE}, a GPTQ linear without LoRA reading v1 as v2",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], raise_on_failure=False))
    assert [m.path for m in report.modules if not m.passed] == ["end_to_end"], report.table()
    try:
        gradscope.check_model(model, end_to_end=0)
        raise AssertionError("end_to_end=0 was taken")
    except gradscope.GradscopeInputError as e:
        assert "end_to_end=0" in str(e), e
    # A patched forward whose backward raises: a failing check, end to end as in the module.
    model, last = build()
    mlp = model.model.layers[0].mlp
    mlp.forward = types.MethodType(backward_raises, mlp)
    report = timed(f"check_model, {SHAPE}, an MLP whose backward raises",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], raise_on_failure=False))
    assert [m.path for m in report.modules if not m.passed] == ["model.layers.0.mlp",
                                                                "end_to_end"], report.table()
    [check] = end_to_end(report).cases[0].checks
    assert check.name == "error" and "shapes do not match" in check.message, check.message
    print(f"check_model on a {SHAPE} Llama ({DEVICE}): passes in fp32, bf16 and fp16, module by "
          f"module and end to end; the planted lora_B backward bug is the first divergence at "
          f"{where}; a final norm without its weight fails end to end only")


if __name__ == "__main__":
    main()
