"""check_model on a Llama as users build it (docs/python.md, "A model, module by module").

The model: lora_models.llama_r16 of --shape small (CTest python_check_model_llama: 4 layers,
hidden 128, 4 query heads over 2 key/value heads, MLP 352, vocabulary 64) or 7b (one layer of
Llama-2-7B's shape: hidden 4096, 32 heads, MLP 11008), on --device. LoRA r16 (alpha 32) on all
seven projections over 4-bit GPTQ bases (gradscope.QuantLinear, group 32 / 128), weights of
their own (lora_models.with_own_weights).
1. The unmodified transformers + peft model passes check_model in fp32, bf16 and fp16, module by
   module and, on the model's own activations, layer by layer.
2. A copy whose o_proj in the last layer computes its LoRA path through an autograd function
   that leaves the scaling out of lora_B's gradient fails, and the first divergence names that
   layer, o_proj and lora_B's gradient, with every other module passing; end to end, only that
   gradient fails; the end-to-end dump holds it and `gradscope show` reads it.
3. End to end (the loss and every LoRA gradient against the model in fp64): the fp32 model and
   the same model held in bf16 and in fp16 pass, as does an fp16 model whose bases round
   differently (another GEMM layout); a final norm patched to forget its weight (an
   instance-level forward, as model patchers install fused kernels) passes every module check
   and fails end to end, as does a GPTQ linear without LoRA that reads v1 zero points as v2;
   an MLP whose backward raises fails by module and end to end; end_to_end=0 is refused. On the
   CPU the unmodified stack's end-to-end err/limit is 0.5 exactly: it computes the baseline's
   bits.
4. Optimizer steps end to end: three pass; an o_proj that keeps lora_B transposed from its first
   call passes step 0 (layer by layer and end to end) and fails from step 1 on; the model's
   adapters are restored after.
Each check_model call prints its wall time (pytest -s shows it).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from typing import Callable, List, Optional, Tuple

import pytest
import torch
from lora_models import LLAMA_SHAPES, ReadsV1AsV2, TransposedGemm, llama_r16, quant
from peft.tuners.lora.gptq import GPTQLoraLinear
from transformers import LlamaForCausalLM

import gradscope
from gradscope.model_check import ModelReport, ModuleResult

try:  # in CTest's environment; a GPU machine may lack it (the dump is then not written)
    import h5py
except ImportError:
    h5py = None

DTYPES = ["fp32", "bf16", "fp16"]


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


def forgets_norm_weight(self, x):
    """A fused RMSNorm as a patcher installs it (module.forward = MethodType(...)), without the
    weight."""
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)


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


def timed(what: str, fn: Callable[[], ModelReport]) -> ModelReport:
    start = time.perf_counter()
    result = fn()
    print(f"{what}: {time.perf_counter() - start:.1f} s")
    return result


def end_to_end(report: ModelReport) -> ModuleResult:
    """The end-to-end result of a report (it must have run)."""
    assert report.modules[-1].path == "end_to_end", report.table()
    return report.modules[-1]


def failing_modules(report: ModelReport) -> list[str]:
    return [m.path for m in report.modules if not m.passed]


def failing_checks(module: ModuleResult) -> set[str]:
    return {k.name for c in module.cases for k in c.checks if not k.passed}


Build = Callable[..., LlamaForCausalLM]
StaleRun = Tuple[ModelReport, LlamaForCausalLM, List[torch.Tensor]]


@pytest.fixture(scope="module")
def build(shape: str, device: str) -> Build:
    """llama_r16 of --shape on --device."""
    def build(**kw) -> LlamaForCausalLM:
        return llama_r16(shape, **kw).to(device)
    return build


@pytest.fixture(scope="module")
def last(shape: str) -> int:
    """The last layer, whose o_proj has the planted bugs."""
    return LLAMA_SHAPES[shape]["num_hidden_layers"] - 1


@pytest.fixture(scope="module")
def where(last: int) -> str:
    return f"model.layers.{last}.self_attn.o_proj"


@pytest.fixture(scope="module")
def model(build: Build) -> LlamaForCausalLM:
    return build()


# 1. The unmodified model.

def test_module_by_module_and_end_to_end_pass(model: LlamaForCausalLM, shape: str,
                                              device: str) -> None:
    report = timed(f"check_model, {shape}, modules, 3 dtypes, fp32 model end to end",
                   lambda: gradscope.check_model(model, dtypes=DTYPES))
    print(report.table())
    assert report.passed, report.table()  # (check_model raises first where a module fails)
    if device == "cpu":  # base's bits exactly (shown on the CPU; another device may differ)
        assert end_to_end(report).worst()[0] == 0.5, report.table()


def test_layer_by_layer_on_the_models_activations_passes(model: LlamaForCausalLM,
                                                         shape: str) -> None:
    report = timed(f"check_model, {shape}, layers on the model's activations, 3 dtypes",
                   lambda: gradscope.check_model(model, dtypes=DTYPES, by="layer",
                                                 inputs="model", end_to_end=False))
    print(report.table())
    assert report.passed, report.table()


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_the_model_held_in_low_precision_passes_end_to_end(build: Build, shape: str,
                                                           device: str, name: str,
                                                           dtype: torch.dtype) -> None:
    """The model as a user holds it in each dtype (adapters fp32, as peft keeps them)."""
    report = timed(f"check_model, {shape}, {name} model, end to end",
                   lambda: gradscope.check_model(build(dtype=dtype), dtypes=[name],
                                                 end_to_end=True))
    print(f"  end to end: worst err/limit {end_to_end(report).worst()[0]:.3g}")
    # The unmodified stack computes what the baseline computes, bit for bit on the CPU.
    if device == "cpu":
        assert end_to_end(report).worst()[0] == 0.5, report.table()


def test_bases_of_another_gemm_layout_pass_end_to_end(build: Build, shape: str) -> None:
    """Correct and rounding differently from the baseline (on the CPU in fp16, the other GEMM
    layout rounds differently; bf16 and fp32 give the same bits): within the limit."""
    report = timed(f"check_model, {shape}, fp16 model over a transposed GEMM, end to end",
                   lambda: gradscope.check_model(build(dtype=torch.float16, base=TransposedGemm),
                                                 dtypes=["fp16"], end_to_end=True))
    print(f"  end to end: worst err/limit {end_to_end(report).worst()[0]:.3g}")
    assert report.passed, report.table()


def test_end_to_end_0_is_refused(model: LlamaForCausalLM) -> None:
    with pytest.raises(gradscope.GradscopeInputError, match="end_to_end=0"):
        gradscope.check_model(model, end_to_end=0)


# 2. The planted lora_B backward bug in the last o_proj.

@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Optional[str]:
    return str(tmp_path_factory.mktemp("gradscope-dumps-")) if h5py else None


@pytest.fixture(scope="module")
def bug_report(build: Build, shape: str, last: int, dumps: Optional[str]) -> ModelReport:
    model = build(last_o_proj=LoraBGradUnscaled)
    return timed(f"check_model, {shape}, o_proj of layer {last} with the bug, 3 dtypes",
                 lambda: gradscope.check_model(model, dtypes=DTYPES, dump_dir=dumps,
                                               raise_on_failure=False))


def test_the_bug_is_the_first_divergence_and_the_only_failing_module(bug_report: ModelReport,
                                                                     where: str) -> None:
    first = bug_report.first_failure
    assert first is not None and first.path == where, bug_report.table()
    assert failing_modules(bug_report) == [where, "end_to_end"], bug_report.table()


def test_the_bug_fails_lora_b_grad_only(bug_report: ModelReport) -> None:
    first = bug_report.first_failure
    assert first is not None, bug_report.table()
    failing = failing_checks(first)
    assert failing == {"lora_B.default.weight.grad"}, failing


def test_the_bug_fails_that_gradient_only_end_to_end(bug_report: ModelReport,
                                                     where: str) -> None:
    failing = failing_checks(end_to_end(bug_report))
    assert failing == {f"{where}.lora_B.default.weight.grad"}, failing


def test_the_bug_is_named_in_the_divergence_lines(bug_report: ModelReport, where: str) -> None:
    lines = bug_report.divergence_lines()
    assert lines[0].startswith(f"first divergence: {where} (lora_w)"), lines
    assert any(line.startswith(f"  {where}.lora_B.default.weight.grad: ") for line in lines)
    print("\n".join(lines[:2]))


def test_the_end_to_end_dump_holds_the_failing_gradient(bug_report: ModelReport, where: str,
                                                        dumps: Optional[str]) -> None:
    """The end-to-end dump beside the modules' (docs/reports.md): gradscope show reads it."""
    if dumps is None:
        pytest.skip("no h5py: the dump is not written")
    case = end_to_end(bug_report).cases[0]
    with h5py.File(os.path.join(dumps, "end_to_end.h5"), "r") as f:
        check = f[f"{case.id}/{where}.lora_B.default.weight.grad"]
        assert check.attrs["status"] == b"fail" and check["ref"].attrs["dtype"] == b"fp64"
        assert f[f"{case.id}/loss/prod"].shape == (1,), f[f"{case.id}/loss/prod"].shape
    out = subprocess.run([sys.executable, "-m", "gradscope", "show",
                          os.path.join(dumps, "end_to_end.h5")], capture_output=True, text=True)
    assert out.returncode == 0 and "status=fail" in out.stdout, out.stdout + out.stderr


# 3. Bugs outside every LoRA module, and a model that raises.

def test_a_final_norm_without_its_weight_fails_end_to_end_only(build: Build, shape: str) -> None:
    """It passes every module check and fails end to end, its loss and the gradients upstream
    of it."""
    model = build()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.model.norm.forward = types.MethodType(forgets_norm_weight, model.model.norm)
    report = timed(f"check_model, {shape}, final norm without its weight",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], raise_on_failure=False))
    assert failing_modules(report) == ["end_to_end"], report.table()
    failing = failing_checks(end_to_end(report))
    assert {"loss", "per_token_loss"} <= failing and len(failing) > 2, failing
    print(report.divergence_lines()[0])


def test_a_gptq_linear_without_lora_reading_v1_as_v2_fails_end_to_end(build: Build,
                                                                       shape: str) -> None:
    """No module check's: end to end computes it plainly in base and ref."""
    model = build()
    own = model.model.layers[0].mlp.down_proj.base_layer
    bare = quant(own.in_features, own.out_features, group=own.group_size, cls=ReadsV1AsV2)
    bare.load_state_dict(own.state_dict())
    bare.to(own.qweight.device)  # the model's device (--device cuda)
    model.model.layers[0].mlp.down_proj = bare
    report = timed(f"check_model, {shape}, a GPTQ linear without LoRA reading v1 as v2",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], raise_on_failure=False))
    assert failing_modules(report) == ["end_to_end"], report.table()


def test_a_backward_that_raises_fails_by_module_and_end_to_end(build: Build, shape: str) -> None:
    model = build()
    mlp = model.model.layers[0].mlp
    mlp.forward = types.MethodType(backward_raises, mlp)
    report = timed(f"check_model, {shape}, an MLP whose backward raises",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], raise_on_failure=False))
    assert failing_modules(report) == ["model.layers.0.mlp", "end_to_end"], report.table()
    [check] = end_to_end(report).cases[0].checks
    assert check.name == "error" and "shapes do not match" in check.message, check.message


# 4. Optimizer steps (end to end, teacher-forced).

def test_three_optimizer_steps_pass(build: Build, shape: str) -> None:
    report = timed(f"check_model, {shape}, 3 optimizer steps",
                   lambda: gradscope.check_model(build(), dtypes=["fp32"], end_to_end=True,
                                                 steps=3))
    names = [k.name for k in end_to_end(report).cases[0].checks]
    assert "step3.per_token_loss" in names and "step3.loss" in names, names


@pytest.fixture(scope="module")
def stale_lora_b(build: Build, shape: str) -> StaleRun:
    """An o_proj that keeps lora_B from its first call, by layer on the model's activations
    and end to end, 2 steps: the report, the model and its parameters before."""
    model = build(last_o_proj=CachesLoraBTransposed)
    before = [p.detach().clone() for p in model.parameters()]
    report = timed(f"check_model, {shape}, o_proj caching lora_B, by layer, 2 steps",
                   lambda: gradscope.check_model(model, dtypes=["fp32"], by="layer",
                                                 inputs="model", end_to_end=True, steps=2,
                                                 raise_on_failure=False))
    return report, model, before


def test_a_stale_lora_b_passes_every_layer_and_fails_end_to_end(stale_lora_b: StaleRun) -> None:
    report, _, _ = stale_lora_b
    assert failing_modules(report) == ["end_to_end"], report.table()


def test_a_stale_lora_b_fails_from_step_1_on(stale_lora_b: StaleRun) -> None:
    report, _, _ = stale_lora_b
    failing = failing_checks(end_to_end(report))
    assert failing and all(n.startswith(("step1.", "step2.")) for n in failing), failing
    print(report.divergence_lines()[1][:160])


def test_the_models_adapters_are_restored_after_the_steps(stale_lora_b: StaleRun) -> None:
    _, model, before = stale_lora_b
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
