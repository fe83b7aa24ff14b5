"""Implementations side by side: `python -m gradscope.bench`.

    python -m gradscope.bench --impl gradscope --impl fms_acceleration --impl peft \\
        --import gradscope.adapters.fms_acceleration --import gradscope.adapters.peft \\
        --json bench.json

Times every named implementation's operators (docs/implementations.md) on the same inputs in
one process: `dequantize` of whole layers, and `lora_w`, `lora_qkv` and `lora_mlp` forward and
backward (to x, lora_A and lora_B, with ones as the output gradients). Each row gives the
median time (CUDA events; wall clock on the CPU) and, on CUDA, the peak memory allocated during
one call beyond what was allocated before it; the `gradscope` row also its ratio to the best of
the other implementations. An implementation that declines (NotImplementedError) or raises is
listed with its message; the timing of the others goes on. Timing only: correctness is the
`run` command's; the dequant rows say whether each result equals gradscope's bit for bit, so
that the timed work is the same.

Inputs: random packed words (their values do not change the work), `gptq_v2` zeros, fp16
scales, group 128; fp16 activations [1, tokens, hidden], fp32 adapters (mixed precision as
peft trains), alpha 16, no dropout. Exit 2 for a bad argument, a module that fails to import,
a namespace with none of the operators, or --device cuda without a GPU.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

import torch

import gradscope
from gradscope.api import GradscopeInputError, import_modules

# hidden, intermediate, attention heads, key/value heads
MODELS = {
    "tiny": (256, 688, 4, 2),
    "llama2-7b": (4096, 11008, 32, 32),
    "llama2-70b": (8192, 28672, 64, 8),
}
PEAK_BANDWIDTH = {"NVIDIA H200": 4.8e12}  # bytes/s, datasheet; others print no % of peak
GROUP = 128
ALPHA = 16.0
BASE = "gradscope"


def _shape(text):
    try:
        k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KxN (e.g. 4096x4096), got {text!r}")
    if k <= 0 or n <= 0 or k % 32 or n % 32:
        raise argparse.ArgumentTypeError(f"{text}: K and N must be positive multiples of 32")
    return k, n


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _parser():
    p = argparse.ArgumentParser(prog="python -m gradscope.bench",
                                description="times implementations under test side by side")
    p.add_argument("--impl", action="append", required=True,
                   help="a namespace to time (repeatable); 'gradscope' is gradscope's own")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   help="import MODULE first (registers a namespace); repeatable")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--only", choices=["dequant", "ops"])
    p.add_argument("--dequant-shapes", nargs="+", type=_shape,
                   default=[(4096, 4096), (4096, 11008), (8192, 28672)], metavar="KxN")
    p.add_argument("--bits", nargs="+", type=int, choices=[2, 3, 4, 8], default=[2, 3, 4, 8])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS),
                   default=["llama2-7b", "llama2-70b"])
    p.add_argument("--tokens", nargs="+", type=_positive, default=[2048, 8192])
    p.add_argument("--rank", nargs="+", type=_positive, default=[16])
    p.add_argument("--ops", nargs="+", choices=["lora_w", "lora_qkv", "lora_mlp"],
                   default=["lora_w", "lora_qkv", "lora_mlp"])
    p.add_argument("--repeats", type=_positive, default=20)
    p.add_argument("--json", help="write every row to FILE")
    return p


class _Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, fn):
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t0)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)


def _measure(clock, fn, repeats):
    """{"ms": median, "peak_mib": peak allocated during one call (CUDA) or None}."""
    for _ in range(3):
        fn()
    clock.sync()
    peak = None
    if clock.cuda:
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        clock.sync()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    return {"ms": statistics.median(clock.time_ms(fn) for _ in range(repeats)), "peak_mib": peak}


def _try(clock, fn, repeats):
    try:
        return {"status": "ok", **_measure(clock, fn, repeats)}
    except NotImplementedError as e:
        return {"status": "unsupported", "message": str(e).splitlines()[0]}
    except Exception as e:  # the implementation's own failure, reported as it is
        return {"status": "error", "message": f"{type(e).__name__}: {str(e).splitlines()[0]}"}


def _op(ns, name):
    try:
        return getattr(getattr(torch.ops, ns), name)
    except (AttributeError, RuntimeError):
        return None


def _random_layer(k, n, bits, act_order, device, gen):
    """One GPTQ layer in checkpoint layout with random words, as the contract passes it."""
    groups = -(-k // GROUP)  # a last, partial group when K is not a multiple
    words = lambda *shape: torch.randint(-2**31, 2**31 - 1, shape, generator=gen,
                                         dtype=torch.int32, device="cpu").to(device)
    rows = torch.randperm(k, generator=gen) if act_order else torch.arange(k)
    return {
        "qweight": words(k * bits // 32, n),
        "qzeros": words(groups, n * bits // 32),
        "scales": (torch.rand(groups, n, generator=gen) * 0.01 + 1e-3).half().to(device),
        "g_idx": (rows // GROUP).to(torch.int32).to(device),
    }


def _layer_bytes(layer, out_elems):
    return sum(t.numel() * t.element_size() for t in layer.values()) + 2 * out_elems


def _ratio_to_best_peer(results, key):
    base = results.get(BASE)
    peers = [r[key] for ns, r in results.items()
             if ns != BASE and r["status"] == "ok" and r[key] is not None]
    if not base or base["status"] != "ok" or base[key] is None or not peers:
        return None
    return base[key] / min(peers)


def _print_rows(title, results, extra):
    print(title)
    for ns, r in results.items():
        if r["status"] != "ok":
            print(f"  {ns:<18} {r['status']}: {r['message']}")
            continue
        memory = "" if r["peak_mib"] is None else f"{r['peak_mib']:9.1f} MiB  "
        print(f"  {ns:<18} {r['ms']:10.4f} ms  {memory}{extra(r)}")
    t, m = _ratio_to_best_peer(results, "ms"), _ratio_to_best_peer(results, "peak_mib")
    if t is not None:
        memory = "" if m is None else f", memory {m:.2f}x"
        print(f"  {BASE} / best peer: time {t:.2f}x{memory}")


def _dequant_columns(r):
    pct = "" if r["fraction_of_peak"] is None else f"{100 * r['fraction_of_peak']:5.1f}% peak  "
    same = {None: "", True: "same as gradscope", False: "DIFFERS from gradscope"}
    return f"{r['tb_per_s']:6.3f} TB/s  {pct}{same[r['equals_gradscope']]}"


def bench_dequant(args, impls, device, clock, rows):
    peak = PEAK_BANDWIDTH.get(torch.cuda.get_device_name() if clock.cuda else "")
    gen = torch.Generator().manual_seed(0)
    for k, n in args.dequant_shapes:
        for bits in args.bits:
            for act_order in (False, True):
                layer = _random_layer(k, n, bits, act_order, device, gen)
                nbytes = _layer_bytes(layer, k * n)
                results, reference = {}, None
                for ns in impls:
                    op = _op(ns, "dequantize")
                    if op is None:
                        results[ns] = {"status": "unsupported",
                                       "message": f"no operator {ns}::dequantize"}
                        continue
                    call = lambda: op(layer["qweight"], layer["qzeros"], layer["scales"],
                                      layer["g_idx"], bits, "gptq_v2", torch.float16, "in_out")
                    r = _try(clock, call, args.repeats)
                    if r["status"] == "ok":
                        r["tb_per_s"] = nbytes / (r["ms"] * 1e-3) / 1e12
                        r["fraction_of_peak"] = r["tb_per_s"] * 1e12 / peak if peak else None
                        out = call()
                        if ns == BASE:
                            reference = out
                        r["equals_gradscope"] = (None if reference is None else
                                                 bool(torch.equal(out, reference)))
                    results[ns] = r
                title = (f"dequantize {k}x{n}, {bits}-bit, act-order {'on' if act_order else 'off'}"
                         f", fp16 out, {nbytes / 2**20:.1f} MiB moved")
                _print_rows(title, results, _dequant_columns)
                rows.append({"bench": "dequantize", "K": k, "N": n, "bits": bits,
                             "group_size": GROUP, "act_order": act_order, "out": "fp16",
                             "bytes": nbytes, "results": results,
                             "gradscope_time_over_best_peer": _ratio_to_best_peer(results, "ms")})


def _projection(k, n, rank, device, gen):
    layer = _random_layer(k, n, 4, False, device, gen)
    a = (torch.randn(rank, k, generator=gen) / k**0.5).to(device).requires_grad_()
    b = (torch.randn(n, rank, generator=gen) * 0.01).to(device).requires_grad_()
    return [layer["qweight"], layer["qzeros"], layer["scales"], layer["g_idx"], a, b]


def bench_ops(args, impls, device, clock, rows):
    gen = torch.Generator().manual_seed(1)
    for model in args.models:
        hidden, inter, heads, kv_heads = MODELS[model]
        kv = kv_heads * hidden // heads
        shapes = {"lora_w": [(hidden, hidden)],
                  "lora_qkv": [(hidden, hidden), (hidden, kv), (hidden, kv)],
                  "lora_mlp": [(hidden, inter), (hidden, inter), (inter, hidden)]}
        for name in args.ops:
            for tokens in args.tokens:
                for rank in args.rank:
                    projs = [_projection(k, n, rank, device, gen) for k, n in shapes[name]]
                    x = torch.randn(1, tokens, hidden, generator=gen).half().to(device)
                    x.requires_grad_()
                    leaves = [x] + [t for p in projs for t in p[4:6]]
                    results = {}
                    for ns in impls:
                        op = _op(ns, name)
                        if op is None:
                            results[ns] = {"status": "unsupported",
                                           "message": f"no operator {ns}::{name}"}
                            continue

                        def call(op=op):
                            out = op(x, *projs, 4, "gptq_v2", ALPHA, False)
                            outs = list(out) if isinstance(out, (list, tuple)) else [out]
                            torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs])

                        results[ns] = _try(clock, call, args.repeats)
                    _print_rows(f"{name} {model}, {tokens} tokens, rank {rank}, fwd+bwd", results,
                                lambda r: "")
                    rows.append({"bench": name, "model": model, "tokens": tokens, "rank": rank,
                                 "dtype": "fp16", "adapter_dtype": "fp32", "bits": 4,
                                 "results": results,
                                 "gradscope_time_over_best_peer": _ratio_to_best_peer(results, "ms"),
                                 "gradscope_memory_over_best_peer":
                                     _ratio_to_best_peer(results, "peak_mib")})


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        import_modules(args.imports)
    except GradscopeInputError as e:
        print(f"gradscope.bench: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gradscope.bench: error: --device cuda needs a CUDA GPU (use --device cpu)",
              file=sys.stderr)
        return 2
    impls = list(dict.fromkeys(args.impl))
    ops = ("dequantize", "lora_w", "lora_qkv", "lora_mlp")
    for ns in impls:
        if not any(_op(ns, o) for o in ops):
            print(f"gradscope.bench: error: --impl {ns}: the namespace registers none of "
                  f"{', '.join(ops)} (missing --import?)", file=sys.stderr)
            return 2
    device = torch.device(args.device)
    clock = _Clock(device)
    name = torch.cuda.get_device_name() if clock.cuda else "CPU"
    print(f"gradscope.bench on {name}, torch {torch.__version__}, implementations: "
          f"{', '.join(impls)}; median of {args.repeats}\n")
    rows: List[Dict[str, Any]] = []
    with torch.inference_mode(False):
        if args.only in (None, "dequant"):
            bench_dequant(args, impls, device, clock, rows)
        if args.only in (None, "ops"):
            bench_ops(args, impls, device, clock, rows)
    print(f"\n({BASE} / best peer: below 1 means {BASE} is faster or leaner)")
    if args.json:
        report = {"device": name, "torch": torch.__version__, "implementations": impls,
                  "rows": rows}
        try:  # whole or not at all: a temporary file beside it, renamed
            with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(args.json)),
                                             prefix=".bench-", delete=False) as f:
                json.dump(report, f, indent=1)
            os.replace(f.name, args.json)
        except OSError as e:
            print(f"gradscope.bench: error: --json {args.json}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
