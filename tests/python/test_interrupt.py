"""Ctrl-C during a Python run stops it within seconds and leaves no report or dump behind:
gradscope.check() and python -m gradscope run, each sent SIGINT while its suite runs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List

import pytest

SUITE_RUN = ("import gradscope; gradscope.check(suite='smoke', json_path='r.json', "
             "dump='d.h5')")


def _interrupted(command: List[str], folder: str) -> subprocess.CompletedProcess:
    """Runs command in folder, sends SIGINT once the run is under way, returns its result and
    how long it took to end after the signal (stdout's last line)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, GRADSCOPE_CASES_DIR=os.path.join(here, "..", "..", "cases"),
               PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in
                                          os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                          if p))
    p = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    time.sleep(8)  # the interpreter, torch and the first cases
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(command, p.returncode, out,
                                       err + f"\nended {time.monotonic() - sent:.1f} s after")


@pytest.mark.parametrize("command", [
    [sys.executable, "-c", SUITE_RUN],
    [sys.executable, "-m", "gradscope", "run", "--suite", "smoke", "--json", "r.json", "--dump",
     "d.h5", "--quiet"],
], ids=["check", "python -m gradscope run"])
def test_ctrl_c_stops_the_run_and_leaves_nothing(tmp_path, command):
    r = _interrupted(command, str(tmp_path))
    seconds = float(r.stderr.rsplit("ended ", 1)[1].split()[0])
    assert "KeyboardInterrupt" in r.stderr, r.stderr
    assert r.returncode != 0, r
    assert seconds < 5, r.stderr
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
