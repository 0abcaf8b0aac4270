#!/usr/bin/env bash
# Stop the dockerd that scripts/docker-up.sh started, and only that one.
set -euo pipefail
state=${MSHIP_TEST_DOCKER_STATE:-var/dockerd}
[ -f "$state/started-by-tests" ] || exit 0
pid=$(cat "$state/started-by-tests")
kill "$pid" 2>/dev/null || true
for _ in $(seq 1 60); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.5
done
rm -f "$state/started-by-tests"
