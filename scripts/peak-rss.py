#!/usr/bin/env python3
"""Runs a command and prints its wall time and peak resident memory after it:
peak-rss.py CMD [ARG...]. The peak is getrusage's ru_maxrss over the waited-for children,
i.e. the largest single process's peak (the command's own, unless a child of it grew more),
not a sum. Exits with the command's status. Used where /usr/bin/time may be missing (the GPU
machine's image)."""
import resource
import subprocess
import sys
import time

if len(sys.argv) < 2:
    sys.exit("usage: peak-rss.py CMD [ARG...]")
start = time.monotonic()
status = subprocess.call(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"peak RSS {usage.ru_maxrss / 2**20:.2f} GiB, wall {time.monotonic() - start:.1f} s, "
      f"user {usage.ru_utime:.1f} s, sys {usage.ru_stime:.1f} s", flush=True)
sys.exit(status)
