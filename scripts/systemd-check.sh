#!/usr/bin/env bash
# Run systemd/gpumon.service under a real systemd on a machine where systemd is not PID 1 (a CI
# box, a container with CAP_SYS_ADMIN): systemd becomes PID 1 of new PID, mount and UTS
# namespaces, with its own /run, /tmp and /var/tmp, and starts only gpumon (fake backend).
#
#   sudo scripts/systemd-check.sh
#
# Checks: Type=notify reaches "active" with gpumon's status line; it runs as a DynamicUser with
# no capabilities, NoNewPrivileges and a seccomp filter; StateDirectory is created and owned by
# it; the watchdog is fed (same PID past WatchdogSec); reload keeps the PID; stop is clean and
# fast; SIGKILL is restarted; a stopped (hung) process is killed by the watchdog and restarted;
# exit 2 (bad configuration) is not restarted. Leaves nothing behind but the log in $OUT.
#
# Differences from a real install, on purpose: no ordering after network-online.target
# (nothing here manages the network) and DefaultDependencies=no (sysinit.target would run
# systemd-tmpfiles, which empties the real /tmp); ExecStart runs the fake backend.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-/tmp/gpumon-systemd-check}
VENV=/opt/gpumon-systemd-check
PORT=${PORT:-10489}
mkdir -p "$OUT"
[ "$(id -u)" = 0 ] || { echo "needs root (systemd as PID 1 of a namespace)"; exit 2; }
[ -x /lib/systemd/systemd ] || { echo "no /lib/systemd/systemd"; exit 2; }

# a venv outside /home, /root and /tmp: ProtectHome=yes and PrivateTmp=yes hide those
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "$REPO" >"$OUT/pip.log" 2>&1

boot=$(mktemp /run/gpumon-systemd-boot.XXXXXX)
cat >"$boot" <<EOF
#!/bin/bash
set -e
mount --make-rprivate /
for d in /run /tmp /var/tmp; do mount -t tmpfs tmpfs \$d; done
mkdir -p /run/systemd/system/gpumon.service.d
sed -e '/^After=network-online/d' -e '/^Wants=network-online/d' "$REPO/systemd/gpumon.service" \
  >/run/systemd/system/gpumon.service
printf '[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=\nExecStart=$VENV/bin/gpumon run --backend fake --listen 127.0.0.1:$PORT\n' \
  >/run/systemd/system/gpumon.service.d/check.conf
printf '[Unit]\nDescription=only gpumon\nDefaultDependencies=no\nWants=gpumon.service\n' \
  >/run/systemd/system/gpumon-check.target
exec /lib/systemd/systemd --system --unit=gpumon-check.target --log-level=warning
EOF
chmod +x "$boot"
setsid unshare --pid --fork --mount --uts --mount-proc "$boot" >"$OUT/systemd-console.log" 2>&1 </dev/null &
sleep 1
PID1=""
for _ in $(seq 50); do
  PID1=$(pgrep -f -n "systemd --system --unit=gpumon-check.target" || true)
  [ -n "$PID1" ] && break
  sleep 0.2
done
[ -n "$PID1" ] || { echo "systemd did not start; see $OUT/systemd-console.log"; exit 1; }
in_ns() { nsenter -t "$PID1" -m -p -u "$@"; }
cleanup() {
  in_ns systemctl stop gpumon >/dev/null 2>&1 || true
  kill -9 "$PID1" 2>/dev/null || true
  rm -rf /var/lib/private/gpumon /var/lib/gpumon "$VENV" "$boot"
  rmdir /var/lib/private 2>/dev/null || true
}
trap cleanup EXIT

failures=0
check() {  # check WHAT CONDITION...
  local what=$1; shift
  if "$@"; then echo "ok    $what"; else echo "FAIL  $what"; failures=$((failures + 1)); fi
}
prop() { in_ns systemctl show gpumon -p "$1" --value; }
wait_active() {
  for _ in $(seq 100); do [ "$(prop ActiveState)" = active ] && return 0; sleep 0.2; done
  return 1
}

check "Type=notify: active with gpumon's status line" wait_active
in_ns systemctl status gpumon --no-pager >"$OUT/status.txt" 2>&1 || true
echo "      status: $(prop StatusText)"
check "/metrics answers" curl -sf -o "$OUT/metrics.txt" "http://127.0.0.1:$PORT/metrics"
main=$(prop MainPID)
in_ns grep -E "^(Uid|CapEff|NoNewPrivs|Seccomp):" "/proc/$main/status" >"$OUT/proc-status.txt"
check "DynamicUser: not root" test "$(awk '/^Uid:/ {print $2}' "$OUT/proc-status.txt")" != 0
check "no capabilities" grep -q '^CapEff:[[:space:]]*0000000000000000' "$OUT/proc-status.txt"
check "NoNewPrivileges" grep -q '^NoNewPrivs:[[:space:]]*1' "$OUT/proc-status.txt"
check "seccomp filter (SystemCallFilter)" grep -q '^Seccomp:[[:space:]]*2' "$OUT/proc-status.txt"
check "StateDirectory owned by the dynamic user" \
  test "$(stat -c %u /var/lib/private/gpumon)" = "$(awk '/^Uid:/ {print $2}' "$OUT/proc-status.txt")"
sleep 35
check "watchdog fed: same PID after WatchdogSec (30 s), no restart" \
  test "$(prop MainPID)" = "$main" -a "$(prop NRestarts)" = 0
in_ns systemctl reload gpumon
sleep 2
check "reload (SIGHUP) keeps the process" test "$(prop MainPID)" = "$main" -a "$(prop ActiveState)" = active
start=$(date +%s%N)
in_ns systemctl stop gpumon
stop_ms=$((($(date +%s%N) - start) / 1000000))
check "stop: clean exit 0 in ${stop_ms} ms" test "$(prop ExecMainStatus)" = 0 -a "$stop_ms" -lt 5000
in_ns systemctl start gpumon
wait_active
in_ns kill -9 "$(prop MainPID)"
sleep 7
check "SIGKILL: restarted after RestartSec" test "$(prop NRestarts)" = 1 -a "$(prop ActiveState)" = active
in_ns kill -STOP "$(prop MainPID)"
sleep 40
check "hung (SIGSTOP): killed by the watchdog and restarted" test "$(prop NRestarts)" = 2 -a "$(prop ActiveState)" = active
in_ns systemctl stop gpumon
in_ns bash -c "printf '[Service]\nExecStart=\nExecStart=$VENV/bin/gpumon run --backend fake --listen 127.0.0.1:99999\n' \
  >/run/systemd/system/gpumon.service.d/zz-bad.conf && systemctl daemon-reload && systemctl reset-failed gpumon"
in_ns systemctl start gpumon 2>/dev/null || true
sleep 7
check "exit 2 (bad configuration): failed, not restarted" \
  test "$(prop ExecMainStatus)" = 2 -a "$(prop ActiveState)" = failed -a "$(prop NRestarts)" = 0
in_ns /lib/systemd/systemd --version | head -1 | sed 's/^/      /'
echo "failures: $failures (logs in $OUT)"
[ "$failures" = 0 ]
