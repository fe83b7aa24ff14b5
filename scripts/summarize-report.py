#!/usr/bin/env python3
"""Prints the ratio-rule rows and metrics of selected cases of a gradscope JSON report.

Usage: summarize-report.py REPORT.json [ID_SUBSTRING ...]
"""
import json
import sys


def main() -> int:
    report = json.load(open(sys.argv[1]))
    wanted = sys.argv[2:]
    print(report["environment"], report["summary"])
    for case in report["cases"]:
        if wanted and not any(w in case["id"] for w in wanted):
            continue
        print(f"{case['status'].upper()} {case['id']}")
        for check in case["checks"]:
            base = check["baseline_max_abs"]
            if base is None:
                continue
            name = check["path"][len(case["id"]) + 1:]
            ratio = check["max_abs"] / base if base else float("inf")
            print(f"  {name:42s} err(prod) {check['max_abs']:.3g}  err(base) {base:.3g}  "
                  f"ratio {ratio:.2f}  limit {check['limit']:.3g}  {check['status']}")
        for name, value in case.get("metrics", {}).items():
            print(f"  {name} {value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
