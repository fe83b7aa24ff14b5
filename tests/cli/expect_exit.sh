#!/usr/bin/env bash
# A command-line expectation for CTest: runs COMMAND under a time bound and passes when it
# exits with CODE and its standard error matches the extended regular expression PATTERN.
# A hang is a failure (exit 124 from the bound), as is any other code or message.
#   usage: expect_exit.sh CODE PATTERN SECONDS COMMAND [ARG ...]
set -u
code=$1 pattern=$2 seconds=$3
shift 3
err=$(mktemp)
trap 'rm -f "$err"' EXIT
timeout "$seconds" "$@" >/dev/null 2>"$err"
rc=$?
if [[ $rc -ne $code ]]; then
  echo "expected exit $code, got $rc$([[ $rc -eq 124 ]] && echo " (killed after $seconds s)"): $*"
  cat "$err"
  exit 1
fi
if ! grep -Eq -- "$pattern" "$err"; then
  echo "exit $rc as expected, but standard error does not match /$pattern/: $*"
  cat "$err"
  exit 1
fi
exit 0
