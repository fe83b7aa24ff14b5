#!/usr/bin/env python3
"""Kill matrix: runs a suite once per injectable fault and checks that each run exits 1
with a failing check on the tensor the fault corrupts.

Usage: kill-matrix.py GRADSCOPE_BINARY [--suite smoke] [--device cpu] [--markdown FILE]
                      [--fail-fast] [--scoped]
--fail-fast stops each run at its first failing case (the gate's answer is known then); where
that case fails elsewhere than on the corrupted tensor, the fault runs again without it, so a
fault counts as caught exactly when the whole suite would catch it. --scoped runs a dequant
fault (caught at /gptq/...) on the dequant cases only and a LoRA fault on the LoRA cases only:
a subset that fails on the tensor proves the suite does. Both keep the matrix affordable.
Exit status 0 when every fault is caught, 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def faults(binary):
    out = subprocess.run([binary, "faults"], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        name = line.split()[0]
        caught_at = line.rsplit("caught at ", 1)[1].strip()
        rows.append((name, caught_at))
    return rows


def run_fault(command, report):
    """Runs one fault; returns the process, the failing check paths and the cases run."""
    if os.path.exists(report):
        os.remove(report)
    run = subprocess.run(command, capture_output=True, text=True)
    failing, cases_run = [], 0
    if os.path.exists(report):
        with open(report) as f:
            cases = json.load(f)["cases"]
        cases_run = len(cases)
        for case in cases:
            # A check not judged (out_of_range) is no catch.
            failing += [c["path"] for c in case["checks"] if c["status"] == "fail"]
    return run, failing, cases_run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--markdown")
    parser.add_argument("--fail-fast", action="store_true")
    parser.add_argument("--scoped", action="store_true")
    args = parser.parse_args()

    lines = ["| fault | exit | cases run | failing checks | caught | first failing check on the corrupted tensor | seconds |",
             "|---|---|---|---|---|---|---|"]
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, caught_at in faults(args.binary):
            report = os.path.join(tmp, name + ".json")
            command = [args.binary, "run", "--suite", args.suite, "--device", args.device,
                       "--inject", name, "--quiet", "--json", report]
            if args.scoped:
                command += ["--filter", "dequant.*" if caught_at.startswith("/gptq/") else "[!d]*"]
            start = time.monotonic()
            run, failing, cases_run = run_fault(command + (["--fail-fast"] if args.fail_fast else []),
                                                report)
            hits = [p for p in failing if caught_at in p]
            if args.fail_fast and not (run.returncode == 1 and hits):
                run, failing, cases_run = run_fault(command, report)
                hits = [p for p in failing if caught_at in p]
            seconds = time.monotonic() - start
            caught = run.returncode == 1 and bool(hits)
            missed += 0 if caught else 1
            lines.append(f"| {name} | {run.returncode} | {cases_run} | {len(failing)} | "
                         f"{'yes' if caught else 'NO'} | {hits[0] if hits else '-'} | {seconds:.0f} |")
            print(lines[-1], flush=True)
    how = "".join(f" {flag}" for flag, on in (("--fail-fast", args.fail_fast), ("--scoped", args.scoped)) if on)
    summary = (f"{len(lines) - 2 - missed} of {len(lines) - 2} faults caught by suite {args.suite} "
               f"on {args.device}{how}")
    print(summary)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n\n" + summary + "\n")
    return 0 if missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
