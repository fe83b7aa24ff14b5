"""`python -m gradscope model MODULE:FACTORY`: check_model from the command line (docs/python.md).

FACTORY is a callable of the importable MODULE that takes no arguments and returns the model
(or the model itself). Every LoRA module of it is judged by check_model; the table goes to the
console, and --json and --html write the same results as data and as a heatmap of err/limit
(modules down, tensors across, one block per dtype). Exit 0 when every module passes, 1 when
one fails, 2 when nothing could be judged (no such factory, not a module, a module gradscope
does not model, a bad flag); an output file is written whole or not at all.
"""
from __future__ import annotations

import argparse
import html
import importlib
import json
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from . import api
from .check_module import ModelReport, ModuleRefused, check_model

# The heatmap's columns: a check's tensor, by the last part of the module's own name for it.
_ROLES = (("output", "output"), ("input.grad", "input.grad"),
          ("lora_A.grad", ".lora_A."), ("lora_B.grad", ".lora_B."), ("loss", "loss"),
          ("error", "error"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad flag is bad input: exit 2 with the usage
        self.print_usage(sys.stderr)
        raise api.GradscopeInputError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m gradscope model",
                description="Judge every LoRA module of a model (gradscope.check_model).")
    p.add_argument("factory", help="MODULE:NAME, a callable returning the model (or the model)")
    p.add_argument("--adapter", default="default", help="the LoRA adapter's name (peft)")
    p.add_argument("--dtype", action="append", choices=("fp32", "fp16", "bf16"),
                   help="activation dtype; repeat for several (default: bf16)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=17, help="tokens per sequence")
    p.add_argument("--seed", type=int, default=1, help="module i draws from seed + i")
    p.add_argument("--zero-format", choices=("gptq", "gptq_v2"),
                   help="how the bases' qzeros store zero points, where they do not say")
    p.add_argument("--by", choices=("module", "layer"), default="module",
                   help="judge each LoRA module (default) or each decoder layer whole")
    p.add_argument("--inputs", choices=("case", "model"), default="case",
                   help="seeded inputs (default), or each module's input and output gradients "
                        "from the model's own forward and backward, with its own weights")
    p.add_argument("--end-to-end", choices=("auto", "on", "off"), default="auto",
                   help="also judge the loss and every LoRA gradient against the model in fp64: "
                        "where the model allows it (auto), required (on), or not (off)")
    p.add_argument("--steps", type=int, default=0,
                   help="end to end, also this many optimizer steps, each step's losses judged")
    p.add_argument("--lr", type=float, default=1e-3, help="the steps' AdamW learning rate")
    p.add_argument("--json", metavar="FILE", help="every module's checks as JSON")
    p.add_argument("--html", metavar="FILE", help="a heatmap of err/limit")
    p.add_argument("--junit", metavar="FILE",
                   help="JUnit XML: a test per module, dtype and tensor, failures with the message")
    p.add_argument("--dump-dir", metavar="DIR",
                   help="an existing folder: one HDF5 dump per module, <module path>.h5")
    return p


def _load_model(spec: str) -> torch.nn.Module:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise api.GradscopeInputError(f"{spec!r}: expected MODULE:NAME, e.g. my_models:tiny_llama")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise api.GradscopeInputError(f"{spec}: cannot import {module_name}: {e}") from e
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise api.GradscopeInputError(f"{spec}: {module_name} has no {attribute}")
        target = getattr(target, part)
    model = target
    if callable(target) and not isinstance(target, torch.nn.Module):
        try:
            model = target()
        except Exception as e:  # the user's own code: named, not a traceback through gradscope
            raise api.GradscopeInputError(f"{spec}() raised {type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise api.GradscopeInputError(f"{spec} gave a {type(model).__name__}, expected a "
                                      "torch.nn.Module")
    return model


def _ratio(check: api.Check) -> Optional[float]:
    if check.max_abs is None or not check.limit:
        return None
    return check.max_abs / check.limit


def report_data(report: ModelReport) -> Dict[str, Any]:
    """The report as plain data (what --json writes)."""
    first = report.first_failure
    return {
        "passed": report.passed,
        "first_divergence": first.path if first else None,
        "not_judged": [m.path for m in report.not_judged],
        "note": report.note or None,
        "modules": [{
            "path": m.path, "kind": m.kind, "passed": m.passed,
            "cases": [{
                "id": c.id, "status": c.status, "replay": c.replay,
                "checks": [{"name": k.name, "passed": k.passed, "status": k.status,
                            "statistic": k.statistic,
                            "max_abs": k.max_abs,
                            "limit": k.limit, "error_to_limit": _ratio(k),
                            "message": k.message} for k in c.checks],
            } for c in m.cases],
        } for m in report.modules],
    }


def report_junit(report: ModelReport, name: str) -> str:
    """JUnit XML: a testcase per module (classname), dtype and tensor; a failing check's message
    as its failure."""
    suite = ET.Element("testsuite", name=name)
    tests = failures = skipped = 0
    for m in report.modules:
        for c in m.cases:
            dtype = c.id.split(".")[1]
            if not c.checks:  # a case the module declined: a skip, not a silent gap
                skipped += 1
                case = ET.SubElement(suite, "testcase", classname=m.path, name=f"{dtype}.case")
                ET.SubElement(case, "skipped", message=f"{c.status}: {c.unsupported or ''}")
            for k in c.checks:
                case = ET.SubElement(suite, "testcase", classname=m.path,
                                     name=f"{dtype}.{k.name}")
                if k.status == "out_of_range":  # not judged: no verdict, a skip
                    skipped += 1
                    ET.SubElement(case, "skipped", message=k.message.split("\n")[0])
                elif not k.passed:
                    failures += 1
                    ET.SubElement(case, "failure", message=k.message.split("\n")[0]).text = (
                        f"{k.message}\nreplay: {c.replay}")
            tests += max(1, len(c.checks))
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode") + "\n"


def _cell_colour(ratio: Optional[float], passed: bool) -> str:
    if not passed:
        return "#b2182b"
    if ratio is None:
        return "#f0f0f0"
    # White at 0, through yellow to orange as err/limit nears 1 (1 is the rule's limit).
    r = max(0.0, min(1.0, ratio))
    green = int(255 - 120 * r)
    blue = int(255 - 255 * min(1.0, 2 * r))
    return f"#ff{green:02x}{blue:02x}"


def report_html(report: ModelReport, title: str) -> str:
    """A heatmap of the worst err/limit per module, tensor and dtype; each cell's tooltip
    lists the checks it covers."""
    dtypes: List[str] = []
    for m in report.modules:
        for c in m.cases:
            dtype = c.id.split(".")[1]
            if dtype not in dtypes:
                dtypes.append(dtype)
    head = "".join(f"<th colspan={len(_ROLES)}>{html.escape(d)}</th>" for d in dtypes)
    roles = "".join(f"<th>{html.escape(r)}</th>" for r, _ in _ROLES) * len(dtypes)
    rows = []
    for m in report.modules:
        cells = []
        for dtype in dtypes:
            case = next((c for c in m.cases if c.id.split(".")[1] == dtype), None)
            for _, key in _ROLES:
                checks = [k for k in (case.checks if case else []) if
                          (k.name.endswith(key) if not key.startswith(".") else key in k.name)]
                if not checks:
                    cells.append("<td></td>")
                    continue
                ratios = [r for r in (_ratio(k) for k in checks
                                      if k.status != "out_of_range") if r is not None]
                worst = max(ratios, default=None)
                passed = all(k.passed or k.status == "out_of_range" for k in checks)
                judged = [k for k in checks if k.status != "out_of_range"]
                tip = "\n".join(f"{k.name}: " + (f"{_ratio(k):.3g}" if _ratio(k) is not None
                                                  else k.status) for k in checks)
                text = ("FAIL" if not passed else "not judged" if not judged
                        else f"{worst:.2f}" if worst is not None else "")
                cells.append(f"<td style='background:{_cell_colour(worst, passed)}' "
                             f"title='{html.escape(tip, quote=True)}'>{text}</td>")
        verdict = "FAIL" if not m.passed else "invalid" if m.not_judged else "pass"
        rows.append(f"<tr><th>{html.escape(m.path)}</th><td>{m.kind}</td><td>{verdict}</td>"
                    + "".join(cells) + "</tr>")
    first = report.first_failure
    summary = (f"first divergence: {html.escape(first.path)} ({first.kind})" if first
               else f"{len(report.not_judged)} of {len(report.modules)} modules not judged in "
               "some dtype, the others pass" if report.not_judged
               else f"all {len(report.modules)} modules pass")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:center;font-size:12px}"
            "tbody th{text-align:left}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{summary}. Each cell: the worst error/limit of "
            "the module's checks of that tensor (1 is the rule's limit); hover for each check."
            "</p><table><thead><tr><th rowspan=2>module</th><th rowspan=2>kind</th>"
            f"<th rowspan=2>verdict</th>{head}</tr><tr>{roles}</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></body></html>\n")


def _write_whole(path: str, text: str) -> None:
    """Writes the file whole or not at all (a temporary file beside it, then renamed)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise api.GradscopeInputError(f"{path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".gradscope-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: Sequence[str], check: Callable[..., ModelReport] = check_model) -> int:
    try:
        args = _parser().parse_args(list(argv))
        for path in (args.json, args.html, args.junit):
            if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise api.GradscopeInputError(f"{path}: its folder does not exist")
        if args.dump_dir and not os.path.isdir(args.dump_dir):
            raise api.GradscopeInputError(f"--dump-dir {args.dump_dir}: not a folder")
        model = _load_model(args.factory)
        report = check(model, adapter=args.adapter, dtypes=args.dtype or ["bf16"],
                       batch=args.batch, seq=args.seq, seed=args.seed,
                       zero_format=args.zero_format, by=args.by, inputs=args.inputs,
                       dump_dir=args.dump_dir,
                       end_to_end={"auto": "auto", "on": True, "off": False}[args.end_to_end],
                       steps=args.steps, lr=args.lr,
                       raise_on_failure=False)
    except (api.GradscopeInputError, ModuleRefused) as e:
        print(f"gradscope model: {e}", file=sys.stderr)
        return 2
    print(report.table())
    for line in report.divergence_lines():
        print(line)
    try:
        if args.json:
            _write_whole(args.json, json.dumps(report_data(report), indent=1) + "\n")
        if args.html:
            _write_whole(args.html, report_html(report, f"gradscope model {args.factory}"))
        if args.junit:
            _write_whole(args.junit, report_junit(report, f"gradscope model {args.factory}"))
    except (OSError, api.GradscopeInputError) as e:
        print(f"gradscope model: cannot write: {e}", file=sys.stderr)
        return 2
    # A failure is a verdict; a module not judged (and none failed) is no verdict: exit 2.
    return 1 if not report.passed else 2 if report.not_judged else 0
