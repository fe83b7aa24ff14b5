"""`python -m gradscope model MODULE:FACTORY` as a user runs it (docs/python.md, "check_model").

1. A two-layer Llama with LoRA on all seven projections: exit 0, the table on the console,
   --json with every module passing and --html a heatmap with no failing cell.
2. The same with a bug in layer 1's down_proj base: exit 1, "first divergence:
   model.layers.1.mlp" on the console and in the JSON, a FAIL cell in the heatmap; with
   --by layer, model.layers.1 (the layer judged whole).
   --junit has a test per module, dtype and tensor, the failures those of layer 1's mlp;
   --dump-dir an HDF5 dump per module. The trained model passes end to end (the loss and 28
   LoRA gradients); peft's zero lora_B gets a note instead, and a refusal under --end-to-end on.
3. Bad input, exit 2 and nothing written: no such factory, a factory that is not a model or
   that raises, an output folder that does not exist, an unknown dtype.
4. A module whose checks could not be judged (an attention past the floor's model) and none
   failing: exit 2, the table's verdict "invalid", the JSON's not_judged and check statuses,
   JUnit skips (no failures), "not judged" cells in the heatmap.
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import h5py
import pytest

from gradscope import cli, model_command
from gradscope.model_check import ModelReport, ModuleResult
from gradscope.results import Case, Check


def run(*args):
    r = subprocess.run([sys.executable, "-m", "gradscope", "model", *args], capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


def run_in_process(*args):
    """The same command in this process (no interpreter to start: the command's own output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = cli.main(["model", *args])
    return rc, out.getvalue()


def test_a_model_that_passes(tmp_path):
    d = str(tmp_path)
    j, h = os.path.join(d, "model.json"), os.path.join(d, "model.html")
    rc, out = run("lora_models:tiny_llama", "--dtype", "fp32", "--json", j, "--html", h)
    assert rc == 0, out
    assert "model.layers.1.mlp" in out and "FAIL" not in out, out
    data = json.load(open(j))
    assert data["passed"] and data["first_divergence"] is None, data
    assert [m["path"] for m in data["modules"]][:3] == [
        "model.layers.0.self_attn", "model.layers.0.self_attn.o_proj", "model.layers.0.mlp"]
    ratios = [k["error_to_limit"] for m in data["modules"] for c in m["cases"]
              for k in c["checks"]]
    assert ratios and all(0 <= r < 1 for r in ratios), ratios
    page = open(h).read()
    assert "all 6 modules pass" in page and ">FAIL<" not in page, page[:500]


def test_a_bug_by_module_by_layer_end_to_end_in_junit_and_dumps(tmp_path):
    d = str(tmp_path)
    j, h = os.path.join(d, "model.json"), os.path.join(d, "model.html")
    rc, out = run("lora_models:tiny_llama_down_proj_bug", "--dtype", "fp32", "--json", j,
                  "--html", h)
    assert rc == 1, out
    assert "first divergence: model.layers.1.mlp (mlp); 1 of 6 modules failed" in out, out
    assert "model.layers.1.mlp.output" in out, out
    data = json.load(open(j))
    assert not data["passed"] and data["first_divergence"] == "model.layers.1.mlp", data
    page = open(h).read()
    assert "first divergence: model.layers.1.mlp" in page and ">FAIL<" in page
    # ... and layer by layer, each decoder layer whole.
    rc, out = run_in_process("lora_models:tiny_llama_down_proj_bug", "--by", "layer",
                             "--json", j)
    assert rc == 1 and "first divergence: model.layers.1 (layer); 1 of 2" in out, out
    data = json.load(open(j))
    assert [(m["path"], m["kind"], m["passed"]) for m in data["modules"]] == [
        ("model.layers.0", "layer", True), ("model.layers.1", "layer", False)], data
    rc, out = run_in_process("lora_models:tiny_llama_trained", "--by", "layer", "--inputs",
                             "model", "--json", j)
    assert rc == 0 and "model.layers.1  layer   pass" in out, out
    # End to end where the model allows it: trained adapters, no dropout.
    assert "end_to_end      model   pass" in out, out
    data = json.load(open(j))
    names = [k["name"] for k in data["modules"][-1]["cases"][0]["checks"]]
    assert names[:3] == ["per_token_loss", "loss",
                         "model.layers.0.self_attn.q_proj.lora_A.default.weight.grad"], names
    assert len(names) == 2 + 2 * 7 * 2 and data["note"] is None, (names, data["note"])
    # ... and a note where it does not: peft's zero lora_B.
    rc, out = run_in_process("lora_models:tiny_llama", "--dtype", "fp32")
    assert rc == 0 and "end to end: not run: model.layers.0.self_attn.q_proj.lora_B" in out
    # JUnit: a test per module, dtype and tensor; HDF5: a dump per module.
    x, dumps = os.path.join(d, "model.xml"), os.path.join(d, "dumps")
    os.mkdir(dumps)
    rc, out = run_in_process("lora_models:tiny_llama_down_proj_bug", "--junit", x,
                             "--dump-dir", dumps)
    assert rc == 1, out
    suite = ET.parse(x).getroot().find("testsuite")
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert suite.get("tests") == str(len(cases)) == "44", (suite.attrib, len(cases))
    assert suite.get("failures") == str(len(failed)) and failed, suite.attrib
    assert {c.get("classname") for c in failed} == {"model.layers.1.mlp"}, failed
    assert any(c.get("name") == "bf16.output" for c in failed), [c.get("name") for c in failed]
    assert "replay: gradscope.check_module(<LlamaMLP>" in failed[0].find("failure").text
    assert sorted(os.listdir(dumps))[:2] == ["model.layers.0.mlp.h5",
                                             "model.layers.0.self_attn.h5"], os.listdir(dumps)
    # A dtype every module declines: skipped in JUnit, not a failure (exit 0).
    rc, out = run_in_process("lora_models:tiny_llama_declines_bf16", "--dtype", "fp32",
                             "--dtype", "bf16", "--junit", x)
    assert rc == 0 and "(bf16 unsupported)" in out, out
    suite = ET.parse(x).getroot().find("testsuite")
    assert suite.get("skipped") == "6" and suite.get("failures") == "0", suite.attrib
    skipped = [c for c in suite.findall("testcase") if c.find("skipped") is not None]
    assert "no bf16 kernel" in skipped[0].find("skipped").get("message"), skipped[0]
    with h5py.File(os.path.join(dumps, "model.layers.1.mlp.h5"), "r") as f:
        [case] = [n for n in f if n.startswith("mlp.bf16.")]
        assert f[case]["layer0/mlp/down_proj/output"].attrs["status"] in (b"fail", "fail")



BAD_INPUTS = [
    (("lora_models:no_such_model",), "lora_models has no no_such_model"),
    (("lora_models:NOT_A_MODEL",), "gave a int, expected a torch.nn.Module"),
    (("lora_models:raises",), "lora_models:raises() raised RuntimeError: no weights"),
    (("no_such_module_xyz:model",), "cannot import no_such_module_xyz"),
    (("lora_models",), "expected MODULE:NAME"),
    (("lora_models:tiny_llama", "--dtype", "fp8"), "invalid choice: 'fp8'"),
    (("lora_models:tiny_llama", "--by", "block"), "invalid choice: 'block'"),
    (("lora_models:tiny_llama", "--end-to-end", "yes"), "invalid choice: 'yes'"),
    (("lora_models:tiny_llama", "--steps", "-1"), "steps=-1: expected a whole number"),
    (("lora_models:tiny_llama", "--steps", "2", "--end-to-end", "off"),
     "end_to_end=False leaves none"),
    (("lora_models:tiny_llama", "--end-to-end", "on"),
     "end_to_end=True: model.layers.0.self_attn.q_proj.lora_B.default.weight and others "
     "is all zeros"),
    (("lora_models:tiny_llama", "--dump-dir", "{d}/missing"), "--dump-dir {d}/missing: not a "
     "folder"),
    (("lora_models:tiny_llama", "--json", "{d}/missing/r.json"),
     "its folder does not exist"),
]


@pytest.mark.parametrize("args, words", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, args, words):
    """Bad input: exit 2, named, nothing written."""
    d = str(tmp_path)
    args = tuple(a.replace("{d}", d) for a in args)
    words = words.replace("{d}", d)
    before = sorted(os.listdir(d))
    rc, out = run_in_process(*args)
    assert rc == 2 and words in out, (args, rc, out)
    assert sorted(os.listdir(d)) == before, (args, os.listdir(d))


def test_a_module_not_judged(tmp_path):
    d = str(tmp_path)
    why = "cannot be judged: layer 0's attention is past the floor's model"
    checks = [Check(path=f"c/layer0/{t}", status="out_of_range", message=why, max_abs=3.0,
                        limit=1.0, name=t) for t in ("hidden.output", "q_proj.lora_A.grad")]
    case = Case(id="layer.bf16.x", kind="layer", status="invalid", checks=checks,
                    replay="r")
    report = ModelReport([ModuleResult("model.layers.0", "layer", [case])])
    j, h, x = (os.path.join(d, f"nj.{e}") for e in ("json", "html", "xml"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = model_command.main(["lora_models:tiny_llama", "--json", j, "--html", h,
                                 "--junit", x], check=lambda *a, **k: report)
    assert rc == 2, (rc, out.getvalue())
    assert "invalid" in out.getvalue() and "(bf16 not judged)" in out.getvalue(), out.getvalue()
    data = json.load(open(j))
    assert data["not_judged"] == ["model.layers.0"] and data["first_divergence"] is None, data
    assert {k["status"] for k in data["modules"][0]["cases"][0]["checks"]} == {"out_of_range"}
    suite = ET.parse(x).getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("skipped")) == ("0", "2"), ET.tostring(suite)
    page = open(h).read()
    assert "not judged" in page and ">FAIL<" not in page, page[:800]
