#!/usr/bin/env python3
"""Kill matrix: runs a suite once per injectable fault and checks that each run exits 1
with a failing check on the tensor the fault corrupts.

Usage: kill-matrix.py GRADSCOPE_BINARY [--suite smoke] [--device cpu] [--markdown FILE]
Exit status 0 when every fault is caught, 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def faults(binary):
    out = subprocess.run([binary, "faults"], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        name = line.split()[0]
        caught_at = line.rsplit("caught at ", 1)[1].strip()
        rows.append((name, caught_at))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--markdown")
    args = parser.parse_args()

    lines = ["| fault | exit | failing checks | caught | first failing check on the corrupted tensor |",
             "|---|---|---|---|---|"]
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, caught_at in faults(args.binary):
            report = os.path.join(tmp, name + ".json")
            run = subprocess.run([args.binary, "run", "--suite", args.suite, "--device", args.device,
                                  "--inject", name, "--quiet", "--json", report],
                                 capture_output=True, text=True)
            failing = []
            if os.path.exists(report):
                with open(report) as f:
                    for case in json.load(f)["cases"]:
                        failing += [c["path"] for c in case["checks"] if c["status"] != "pass"]
            hits = [p for p in failing if caught_at in p]
            caught = run.returncode == 1 and bool(hits)
            missed += 0 if caught else 1
            lines.append(f"| {name} | {run.returncode} | {len(failing)} | {'yes' if caught else 'NO'} | "
                         f"{hits[0] if hits else '-'} |")
            print(lines[-1], flush=True)
    summary = f"{len(lines) - 2 - missed} of {len(lines) - 2} faults caught by suite {args.suite} on {args.device}"
    print(summary)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n\n" + summary + "\n")
    return 0 if missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
