#!/usr/bin/env python3
"""Writes the smoke suite's pairwise files, cases/smoke/pairs_<kind>.toml: rows of a covering
array over the type axes of each kind (every pair of axis values in at least one row), drawn
by allpairspy (pinned in scripts/install-deps.sh), each row given its own tail shape: a token
count and feature counts off the round values (docs/coverage.md says which and why).

    python3 scripts/make-pairwise-suites.py            # rewrite the files
    python3 scripts/make-pairwise-suites.py --check    # exit 1 if a file differs (CTest)

`gradscope coverage --suite smoke` then checks every pair and residue is reached.
"""
import argparse
import os
import sys

from allpairspy import AllPairs

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.path.join(HERE, "..", "cases", "smoke")

# Token shapes (batch, seq), batch 0 being a 2-D input: together their counts reach residues 0,
# 1, m - 1 and one between, for every m in 2, 4, ..., 128 (1, 127, 128, 129, 255, ...), and
# 3-D inputs with odd and even seq.
TOKEN_SHAPES = [(0, 1), (3, 7), (0, 127), (2, 64), (1, 129), (3, 11), (0, 65), (5, 3), (0, 255),
                (0, 17), (2, 31), (0, 9), (1, 33), (4, 1), (0, 63), (0, 257)]
# Feature counts are odd multiples of the format's smallest step (32 / bits, 32 for 3 bits).
MULTIPLIERS = [3, 5, 7, 9, 11, 13, 1, 15]
GROUP_SIZES = [-1, 32, 128, 24]


def step(bits):
    return 32 if bits == 3 else 32 // bits


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def act_order_fields(value):
    return {"off": {}, "act": {"desc_act": True},
            "act-static": {"desc_act": True, "static_groups": True}}[value]


def rows(axes):
    names = list(axes)
    return [dict(zip(names, r)) for r in AllPairs([axes[n] for n in names])]


GPTQ_AXES = {
    "bits": [2, 3, 4, 8],
    "format": ["gptq", "gptq_v2"],
    "sym": [True, False],
    "act_order": ["off", "act", "act-static"],
    "scales_dtype": ["fp16", "bf16"],
}
LORA_AXES = {
    **GPTQ_AXES,
    "dtype": ["fp32", "fp16", "bf16"],
    "adapter_dtype": ["fp32", "fp16", "bf16"],
    "dropout": [0.0, 0.1],
    "bias": [False, True],
    "rslora": [False, True],
}


def gptq_fields(row, i):
    f = {"bits": row["bits"], "format": row["format"], "sym": row["sym"],
         "scales_dtype": row["scales_dtype"], "group_size": GROUP_SIZES[i % len(GROUP_SIZES)]}
    f.update(act_order_fields(row["act_order"]))
    return f


def feature(bits, i, offset=0):
    return step(bits) * MULTIPLIERS[(i + offset) % len(MULTIPLIERS)]


def tokens(i):
    batch, seq = TOKEN_SHAPES[i % len(TOKEN_SHAPES)]
    return {"batch": batch, "seq": seq}


def lora_fields(row, i):
    f = gptq_fields(row, i)
    f.update({k: row[k] for k in ("dtype", "adapter_dtype", "dropout", "bias", "rslora")})
    f.update(tokens(i))
    return f


def dequant_cases():
    axes = {**GPTQ_AXES, "dtype": ["fp32", "fp16", "bf16"], "layout": ["in_out", "out_in"]}
    out = []
    for i, row in enumerate(rows(axes)):
        f = gptq_fields(row, i)
        f.update({"dtype": row["dtype"], "layout": row["layout"],
                  "in_features": feature(row["bits"], i), "out_features": feature(row["bits"], i, 3)})
        out.append(f)
    return out


def lora_w_cases():
    out = []
    for i, row in enumerate(rows(LORA_AXES)):
        f = lora_fields(row, i)
        f.update({"in_features": feature(row["bits"], i), "out_features": feature(row["bits"], i, 3)})
        out.append(f)
    return out


def qkv_cases():
    out = []
    for i, row in enumerate(rows({**LORA_AXES, "gqa_ratio": [1, 2, 4]})):
        f = lora_fields(row, i)
        ratio = row["gqa_ratio"]
        kv_heads = 1 + i % 2
        heads = kv_heads * ratio
        # An odd multiple of the step: k_proj's kv_heads * head_dim outputs off the round sizes.
        head_dim = step(row["bits"]) * (1 + 2 * (i % 2))
        f.update({"hidden": heads * head_dim, "heads": heads, "kv_heads": kv_heads})
        out.append(f)
    return out


def mlp_cases():
    out = []
    for i, row in enumerate(rows(LORA_AXES)):
        f = lora_fields(row, i)
        f.update({"hidden": feature(row["bits"], i), "intermediate": feature(row["bits"], i, 3)})
        out.append(f)
    return out


KINDS = {
    "dequant": (dequant_cases, "every pair of (bits, zero format, sym, act-order, scales dtype, "
                "output dtype, layout)"),
    "lora_w": (lora_w_cases, "every pair of (bits, zero format, sym, act-order, scales dtype, "
               "dtype, adapter dtype, dropout, bias, rsLoRA)"),
    "qkv": (qkv_cases, "every pair of (bits, zero format, sym, act-order, scales dtype, dtype, "
            "adapter dtype, dropout, bias, rsLoRA, GQA ratio 1/2/4)"),
    "mlp": (mlp_cases, "every pair of (bits, zero format, sym, act-order, scales dtype, dtype, "
            "adapter dtype, dropout, bias, rsLoRA)"),
}


def render(kind, cases, what):
    lines = [
        "# Generated by scripts/make-pairwise-suites.py (allpairspy); do not edit by hand.",
        'description = """',
        f"Pairwise coverage of the {kind} type axes: {what}, each row at its own tail shape",
        '(token counts 1, odd, 2^k +- 1; feature counts at odd multiples of the smallest step)."""',
        f'kind = "{kind}"',
        "seed = 401",
        "",
    ]
    for c in cases:
        lines.append("[[cases]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in c.items()]
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    stale = []
    for kind, (make, what) in KINDS.items():
        path = os.path.normpath(os.path.join(SMOKE, f"pairs_{kind}.toml"))
        text = render(kind, make(), what)
        if args.check:
            with open(path) as f:
                if f.read() != text:
                    stale.append(path)
        else:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run scripts/make-pairwise-suites.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
