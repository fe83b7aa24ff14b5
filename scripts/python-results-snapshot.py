#!/usr/bin/env python3
"""Every verdict and figure the Python entry points give on a fixed set of modules and models,
as JSON, with each call's wall time: run on two builds of the package and diff the JSON to show
that a change moved no status, value, limit or floor (docs/python.md).

Usage: PYTHONPATH=<build>/python:tests/python python-results-snapshot.py OUT.json [REPEATS]
"""
import json
import sys
import time

import torch

import gradscope
import lora_models as lm


def record(cases):
    return [{"id": c.id, "status": c.status,
             "checks": [{"path": k.path, "name": k.name, "status": k.status,
                         "max_abs": k.max_abs, "limit": k.limit} for k in c.checks]}
            for c in cases]


def timed(results, times, name, call, repeats):
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        value = call()
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    results[name] = value
    times[name] = best


def main(out, repeats):
    torch.manual_seed(0)
    results, times = {}, {}
    model = lm.tiny_llama_trained()
    layer = model.model.layers[0]
    timed(results, times, "check(smoke lora_w)",
          lambda: record(gradscope.check("cases/smoke/lora_w.toml")), repeats)
    timed(results, times, "check_module(o_proj)",
          lambda: record(gradscope.check_module(layer.self_attn.o_proj)), repeats)
    timed(results, times, "check_module(o_proj, weights=module)",
          lambda: record(gradscope.check_module(layer.self_attn.o_proj, weights="module")),
          repeats)
    timed(results, times, "check_module(self_attn)",
          lambda: record(gradscope.check_module(layer.self_attn)), repeats)
    timed(results, times, "check_module(mlp)",
          lambda: record(gradscope.check_module(layer.mlp)), repeats)
    timed(results, times, "check_module(layer)",
          lambda: record(gradscope.check_module(layer, dtypes=("fp32", "bf16"))), repeats)
    for by, inputs in (("module", "case"), ("layer", "case"), ("module", "model")):
        name = f"check_model(by={by}, inputs={inputs})"
        timed(results, times, name, lambda: [
            {"path": m.path, "kind": m.kind, "cases": record(m.cases)}
            for m in gradscope.check_model(model, by=by, inputs=inputs, dtypes=("bf16", "fp16"),
                                           raise_on_failure=False).modules], repeats)
    with open(out, "w") as f:
        json.dump({"results": results, "seconds": times}, f, indent=1)
    for name, seconds in times.items():
        print(f"{seconds:8.3f} s  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
