"""The Python package: `python -m gradscope` with --import, and gradscope.check().

1. `python -m gradscope run lora_w.toml --impl plain_py --import plain_torch_impl` exits 0;
   the namespace whose forward leaves the adapter scaling out exits 1, with failing checks
   on the output and on lora_A.grad and lora_B.grad; an unknown module exits 2.
2. gradscope.check() returns the verdicts as objects, raises AssertionError naming each
   failing check and its replay line, and GradscopeInputError for what cannot be judged.
3. An operator whose Python backward raises fails its own case only: the next case calls the
   operator again and is judged on its own (autograd's engine leaves the Python exception in
   the thread's error indicator, which the package clears after each case).
4. Importing gradscope registers gradscope's own operators (torch.ops.gradscope.*).
5. A case whose checks ran and could not be judged (a layer whose attention is past the
   floor's model) raises GradscopeInputError, or with raise_on_invalid=False comes back with
   status "invalid" and its checks "out_of_range", each saying why; a case that is invalid
   before any check runs (an input beyond its dtype) raises either way. check_model's module
   table counts such a dtype as not judged, not as a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Tuple

import pytest
import torch

import gradscope
from gradscope import Outcome
from gradscope.model_check import ModelReport, ModuleResult
from gradscope.results import Case, Check, failure_lines


def run_cli(*args: str) -> Tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "gradscope", *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def replays(out: str) -> List[str]:
    return [line.split("replay: ", 1)[1] for line in out.splitlines() if "replay: " in line]


class _RaisingBackward(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x, lora_a):
        return x @ lora_a.t().to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        raise RuntimeError(f"backward of call {_RaisingBackward.calls} raises")


def _raising_lora_w(x, proj, bits, zero_format, lora_alpha, use_rslora, dropout_mask=None,
                    dropout_p=0.0):
    if x.dtype != torch.float16:
        raise NotImplementedError("fp16 only")
    _RaisingBackward.calls += 1
    y = _RaisingBackward.apply(x, proj[4])
    return y.new_zeros(*x.shape[:-1], proj[5].shape[0]) + y.sum()


_raising = torch.library.Library("raises_in_backward", "DEF")
gradscope.define_ops(_raising, ["lora_w"])
_raising.impl("lora_w", _raising_lora_w, "CompositeImplicitAutograd")


@pytest.fixture(scope="module")
def variants(cases_dir: str) -> str:
    return os.path.join(cases_dir, "smoke", "lora_w_variants.toml")


def test_the_command_line_with_an_imported_implementation(lora_w, variants):
    code, out = run_cli("run", lora_w, variants, "--quiet", "--impl", "plain_py",
                        "--import", "plain_torch_impl")
    assert code == 0, out
    assert "56 passed, 0 failed, 16 unsupported by plain_py" in out, out
    assert "NotImplementedError: plain_py: 3-bit words are not unpacked here" in out, out


def test_a_failure_replays_as_printed(lora_w):
    code, out = run_cli("run", lora_w, "--filter", "*fp32*r8*", "--impl", "plain_py_unscaled",
                        "--import", "plain_torch_impl")
    assert code == 1, out
    for tensor in ("output", "lora_A.grad", "lora_B.grad"):
        assert f"o_proj/{tensor}: |prod - ref|" in out, (tensor, out)
    assert "--impl 'plain_py_unscaled'" in out, out
    # The replay line is a command that runs: the package's entry and the module to import.
    replay = replays(out)
    assert replay and all(r.startswith("python3 -m gradscope run ") for r in replay), out
    assert all(r.endswith("--import 'plain_torch_impl'") for r in replay), replay
    again = subprocess.run(replay[0], shell=True, capture_output=True, text=True)
    assert again.returncode == 1 and "1 failed" in again.stdout, (replay[0], again)


def test_a_sampled_case_replays_its_draw():
    # A sampled case has no file unless --cases-out is given: its replay line draws it first.
    code, out = run_cli("sample", "--count", "4", "--seed", "3", "--kinds", "lora_w,mlp")
    assert code == 0 and "1 out of range or refused" in out, out  # a draw, not a failure
    replay = replays(out)
    assert len(replay) == 1 and "--draw-only" in replay[0], out
    for _ in range(2):  # each run draws into a fresh folder
        again = subprocess.run(replay[0], shell=True, capture_output=True, text=True)
        assert again.returncode == 2 and "1 invalid" in again.stdout, (replay[0], again)


def test_a_module_that_does_not_import(lora_w):
    code, out = run_cli("run", lora_w, "--impl", "plain_py", "--import", "no_such_module_here")
    assert code == 2, out
    assert "--import no_such_module_here: ModuleNotFoundError" in out, out


def test_check_returns_typed_verdicts(lora_w):
    cases = gradscope.check(lora_w, impl="plain_py", imports=["plain_torch_impl"],
                            filter="*bf16*r16*")
    assert len(cases) == 4 and all(c.passed and c.outcome is Outcome.PASS for c in cases), cases
    assert all(k.passed and k.limit is not None for c in cases for k in c.checks), cases
    assert {k.path.split("/")[-1] for k in cases[0].checks} == {
        "output", "input.grad", "lora_A.grad", "lora_B.grad"}, cases[0].checks


def test_check_raises_each_failing_check(lora_w):
    with pytest.raises(AssertionError) as e:
        gradscope.check(lora_w, impl="plain_py_unscaled", filter="*fp16*r8*p0.1.bias*")
    text = str(e.value)
    assert "1 of 1 gradscope cases failed (implementation plain_py_unscaled)" in text, text
    assert "o_proj/lora_B.grad: |prod - ref|" in text and "replay: " in text, text
    failed = gradscope.check(lora_w, impl="plain_py_unscaled", filter="*fp16*r8*p0.1.bias*",
                             raise_on_failure=False)
    assert [c.status for c in failed] == ["fail"], failed


def test_a_namespace_without_the_operators(lora_w):
    with pytest.raises(gradscope.GradscopeInputError) as e:
        gradscope.check(lora_w, impl="nobody")
    assert "has no operator nobody::lora_w" in str(e.value), e.value
    assert "nothing was loaded to register 'nobody'" in str(e.value), e.value
    assert "--import MODULE" in str(e.value), e.value
    with pytest.raises(gradscope.GradscopeInputError,
                       match="loaded: --import plain_torch_impl; none of them registers"):
        gradscope.check(lora_w, impl="plain_pi", imports=["plain_torch_impl"])


def test_several_globs_select_in_run_order(lora_w):
    globs = ["*bf16*r16*", "*fp32*r8*"]
    ids = gradscope.list_cases(lora_w, filter=globs)
    assert len(ids) == 8 and all(".bf16." in i or ".fp32." in i for i in ids), ids
    judged = gradscope.check(lora_w, impl="plain_py", imports=["plain_torch_impl"], filter=globs)
    assert [c.id for c in judged] == ids, (judged, ids)
    with pytest.raises(gradscope.GradscopeInputError,
                       match="no case id matches --filter 'nothing\\*' or 'none\\*'"):
        gradscope.list_cases(lora_w, filter=["nothing*", "none*"])


def test_a_raising_backward_fails_its_own_case_only(lora_w):
    cases = gradscope.check(lora_w, impl="raises_in_backward", raise_on_failure=False)
    fp16 = [c for c in cases if ".fp16." in c.id]
    assert fp16 and _RaisingBackward.calls == len(fp16), (_RaisingBackward.calls, len(fp16))
    for n, c in enumerate(fp16, 1):
        assert c.status == "fail" and f"backward of call {n} raises" in c.checks[0].message, c
    assert all(c.status == "unsupported" for c in cases if c not in fp16), cases


@pytest.mark.parametrize("raise_on_invalid", [True, False])
def test_a_check_that_judged_nothing_raises(variants, raise_on_invalid):
    # plain_py declines 3-bit weights: a check of only 3-bit cases judged nothing and raises,
    # unless told that is acceptable (a run that judged nothing is not a case not judged).
    with pytest.raises(gradscope.GradscopeInputError, match="no case was judged: 16 unsupported"):
        gradscope.check(variants, impl="plain_py", filter="*.b3g*",
                        raise_on_invalid=raise_on_invalid)
    declined = gradscope.check(variants, impl="plain_py", filter="*.b3g*", allow_unsupported=True)
    assert len(declined) == 16 and all(c.status == "unsupported" for c in declined), declined


def test_cases_not_judged(cases_dir, data_dir, tmp_path):
    ill, dy = os.path.join(data_dir, "attention-past-the-model.toml"), str(tmp_path / "dy.toml")
    with open(dy, "w") as f:
        f.write('kind = "lora_w"\ndtype = "fp16"\nloss_scale = 1000000.0\n')
    with pytest.raises(gradscope.GradscopeInputError, match="attention is past the floor's model"):
        gradscope.check(ill)
    [case] = gradscope.check(ill, raise_on_invalid=False)
    assert case.status == "invalid" and case.outcome is Outcome.INVALID, case
    assert len(case.checks) == 32 and all(k.status == "out_of_range" for k in case.checks)
    assert "cannot be judged: layer 0's attention is past" in case.checks[0].message, case
    with pytest.raises(gradscope.GradscopeInputError, match="input dy reaches"):
        gradscope.check(dy, raise_on_invalid=False)
    # A failing case beside one not judged (the run exits 1): the failure is raised, and names
    # the case not judged; without raising, both come back.
    both = dict(cases=[os.path.join(cases_dir, "smoke", "lora_w.toml"), ill],
                impl="plain_py_unscaled", imports=["plain_torch_impl"],
                filter=["lora_w.fp32.*r8*", "layer.*"])
    with pytest.raises(AssertionError) as e:
        gradscope.check(**both)
    assert "1 more could not be judged:" in str(e.value), e.value
    assert "s914697: not judged: " in str(e.value), e.value
    returned = gradscope.check(**both, raise_on_failure=False, raise_on_invalid=False)
    assert sorted({c.status for c in returned}) == ["fail", "invalid"], returned
    report = ModelReport([ModuleResult("model.layers.0", "layer", [case])])
    table = report.table()
    assert report.passed and report.first_failure is None, table  # no failure ...
    assert [m.path for m in report.not_judged] == ["model.layers.0"], table  # ... no verdict
    assert "invalid" in table and "(bf16 not judged)" in table, table


def test_failure_lines():
    lines = failure_lines(Case(id="c", kind="k", status="fail", replay="r", checks=[
        Check(path="a", status="fail", message="bad", max_abs=1.0, limit=0.5),
        Check(path="b", status="out_of_range", message="why", max_abs=1.0, limit=0.5)]))
    assert lines == ["c:", "  bad", "  (1 more checks not judged: out of range, or past the "
                     "floor's model)", "  replay: r"], lines


def test_the_package_registers_its_operators():
    assert hasattr(torch.ops.gradscope, "lora_w")
    assert gradscope.OP_SCHEMA_VERSION == 4
    assert gradscope.OP_SCHEMAS["lora_w"].startswith("lora_w(Tensor x, Tensor[] proj")
