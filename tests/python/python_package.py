"""The Python package: `python -m gradscope` with --import, and gradscope.check().

Usage: python_package.py CASES_DIR   (with gradscope and plain_torch_impl on PYTHONPATH)
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
import os
import subprocess
import sys
import tempfile

import torch

import gradscope


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "gradscope", *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


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


def main(cases_dir):
    lora_w = os.path.join(cases_dir, "smoke", "lora_w.toml")
    variants = os.path.join(cases_dir, "smoke", "lora_w_variants.toml")

    code, out = run_cli("run", lora_w, variants, "--quiet", "--impl", "plain_py",
                        "--import", "plain_torch_impl")
    assert code == 0, out
    assert "56 passed, 0 failed, 16 unsupported by plain_py" in out, out
    assert "NotImplementedError: plain_py: 3-bit words are not unpacked here" in out, out

    code, out = run_cli("run", lora_w, "--filter", "*fp32*r8*", "--impl", "plain_py_unscaled",
                        "--import", "plain_torch_impl")
    assert code == 1, out
    for tensor in ("output", "lora_A.grad", "lora_B.grad"):
        assert f"o_proj/{tensor}: |prod - ref|" in out, (tensor, out)
    assert "--impl 'plain_py_unscaled'" in out, out
    # The replay line is a command that runs: the package's entry and the module to import.
    replay = [line.split("replay: ", 1)[1] for line in out.splitlines() if "replay: " in line]
    assert replay and all(r.startswith("python3 -m gradscope run ") for r in replay), out
    assert all(r.endswith("--import 'plain_torch_impl'") for r in replay), replay
    again = subprocess.run(replay[0], shell=True, capture_output=True, text=True)
    assert again.returncode == 1 and "1 failed" in again.stdout, (replay[0], again)

    # A sampled case has no file unless --cases-out is given: its replay line draws it first.
    code, out = run_cli("sample", "--count", "4", "--seed", "3", "--kinds", "lora_w,mlp")
    assert code == 0 and "1 out of range or refused" in out, out  # a draw, not a failure
    replay = [line.split("replay: ", 1)[1] for line in out.splitlines() if "replay: " in line]
    assert len(replay) == 1 and "--draw-only" in replay[0], out
    for _ in range(2):  # each run draws into a fresh folder
        again = subprocess.run(replay[0], shell=True, capture_output=True, text=True)
        assert again.returncode == 2 and "1 invalid" in again.stdout, (replay[0], again)

    code, out = run_cli("run", lora_w, "--impl", "plain_py", "--import", "no_such_module_here")
    assert code == 2, out
    assert "--import no_such_module_here: ModuleNotFoundError" in out, out

    cases = gradscope.check(lora_w, impl="plain_py", imports=["plain_torch_impl"],
                            filter="*bf16*r16*")
    assert len(cases) == 4 and all(c.passed for c in cases), cases
    assert all(k.passed and k.limit is not None for c in cases for k in c.checks), cases
    assert {k.path.split("/")[-1] for k in cases[0].checks} == {
        "output", "input.grad", "lora_A.grad", "lora_B.grad"}, cases[0].checks

    try:
        gradscope.check(lora_w, impl="plain_py_unscaled", filter="*fp16*r8*p0.1.bias*")
        raise RuntimeError("a failing implementation passed check()")
    except AssertionError as e:
        text = str(e)
        assert "1 of 1 gradscope cases failed (implementation plain_py_unscaled)" in text, text
        assert "o_proj/lora_B.grad: |prod - ref|" in text and "replay: " in text, text

    failed = gradscope.check(lora_w, impl="plain_py_unscaled", filter="*fp16*r8*p0.1.bias*",
                             raise_on_failure=False)
    assert [c.status for c in failed] == ["fail"], failed

    try:
        gradscope.check(lora_w, impl="nobody")
        raise RuntimeError("an unknown namespace was accepted")
    except gradscope.GradscopeInputError as e:
        assert "has no operator nobody::lora_w" in str(e), e
        assert "nothing was loaded to register 'nobody'" in str(e), e
        assert "--import MODULE" in str(e), e
    try:
        gradscope.check(lora_w, impl="plain_pi", imports=["plain_torch_impl"])
        raise RuntimeError("a misspelt namespace was accepted")
    except gradscope.GradscopeInputError as e:
        assert "loaded: --import plain_torch_impl; none of them registers" in str(e), e

    # Several globs: a case is selected when one matches; the ids come back in run order.
    globs = ["*bf16*r16*", "*fp32*r8*"]
    ids = gradscope.list_cases(lora_w, filter=globs)
    assert len(ids) == 8 and all(".bf16." in i or ".fp32." in i for i in ids), ids
    judged = gradscope.check(lora_w, impl="plain_py", imports=["plain_torch_impl"], filter=globs)
    assert [c.id for c in judged] == ids, (judged, ids)
    try:
        gradscope.list_cases(lora_w, filter=["nothing*", "none*"])
        raise RuntimeError("a filter matching nothing was accepted")
    except gradscope.GradscopeInputError as e:
        assert "no case id matches --filter 'nothing*' or 'none*'" in str(e), e

    cases = gradscope.check(lora_w, impl="raises_in_backward", raise_on_failure=False)
    fp16 = [c for c in cases if ".fp16." in c.id]
    assert fp16 and _RaisingBackward.calls == len(fp16), (_RaisingBackward.calls, len(fp16))
    for n, c in enumerate(fp16, 1):
        assert c.status == "fail" and f"backward of call {n} raises" in c.checks[0].message, c
    assert all(c.status == "unsupported" for c in cases if c not in fp16), cases

    # plain_py declines 3-bit weights: a check of only 3-bit cases judged nothing and raises,
    # unless told that is acceptable.
    try:
        gradscope.check(variants, impl="plain_py", filter="*.b3g*")
        raise RuntimeError("a check that judged nothing returned")
    except gradscope.GradscopeInputError as e:
        assert "no case was judged: 16 unsupported" in str(e), e
    try:  # a run that judged nothing is not a case not judged
        gradscope.check(variants, impl="plain_py", filter="*.b3g*", raise_on_invalid=False)
        raise RuntimeError("a check that judged nothing returned with raise_on_invalid=False")
    except gradscope.GradscopeInputError as e:
        assert "no case was judged: 16 unsupported" in str(e), e
    declined = gradscope.check(variants, impl="plain_py", filter="*.b3g*", allow_unsupported=True)
    assert len(declined) == 16 and all(c.status == "unsupported" for c in declined), declined

    _not_judged()

    assert hasattr(torch.ops.gradscope, "lora_w")
    assert gradscope.OP_SCHEMA_VERSION == 3
    assert gradscope.OP_SCHEMAS["lora_w"].startswith("lora_w(Tensor x, Tensor[] proj")
    print("python package: CLI, --import, check(), a raising backward and the operator "
          "registration as expected")


_ILL_LAYER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                          "attention-past-the-model.toml")


def _not_judged():
    from gradscope import api
    from gradscope.model_check import ModelReport, ModuleResult

    with tempfile.TemporaryDirectory() as d:
        ill, dy = _ILL_LAYER, os.path.join(d, "dy.toml")
        with open(dy, "w") as f:
            f.write('kind = "lora_w"\ndtype = "fp16"\nloss_scale = 1000000.0\n')
        try:
            gradscope.check(ill)
            raise RuntimeError("a case not judged returned")
        except gradscope.GradscopeInputError as e:
            assert "attention is past the floor's model" in str(e), e
        [case] = gradscope.check(ill, raise_on_invalid=False)
        assert case.status == "invalid", case
        assert len(case.checks) == 32 and all(k.status == "out_of_range" for k in case.checks)
        assert "cannot be judged: layer 0's attention is past" in case.checks[0].message, case
        try:
            gradscope.check(dy, raise_on_invalid=False)
            raise RuntimeError("an input beyond its dtype returned")
        except gradscope.GradscopeInputError as e:
            assert "input dy reaches" in str(e), e
        # A failing case beside one not judged (the run exits 1): the failure is raised, and
        # names the case not judged; without raising, both come back.
        both = dict(cases=[os.path.join(os.path.dirname(ill), "..", "..", "cases", "smoke",
                                        "lora_w.toml"), ill],
                    impl="plain_py_unscaled", imports=["plain_torch_impl"],
                    filter=["lora_w.fp32.*r8*", "layer.*"])
        try:
            gradscope.check(**both)
            raise RuntimeError("a failure beside a case not judged returned")
        except AssertionError as e:
            assert "1 more could not be judged:" in str(e), e
            assert "s914697: not judged: " in str(e), e
        returned = gradscope.check(**both, raise_on_failure=False, raise_on_invalid=False)
        assert sorted({c.status for c in returned}) == ["fail", "invalid"], returned
        lines = api.failure_lines(api.Case(id="c", kind="k", status="fail", replay="r", checks=[
            api.Check(path="a", status="fail", message="bad", max_abs=1.0, limit=0.5),
            api.Check(path="b", status="out_of_range", message="why", max_abs=1.0, limit=0.5)]))
        assert lines == ["c:", "  bad", "  (1 more checks not judged: out of range, or past the "
                         "floor's model)", "  replay: r"], lines
    report = ModelReport([ModuleResult("model.layers.0", "layer", [case])])
    table = report.table()
    assert report.passed and report.first_failure is None, table  # no failure ...
    assert [m.path for m in report.not_judged] == ["model.layers.0"], table  # ... no verdict
    assert "invalid" in table and "(bf16 not judged)" in table, table


if __name__ == "__main__":
    main(sys.argv[1])
