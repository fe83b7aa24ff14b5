"""`python -m gradscope model MODULE:FACTORY`: check_model from the command line (docs/python.md).

FACTORY is a callable of the importable MODULE that takes no arguments and returns the model
(or the model itself). Every LoRA module of it is judged by check_model; the table goes to the
console, and --json, --html and --junit write the same results as data, as a heatmap of
err/limit (modules down, tensors across, one block per dtype) and as JUnit XML, by the C++
report writers (reports/model_report.h). Exit 0 when every module passes, 1 when
one fails, 2 when nothing could be judged (no such factory, not a module, a module gradscope
does not model, a bad flag); an output file is written whole or not at all.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Sequence

import torch

from . import _gradscope, api
from .errors import ModuleRefused
from .model_check import ModelReport, check_model

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
    try:  # by the C++ writers (reports/model_report.h), each file whole or not at all
        _gradscope.write_model_reports(report, f"gradscope model {args.factory}",
                                       json=args.json or "", html=args.html or "",
                                       junit=args.junit or "")
    except (OSError, api.GradscopeInputError) as e:
        print(f"gradscope model: cannot write: {e}", file=sys.stderr)
        return 2
    # A failure is a verdict; a module not judged (and none failed) is no verdict: exit 2.
    return 1 if not report.passed else 2 if report.not_judged else 0
