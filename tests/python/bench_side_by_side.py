"""python -m gradscope.bench on the CPU at small sizes (CTest python_bench_cpu): every
implementation gets a row per configuration, a declining one is listed as unsupported, the
JSON holds what the console shows, and bad arguments exit 2 without writing the JSON.
Timing only: nothing here checks a time."""
import json
import os
import subprocess
import sys
import tempfile

SMALL = ["--device", "cpu", "--dequant-shapes", "256x384", "--bits", "4", "3", "--models",
         "tiny", "--tokens", "64", "--repeats", "3"]
IMPLS = ["--impl", "gradscope", "--impl", "plain_py", "--impl", "peft", "--import",
         "plain_torch_impl", "--import", "gradscope.adapters.peft"]


def bench(*args):
    return subprocess.run([sys.executable, "-m", "gradscope.bench", *args], capture_output=True,
                          text=True)


def expect(cond, what, proc=None):
    if not cond:
        detail = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}" if proc else ""
        sys.exit(f"FAILED: {what}{detail}")


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "bench.json")
    p = bench(*SMALL, *IMPLS, "--json", out)
    expect(p.returncode == 0, f"exit 0, got {p.returncode}", p)
    rows = json.load(open(out))["rows"]
    dequant = [r for r in rows if r["bench"] == "dequantize"]
    ops = [r for r in rows if r["bench"] != "dequantize"]
    expect(len(dequant) == 4 and len(ops) == 3, f"4 dequant and 3 op rows, got {len(rows)}", p)
    for r in dequant:
        res = r["results"]
        expect(res["gradscope"]["status"] == "ok" and res["gradscope"]["ms"] > 0,
               f"gradscope timed in {r}", p)
        expect(res["peft"] == {"status": "unsupported", "message": "no operator peft::dequantize"},
               f"peft has no dequantize: {res['peft']}", p)
        if r["bits"] == 3:  # plain_py declines 3 bits
            expect(res["plain_py"]["status"] == "unsupported", f"3-bit declined: {res}", p)
        else:
            expect(res["plain_py"]["equals_gradscope"] is True, f"same words, same result: {res}", p)
            expect(r["gradscope_time_over_best_peer"] ==
                   res["gradscope"]["ms"] / res["plain_py"]["ms"], f"ratio to the best peer: {r}", p)
    for r in ops:
        for ns in ("gradscope", "plain_py", "peft"):
            expect(r["results"][ns]["status"] == "ok", f"{ns} runs {r['bench']}: {r}", p)
    expect("unsupported: plain_py: 3-bit" in p.stdout, "the console lists the declined rows", p)

    bad = os.path.join(tmp, "bad.json")
    for args, message in (
        (["--impl", "nowhere"], "--impl nowhere: the namespace registers none of"),
        (["--impl", "gradscope", "--import", "no_such_module_xyz"], "--import no_such_module_xyz"),
        (["--impl", "gradscope", "--dequant-shapes", "100x7"], "multiples of 32"),
        (["--impl", "gradscope", "--json", os.path.join(tmp, "missing", "b.json"),
          "--only", "dequant"], "missing"),
    ):
        p = bench(*SMALL, *args, "--json", bad) if "--json" not in args else bench(*SMALL, *args)
        expect(p.returncode == 2 and message in p.stderr, f"{args}: exit 2 naming {message!r}", p)
        expect(not os.path.exists(bad), f"{args}: no JSON written", p)
    expect(not [f for f in os.listdir(tmp) if f.startswith(".bench-")], "no temporary left")
print("python_bench_cpu: OK")
