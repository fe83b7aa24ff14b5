"""gradscope run under torchrun, one process per rank (CTest torchrun_ranks; docs/distributed.md).

Usage: torchrun_ranks.py GRADSCOPE CASES_DIR
1. A gradient fault injected into the fsdp suite on 2 processes: torchrun fails, the ranks
   exiting 1 (torchrun itself exits 1 for any failed rank; its summary lists each rank's code);
   launched without torchrun's agent, both ranks exit 1.
2. One process and only world-size-2 cases: every rank exits 2, saying why; so does a launch
   whose variables are missing or malformed, and --dump under a launch.
3. A rank killed while the fsdp suite runs (launched without torchrun, so that nothing but
   gradscope's own timeout stops the survivor): the other exits non-zero within the timeout,
   naming what it waited for.
4. Smoke files spread over 2 processes: the merged JSON report equals the one-process report
   check for check (one thread per process in both, as torchrun sets OMP_NUM_THREADS=1: the
   fp64 reference's sums are then in the same order).
5. One process under torchrun ends when its cases are done (no wait for other ranks).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

GRADSCOPE, CASES = sys.argv[1], sys.argv[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--no-python"]


def run(cmd, env=None, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def expect(cond, what, out=""):
    if not cond:
        sys.exit(f"FAILED: {what}\n{out[-4000:]}")


# 1. a gradient fault
faults = run([GRADSCOPE, "faults"])[1]
fault = "lora-B-overwritten-by-grad"
expect(fault in faults, f"the fault {fault} exists", faults)
code, out = run(TORCHRUN + ["--nproc-per-node", "2", GRADSCOPE, "run", "--suite", "fsdp",
                            "--device", "cpu", "--quiet", "--inject", fault])
# (torchrun stops the other worker once one has exited non-zero: its code may be -15 instead)
expect(code != 0 and "exitcode  : 1" in out and "exitcode  : 2" not in out,
       "the ranks exit 1 with the fault", out)
expect(" failed" in out and "ran on 2 processes" in out, "rank 0 reports the failures", out)

# 2. nothing to run with one process
code, out = run(TORCHRUN + ["--nproc-per-node", "1", GRADSCOPE, "run", "--suite", "fsdp",
                            "--device", "cpu", "--filter", "*w2*"])
expect(code != 0 and "exitcode  : 2" in out, "the rank exits 2", out)
expect("no selected case runs with WORLD_SIZE=1" in out, "and says why", out)

# ... and a launch described wrongly, or asking for what a spread run cannot do
launch = dict(os.environ, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
              MASTER_PORT="1")
lora_w = os.path.join(CASES, "smoke", "lora_w.toml")
for change, message in (({"RANK": "5"}, "RANK=5: expected an integer in [0, WORLD_SIZE - 1 = 1]"),
                        ({"MASTER_PORT": None}, "MASTER_PORT is not set"),
                        ({"WORLD_SIZE": "two"}, "WORLD_SIZE=two: expected a positive integer")):
    env = {k: v for k, v in {**launch, **change}.items() if v is not None}
    code, out = run([GRADSCOPE, "run", lora_w], env=env, timeout=60)
    expect(code == 2 and message in out, f"{change}: exit 2 naming the variable", out)
code, out = run([GRADSCOPE, "run", lora_w, "--dump", os.devnull + ".h5"], env=launch, timeout=60)
expect(code == 2 and "--dump" in out and "not under torchrun" in out, "--dump refused", out)

# every rank leaves with the run's code: launched without torchrun's agent, which would stop
# the slower one
def launch_two(*args, timeout=10):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([GRADSCOPE, "run", *args, "--dist-timeout", str(timeout)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs


procs = launch_two("--suite", "fsdp", "--device", "cpu", "--quiet", "--inject", fault)
outs = [p.communicate(timeout=300)[0] for p in procs]
expect([p.returncode for p in procs] == [1, 1], f"both ranks exit 1 "
       f"({[p.returncode for p in procs]})", "\n".join(outs))

# 3. a killed rank
timeout = 10
procs = launch_two("--suite", "fsdp", "--device", "cpu", "--quiet", timeout=timeout)
time.sleep(0.8)  # the 24 cases take 2-4 s: rank 1 dies part way, in or between collectives
if procs[1].poll() is not None:
    expect(False, "rank 1 still running when killed", procs[1].communicate()[0])
procs[1].send_signal(signal.SIGKILL)
killed = time.monotonic()
try:
    out, _ = procs[0].communicate(timeout=timeout + 20)
except subprocess.TimeoutExpired:
    procs[0].kill()
    sys.exit(f"FAILED: rank 0 still running {timeout + 20} s after rank 1 was killed")
waited = time.monotonic() - killed
expect(procs[0].returncode == 2, f"rank 0 exits 2 (got {procs[0].returncode})", out)
expect(waited < timeout + 15, f"within the timeout (took {waited:.1f} s)", out)
expect("rank 0:" in out or "rank(s) 1" in out, "the message says where it stopped", out)
procs[1].communicate()

# 4. spread equals one process
files = [os.path.join(CASES, "smoke", f) for f in ("lora_w.toml", "dequant_groups.toml",
                                                   "mlp.toml", "training.toml")]
with tempfile.TemporaryDirectory() as tmp:
    one, two = os.path.join(tmp, "one.json"), os.path.join(tmp, "two.json")
    code, out = run([GRADSCOPE, "run", *files, "--quiet", "--json", one],
                    env=dict(os.environ, OMP_NUM_THREADS="1"))
    expect(code == 0, "one process passes", out)
    code, out = run(TORCHRUN + ["--nproc-per-node", "2", GRADSCOPE, "run", *files, "--quiet",
                                "--json", two])
    expect(code == 0 and "ran on 2 processes" in out, "two processes pass", out)
    strip = lambda cases: [{k: v for k, v in c.items() if k not in ("seconds", "metrics")}
                           for c in cases]
    a, b = (strip(json.load(open(f))["cases"]) for f in (one, two))
    expect(len(a) > 50 and a == b, f"the merged report equals the one-process report "
           f"({len(a)} and {len(b)} cases)")
# 5. one process: the run ends as soon as it is done (rank 0 waits for no one)
code, out = run(TORCHRUN + ["--nproc-per-node", "1", GRADSCOPE, "run",
                            os.path.join(CASES, "smoke", "lora_w.toml"), "--quiet",
                            "--dist-timeout", "100"], timeout=60)
expect(code == 0 and "ran on 1 processes" in out, "one process exits 0 at once", out)
print("torchrun ranks: fault, no matching case, killed rank and spread report as expected")
