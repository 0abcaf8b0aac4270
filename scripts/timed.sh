#!/usr/bin/env bash
# timed.sh NAME COMMAND...: run COMMAND, then say how long it took (make test's phases).
set -uo pipefail
name=$1
shift
start=$(date +%s)
"$@"
status=$?
echo "== ${name}: $(($(date +%s) - start)) s (exit ${status})"
exit $status
