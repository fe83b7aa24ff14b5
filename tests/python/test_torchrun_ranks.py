"""gradscope run under torchrun, one process per rank (CTest torchrun_ranks; docs/distributed.md).

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
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--no-python"]
FAULT = "lora-B-overwritten-by-grad"
LAUNCH = dict(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
              MASTER_PORT="1")


def run(cmd: List[str], env: Optional[Mapping[str, str]] = None,
        timeout: float = 600) -> Tuple[int, str]:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def tail(out: str) -> str:
    return "\n" + out[-4000:]


@pytest.fixture(scope="module")
def lora_w(cases_dir: str) -> str:
    return os.path.join(cases_dir, "smoke", "lora_w.toml")


def test_the_fault_exists(gradscope_bin: str) -> None:
    faults = run([gradscope_bin, "faults"])[1]
    assert FAULT in faults, f"the fault {FAULT} exists" + tail(faults)


def test_a_fault_under_torchrun_fails_the_ranks_with_1(gradscope_bin: str) -> None:
    code, out = run(TORCHRUN + ["--nproc-per-node", "2", gradscope_bin, "run", "--suite", "fsdp",
                                "--device", "cpu", "--quiet", "--inject", FAULT])
    # (torchrun stops the other worker once one has exited non-zero: its code may be -15)
    assert code != 0 and "exitcode  : 1" in out and "exitcode  : 2" not in out, \
        "the ranks exit 1 with the fault" + tail(out)
    assert " failed" in out and "ran on 2 processes" in out, \
        "rank 0 reports the failures" + tail(out)


def test_one_process_and_only_two_rank_cases_exits_2(gradscope_bin: str) -> None:
    code, out = run(TORCHRUN + ["--nproc-per-node", "1", gradscope_bin, "run", "--suite", "fsdp",
                                "--device", "cpu", "--filter", "*w2*"])
    assert code != 0 and "exitcode  : 2" in out, "the rank exits 2" + tail(out)
    assert "no selected case runs with WORLD_SIZE=1" in out, "and says why" + tail(out)


@pytest.mark.parametrize("change, message", [
    ({"RANK": "5"}, "RANK=5: expected an integer in [0, WORLD_SIZE - 1 = 1]"),
    ({"MASTER_PORT": None}, "MASTER_PORT is not set"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE=two: expected a positive integer"),
], ids=["rank-out-of-range", "no-master-port", "world-size-not-a-number"])
def test_a_launch_described_wrongly_exits_2(gradscope_bin: str, lora_w: str,
                                            change: Dict[str, Optional[str]],
                                            message: str) -> None:
    merged: Dict[str, Optional[str]] = {**os.environ, **LAUNCH, **change}
    env = {k: v for k, v in merged.items() if v is not None}
    code, out = run([gradscope_bin, "run", lora_w], env=env, timeout=60)
    assert code == 2 and message in out, f"{change}: exit 2 naming the variable" + tail(out)


def test_dump_under_a_launch_is_refused(gradscope_bin: str, lora_w: str) -> None:
    code, out = run([gradscope_bin, "run", lora_w, "--dump", os.devnull + ".h5"],
                    env=dict(os.environ, **LAUNCH), timeout=60)
    assert code == 2 and "--dump" in out and "not under torchrun" in out, \
        "--dump refused" + tail(out)


def launch_two(gradscope_bin: str, *args: str, timeout: int = 10) -> List[Any]:
    """Two ranks launched without torchrun's agent, which would stop the slower one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([gradscope_bin, "run", *args, "--dist-timeout",
                                       str(timeout)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def test_every_rank_leaves_with_the_run_s_code(gradscope_bin: str) -> None:
    procs = launch_two(gradscope_bin, "--suite", "fsdp", "--device", "cpu", "--quiet",
                       "--inject", FAULT)
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [1, 1], f"both ranks exit 1 ({codes})" + tail("\n".join(outs))


def test_a_killed_rank_stops_the_other_within_the_timeout(gradscope_bin: str) -> None:
    timeout = 10
    procs = launch_two(gradscope_bin, "--suite", "fsdp", "--device", "cpu", "--quiet",
                       timeout=timeout)
    try:
        time.sleep(0.8)  # the 24 cases take 2-4 s: rank 1 dies part way, in or between collectives
        assert procs[1].poll() is None, \
            "rank 1 still running when killed" + tail(procs[1].communicate()[0])
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        try:
            out, _ = procs[0].communicate(timeout=timeout + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still running {timeout + 20} s after rank 1 was killed")
        waited = time.monotonic() - killed
        assert procs[0].returncode == 2, f"rank 0 exits 2 (got {procs[0].returncode})" + tail(out)
        assert waited < timeout + 15, f"within the timeout (took {waited:.1f} s)" + tail(out)
        assert "rank 0:" in out or "rank(s) 1" in out, \
            "the message says where it stopped" + tail(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def test_a_spread_run_reports_as_one_process(gradscope_bin: str, cases_dir: str,
                                             tmp_path: Path) -> None:
    files = [os.path.join(cases_dir, "smoke", f) for f in ("lora_w.toml", "dequant_groups.toml",
                                                           "mlp.toml", "training.toml")]
    one, two = str(tmp_path / "one.json"), str(tmp_path / "two.json")
    code, out = run([gradscope_bin, "run", *files, "--quiet", "--json", one],
                    env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert code == 0, "one process passes" + tail(out)
    code, out = run(TORCHRUN + ["--nproc-per-node", "2", gradscope_bin, "run", *files, "--quiet",
                                "--json", two])
    assert code == 0 and "ran on 2 processes" in out, "two processes pass" + tail(out)

    def cases(path: str) -> List[Dict[str, Any]]:
        with open(path) as f:
            return [{k: v for k, v in c.items() if k not in ("seconds", "metrics")}
                    for c in json.load(f)["cases"]]
    a, b = cases(one), cases(two)
    assert len(a) > 50 and a == b, \
        f"the merged report equals the one-process report ({len(a)} and {len(b)} cases)"


def test_one_process_under_torchrun_ends_when_done(gradscope_bin: str, lora_w: str) -> None:
    # rank 0 waits for no one: --dist-timeout 100 would outlast the 60 s allowed
    code, out = run(TORCHRUN + ["--nproc-per-node", "1", gradscope_bin, "run", lora_w, "--quiet",
                                "--dist-timeout", "100"], timeout=60)
    assert code == 0 and "ran on 1 processes" in out, "one process exits 0 at once" + tail(out)
