#!/usr/bin/env python3
"""Fails when a source file includes across a forbidden boundary (docs/architecture.md).

Each room (a folder) may include only the rooms listed for it; torch-free rooms may include
no torch, ATen or c10 header. Usage: check-layering.py [ROOT] (default: the repository).
Exit 0: clean; 1: violations, one line each (file:line, the include, what the room allows).
"""
import pathlib
import re
import sys

TORCH = ("torch/", "ATen/", "c10/", "caffe2/")
# room -> (quoted-include prefixes it may use besides its own, torch allowed)
HARNESS_BASE = ("common/", "reports/", "reference/", "gradscope/", "harness/common/")
RULES = {
    "common/": ((), False),
    "reference/": ((), False),
    "reports/": (("common/",), False),
    "kernels/": (("common/", "gradscope/"), True),
    "harness/common/": (("common/", "reports/", "reference/", "gradscope/"), True),
    "harness/spec/": (HARNESS_BASE, True),
    "harness/engine/": (HARNESS_BASE + ("harness/spec/",), True),
    "harness/generate/": (HARNESS_BASE + ("harness/spec/",), True),
    "harness/verdict/": (HARNESS_BASE + ("harness/spec/",), True),
    "harness/baseline/": (HARNESS_BASE, True),
    "harness/impl/": (HARNESS_BASE, True),
    "harness/distributed/": (HARNESS_BASE, True),
    "harness/checkpoint/": (HARNESS_BASE + ("harness/spec/", "harness/generate/"), True),
    "harness/kinds/": (HARNESS_BASE + ("harness/spec/", "harness/engine/", "harness/generate/",
                                       "harness/verdict/", "harness/baseline/", "harness/impl/",
                                       "harness/distributed/", "harness/checkpoint/"), True),
    "harness/catalog/": (HARNESS_BASE + ("harness/spec/", "harness/engine/", "harness/kinds/",
                                         "harness/generate/"), True),
    "harness/cli/": (HARNESS_BASE + ("harness/",), True),
    "bench/": (HARNESS_BASE + ("harness/baseline/", "harness/checkpoint/", "harness/spec/",
                               "harness/generate/"), True),
    "python/src/": (HARNESS_BASE + ("harness/",), True),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def room_of(rel: str):
    best = None
    for room in RULES:
        if rel.startswith(room) and (best is None or len(room) > len(best)):
            best = room
    return best


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[1])
    violations = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".h", ".hpp", ".cpp", ".cu", ".cuh") or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("build", ".")) or "/third_party/" in rel:
            continue
        room = room_of(rel)
        if room is None:
            continue
        allowed, torch = RULES[room]
        # kernels' .cu files take raw pointers: no torch header (docs/building.md).
        torch = torch and path.suffix not in (".cu", ".cuh")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            header = m.group(2)
            if header.startswith(TORCH):
                if not torch:
                    violations.append(f"{rel}:{n}: includes <{header}>: {room} is torch-free")
                continue
            if m.group(1) != '"':
                continue
            own = header.startswith(room) or (room == "kernels/" and "/" not in header)
            if own or header.startswith(allowed):
                continue
            if "/" not in header and (path.parent / header).exists():
                continue  # a file beside it
            if room == "bench/" and header.endswith("_launch.h"):
                continue  # a kernel benchmark calls the raw CUDA launchers (kernels/src)
            may = ", ".join(allowed) if allowed else "nothing outside itself"
            violations.append(f"{rel}:{n}: includes \"{header}\": {room} may include {may}")
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} include(s) across a forbidden boundary (docs/architecture.md)")
        return 1
    print("layering: every include stays within its room's allowed rooms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
