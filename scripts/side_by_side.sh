#!/usr/bin/env bash
# side_by_side.sh LOGDIR NAME=COMMAND...: run each COMMAND at once, its output to LOGDIR/NAME.log
# (unbuffered: `tail -f` follows it), print each log whole as its command ends, and exit with
# the first failure's status (make test's two back-end runs, one a core).
set -uo pipefail
logs=$1
shift
mkdir -p "$logs"
declare -A names=()
for job in "$@"; do
  name=${job%%=*}
  PYTHONUNBUFFERED=1 bash -c "${job#*=}" >"$logs/$name.log" 2>&1 &
  names[$!]=$name
  echo "== ${name}: started; follow it with tail -f $logs/$name.log"
done
status=0
while [ ${#names[@]} -gt 0 ]; do
  wait -n -p done "${!names[@]}"
  code=$?
  cat "$logs/${names[$done]}.log"
  [ "$status" = 0 ] && status=$code
  unset "names[$done]"
done
exit $status
