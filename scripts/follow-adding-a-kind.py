#!/usr/bin/env python3
"""Follows docs/architecture.md "Adding a kind" on this checkout, step by step as written:
writes the kind and its case file from the doc's code blocks, registers and builds it, runs its
cases, the fault the doc names, and a sampled sweep of it; then restores the tree.

Usage: python3 scripts/follow-adding-a-kind.py [build-dir]   (default: build)
Exit 0 when every step did what the doc says it does. Touches tracked files while it runs:
do not run it beside another build.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / (sys.argv[1] if len(sys.argv) > 1 else "build")


def section() -> str:
    text = (ROOT / "docs/architecture.md").read_text()
    start = text.index("## Adding a kind")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def blocks(doc: str, lang: str) -> list[str]:
    out = []
    for m in re.finditer(r"```" + lang + r"\n(.*?)```", doc, re.S):
        out.append("\n".join(line[3:] if line.startswith("   ") else line
                             for line in m.group(1).splitlines()) + "\n")
    return out


def run(cmd: list[str], expect: int | None = 0) -> str:
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = p.stdout + p.stderr
    if expect is not None and p.returncode != expect:
        print(out[-4000:])
        raise SystemExit(f"exit {p.returncode}, expected {expect}: {' '.join(cmd)}")
    return out


def edit(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"{path}: the doc's anchor {old!r} is not there")
    path.write_text(text.replace(old, new, 1))


def main() -> None:
    doc = section()
    kind_file = ROOT / re.search(r"in a new file `(harness/kinds/\w+\.cpp)`", doc).group(1)
    case_file = ROOT / re.search(r"a case file, e\.g\. `(cases/[\w/]+\.toml)`", doc).group(1)
    kind = re.search(r'kind = "(\w+)"', blocks(doc, "toml")[0]).group(1)
    tracked = ["harness/kinds/kind_decls.h", "harness/catalog/kind_registry.cpp",
               "harness/CMakeLists.txt"]
    if run(["git", "status", "--porcelain", "--"] + tracked).strip():
        raise SystemExit("uncommitted changes in " + ", ".join(tracked))
    try:
        # 1. Declare it.
        kind_file.write_text(blocks(doc, "cpp")[0])
        # 2. Register it.
        edit(ROOT / tracked[0], "KindDecl fsdp_kind();", f"KindDecl fsdp_kind();\nKindDecl {kind}_kind();")
        edit(ROOT / tracked[1], "fsdp_kind}", f"fsdp_kind, {kind}_kind}}")
        # 3. Build it (in gradscope_kinds and the single_ops unity group).
        cmake = ROOT / tracked[2]
        text = cmake.read_text()
        if text.count("kinds/lora_w_kind.cpp") != 2:
            raise SystemExit("harness/CMakeLists.txt: lora_w_kind.cpp not in the sources and the group")
        cmake.write_text(text.replace("kinds/lora_w_kind.cpp",
                                      f"kinds/lora_w_kind.cpp kinds/{kind}_kind.cpp"))
        # 4. Give it cases.
        case_file.write_text(blocks(doc, "toml")[0])
        run(["cmake", "--build", str(BUILD), "--target", "gradscope"])
        cli = str(BUILD / "gradscope")
        m = re.search(r"`build/gradscope run [^`]+` runs (\w+) cases", doc)
        want = {"six": 6, "four": 4, "eight": 8}[m.group(1)]
        out = run([cli, "run", str(case_file)])
        if f"{want} passed, 0 failed" not in out:
            raise SystemExit(f"expected {want} passing cases:\n{out[-2000:]}")
        fault = re.search(r"--inject ([\w-]+)", doc).group(1)
        path = re.search(r"fails\s+them on `([\w/.]+)`", doc).group(1)
        out = run([cli, "run", str(case_file), "--inject", fault], expect=1)
        if f"0 passed, {want} failed" not in out or path not in out:
            raise SystemExit(f"expected {want} cases failing on {path}:\n{out[-2000:]}")
        out = run([cli, "sample", "--kinds", kind, "--count", "12", "--seed", "3"])
        if not re.search(r"12 cases run \(\w+ 12\): \d+ passed, 0 false alarms", out):
            raise SystemExit(f"expected 12 sampled cases and no false alarm:\n{out[-2000:]}")
        print(f"followed: kind {kind} built, {want} cases passed, --inject {fault} failed them "
              f"on {path}, 12 sampled cases without a false alarm")
    finally:
        run(["git", "checkout", "--"] + tracked, expect=None)
        kind_file.unlink(missing_ok=True)
        case_file.unlink(missing_ok=True)
        run(["cmake", "--build", str(BUILD), "--target", "gradscope"], expect=None)


if __name__ == "__main__":
    main()
