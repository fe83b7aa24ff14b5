"""python -m gradscope.bench on the CPU at small sizes (CTest python_bench_cpu): every
implementation gets a row per configuration, a declining one is listed as unsupported, the
JSON holds what the console shows, and bad arguments exit 2 without writing the JSON.
Timing only: nothing here checks a time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

SMALL = ["--device", "cpu", "--dequant-shapes", "256x384", "--bits", "4", "3", "--models",
         "tiny", "--tokens", "64", "--repeats", "3"]
IMPLS = ["--impl", "gradscope", "--impl", "plain_py", "--impl", "peft", "--import",
         "plain_torch_impl", "--import", "gradscope.adapters.peft"]

Row = Dict[str, Any]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradscope.bench", *args], capture_output=True,
                          text=True)


def output(p: subprocess.CompletedProcess[str]) -> str:
    return f"\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"


def no_temporary_left(folder: str) -> None:
    assert not [f for f in os.listdir(folder) if f.startswith(".bench-")], "no temporary left"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Tuple[subprocess.CompletedProcess[str],
                                                            List[Row]]:
    """One run of every implementation; its process and the JSON's rows."""
    tmp = str(tmp_path_factory.mktemp("bench"))
    out = os.path.join(tmp, "bench.json")
    p = bench(*SMALL, *IMPLS, "--json", out)
    assert p.returncode == 0, f"exit 0, got {p.returncode}" + output(p)
    no_temporary_left(tmp)
    with open(out) as f:
        return p, json.load(f)["rows"]


def test_a_row_per_configuration(run: Tuple[subprocess.CompletedProcess[str], List[Row]]) -> None:
    p, rows = run
    dequant = [r for r in rows if r["bench"] == "dequantize"]
    ops = [r for r in rows if r["bench"] != "dequantize"]
    assert len(dequant) == 4 and len(ops) == 3, \
        f"4 dequant and 3 op rows, got {len(rows)}" + output(p)


def test_dequantize_rows(run: Tuple[subprocess.CompletedProcess[str], List[Row]]) -> None:
    p, rows = run
    for r in (r for r in rows if r["bench"] == "dequantize"):
        res = r["results"]
        assert res["gradscope"]["status"] == "ok" and res["gradscope"]["ms"] > 0, \
            f"gradscope timed in {r}" + output(p)
        assert res["peft"] == {"status": "unsupported",
                               "message": "no operator peft::dequantize"}, \
            f"peft has no dequantize: {res['peft']}" + output(p)
        if r["bits"] == 3:  # plain_py declines 3 bits
            assert res["plain_py"]["status"] == "unsupported", f"3-bit declined: {res}" + output(p)
        else:
            assert res["plain_py"]["equals_gradscope"] is True, \
                f"same words, same result: {res}" + output(p)
            assert r["gradscope_time_over_best_peer"] == \
                res["gradscope"]["ms"] / res["plain_py"]["ms"], \
                f"ratio to the best peer: {r}" + output(p)


def test_op_rows(run: Tuple[subprocess.CompletedProcess[str], List[Row]]) -> None:
    p, rows = run
    for r in (r for r in rows if r["bench"] != "dequantize"):
        for ns in ("gradscope", "plain_py", "peft"):
            assert r["results"][ns]["status"] == "ok", f"{ns} runs {r['bench']}: {r}" + output(p)


def test_the_console_lists_the_declined_rows(
        run: Tuple[subprocess.CompletedProcess[str], List[Row]]) -> None:
    p, _ = run
    assert "unsupported: plain_py: 3-bit" in p.stdout, \
        "the console lists the declined rows" + output(p)


@pytest.mark.parametrize("args, message", [
    (["--impl", "nowhere"], "--impl nowhere: the namespace registers none of"),
    (["--impl", "gradscope", "--import", "no_such_module_xyz"], "--import no_such_module_xyz"),
    (["--impl", "gradscope", "--dequant-shapes", "100x7"], "multiples of 32"),
    (["--impl", "gradscope", "--json", os.path.join("{tmp}", "missing", "b.json"),
      "--only", "dequant"], "missing"),
], ids=["unknown-impl", "unknown-import", "bad-shape", "json-folder-missing"])
def test_bad_arguments_exit_2_writing_nothing(tmp_path: Path, args: List[str],
                                              message: str) -> None:
    tmp = str(tmp_path)
    args = [a.format(tmp=tmp) for a in args]
    if "--json" in args:
        p = bench(*SMALL, *args)
        json_path = args[args.index("--json") + 1]
    else:
        json_path = os.path.join(tmp, "bad.json")
        p = bench(*SMALL, *args, "--json", json_path)
    assert p.returncode == 2 and message in p.stderr, \
        f"{args}: exit 2 naming {message!r}" + output(p)
    assert not os.path.exists(json_path), f"{args}: no JSON written" + output(p)
    no_temporary_left(tmp)
