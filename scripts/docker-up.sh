#!/usr/bin/env bash
# Make sure a Docker Engine answers for the tests. Where none runs, install Debian's docker.io
# if needed (root) and start dockerd; scripts/docker-down.sh stops only a daemon started here.
set -euo pipefail
state=${MSHIP_TEST_DOCKER_STATE:-var/dockerd}
answers() { timeout 10 docker info >/dev/null 2>&1; }
answers && exit 0
if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "docker-up: no Docker Engine answers, and it cannot be installed here" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
mkdir -p "$state"
setsid dockerd --pidfile "$state/dockerd.pid" >"$state/dockerd.log" 2>&1 < /dev/null &
echo $! >"$state/started-by-tests"
for _ in $(seq 1 120); do
  answers && exit 0
  sleep 0.5
done
echo "docker-up: dockerd did not come up:" >&2
tail -20 "$state/dockerd.log" >&2
exit 1
