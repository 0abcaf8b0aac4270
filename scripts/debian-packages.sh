#!/usr/bin/env bash
# debian-packages.sh COMMAND:PACKAGE...: install, in one apt-get run, the Debian packages whose
# command this host lacks (make's system-deps and browser-deps). apt-get waits for dpkg's lock
# (another install, unattended-upgrades) instead of failing at once.
set -euo pipefail
missing=()
for pair in "$@"; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
wait_lock=(-o DPkg::Lock::Timeout=600)
apt-get "${wait_lock[@]}" update -qq
DEBIAN_FRONTEND=noninteractive apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends \
  "${missing[@]}"
