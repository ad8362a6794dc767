#!/bin/sh
# ps_launch --hostfile over ssh, for real: an sshd this test starts on
# 127.0.0.1 and 127.0.0.2 (its own host key, config, authorized key and a
# free port; stopped by PID), a two-line hostfile (a server and a worker on
# 127.0.0.1, a worker on 127.0.0.2), and four endings: a normal finish, a
# remote worker killed with SIGKILL, Ctrl-C (SIGINT to ps_launch), and
# ps_launch itself killed with SIGKILL (its connections drop).  After
# each, no ps_ process of this test is left on either "host" (every one has
# the temp dir in its argv), and the next case binds the same server port.
# Prints one PASS/FAIL/SKIP line per case; SKIP with the reason where sshd
# cannot run here.
#
#   PS_BIN_DIR   where ps_launch, ps_server, ps_worker are (default bin)
#   PS_SSHD      the sshd program (default: sshd in PATH, else /usr/sbin/sshd)
#   PS_TEST_KEEP keep the temp dir
set -u
BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$(pwd -P)/bin
LAUNCH=$BIN/ps_launch
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_ssh.XXXXXX") || exit 1
CASES="ssh_normal_finish ssh_remote_worker_killed ssh_sigint ssh_launcher_killed"
SSHD_PID=""
SERVER=$BIN/ps_server
. "$(dirname "$0")/engine_lib.sh"

# our processes: ps_launch, the ssh commands, the remote wrappers and the
# programs all have $T in their argv (sshd's own argv does not match)
ours() { pgrep -f "ps_(launch|server|worker).*$T"; }
cleanup() {
    pids=$(ours)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    if [ -n "$SSHD_PID" ]; then
        kill "$SSHD_PID" 2>/dev/null
        i=0
        while kill -0 "$SSHD_PID" 2>/dev/null && [ "$i" -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$SSHD_PID" 2>/dev/null
    fi
    [ -n "${PS_TEST_KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# ---------------------------------------------------------------- sshd
[ -x "$LAUNCH" ] && [ -x "$BIN/ps_server" ] && [ -x "$BIN/ps_worker" ] ||
    skip_all "ps_launch, ps_server or ps_worker not built in $BIN"
SSHD=${PS_SSHD:-$(command -v sshd 2>/dev/null || echo /usr/sbin/sshd)}
[ -x "$SSHD" ] || skip_all "no sshd (Debian: openssh-server)"
for p in ssh ssh-keygen python3; do
    command -v $p >/dev/null 2>&1 || skip_all "no $p"
done
# sshd refuses to start without its privilege separation directory, which
# the system's service creates at boot; make it as that would
if [ ! -d /run/sshd ]; then
    if [ "$(id -u)" -eq 0 ]; then
        mkdir -p /run/sshd && chmod 755 /run/sshd
    else
        skip_all "/run/sshd is missing and only root can create it"
    fi
fi
ssh-keygen -q -t ed25519 -N '' -f "$T/host_key" &&
    ssh-keygen -q -t ed25519 -N '' -f "$T/user_key" &&
    cp "$T/user_key.pub" "$T/authorized_keys" || skip_all "ssh-keygen failed"
PORT=$(free_ports 1) && BASE=$(free_ports 1) || skip_all "no free port on 127.0.0.1"
cat >"$T/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
HostKey $T/host_key
PidFile $T/sshd.pid
AuthorizedKeysFile $T/authorized_keys
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
PrintMotd no
MaxStartups 30
LogLevel ERROR
EOF
# the port is not here on purpose: --ssh-opt gives it
cat >"$T/ssh_config" <<EOF
Host *
  IdentityFile $T/user_key
  IdentitiesOnly yes
  UserKnownHostsFile $T/known_hosts
  StrictHostKeyChecking no
  LogLevel ERROR
  ConnectTimeout 10
EOF
"$SSHD" -t -f "$T/sshd_config" >"$T/sshd.log" 2>&1 ||
    skip_all "sshd refuses the test's config: $(tail -n 1 "$T/sshd.log")"
"$SSHD" -D -e -f "$T/sshd_config" >>"$T/sshd.log" 2>&1 &
SSHD_PID=$!
export PS_SSH="ssh -F $T/ssh_config"
up=""
for i in $(seq 1 50); do
    kill -0 "$SSHD_PID" 2>/dev/null || skip_all "sshd exited: $(tail -n 1 "$T/sshd.log")"
    if timeout 10 $PS_SSH -p "$PORT" -o BatchMode=yes 127.0.0.2 true 2>"$T/login.err"; then
        up=1
        break
    fi
    sleep 0.2
done
[ -n "$up" ] || skip_all "sshd runs but refused the login: $(tail -n 1 "$T/login.err")"
echo "# sshd (pid $SSHD_PID) on 127.0.0.1 and 127.0.0.2 port $PORT; servers on port $BASE"

# ---------------------------------------------------------------- the cases
printf '127.0.0.1 servers=1 workers=1\n127.0.0.2 workers=1\n' >"$T/hosts"

# launch MODE OUT WORKER-FLAGS...: ps_launch over ssh in the background; $lpid
# is the timeout wrapping it
launch() {
    mode=$1 out=$2
    shift 2
    timeout 90 "$LAUNCH" --hostfile "$T/hosts" --ssh-opt "-p $PORT" --base-port "$BASE" \
        --mode "$mode" --server-arg --checkpoint-dir --server-arg "$T/ckpt-$mode" \
        -- --model mlp:784-64-10 --batch 32 --data synthetic:4096 --log-csv "$T/w{rank}.csv" \
        "$@" >"$out" 2>&1 &
    lpid=$!
}

# training OUT: an async run that trains until stopped, once both workers
# are in their loop (0), or 1 with why set and the run stopped
training() {
    launch async "$1" --epochs 100000 --log-every 20
    wait_for "$1" '^\[worker 1\] .* iter ' 60 "$lpid" &&
        wait_for "$1" '^\[worker 0\] .* iter ' 30 "$lpid" && return 0
    why="the workers did not start training ($(grep '^ps_launch: ' "$1" | tail -n 1))"
    kill -TERM "$(pgrep -P "$lpid")" 2>/dev/null
    wait "$lpid"
    return 1
}

case=ssh_run_finishes_with_a_summary_and_its_server_checkpoints_the_last_update
why=""
out=$T/finish.out
launch sync "$out" --steps 60 --log-every 30
wait "$lpid"
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc ($(grep '^ps_launch: ' "$out" | tail -n 1))"
add "$(summaries "$out" 2)"
add "$(servers_stopped "$out" "$T/ckpt-sync" 1 --num-workers 2 --mode sync)"
grep -q '^ps_launch: done in .*2 workers finished (mode sync), 1 server stopped' "$out" ||
    why="$why; no closing summary line"
has "$out" "warning" && why="$why; $(grep -m1 warning "$out")"
done_case $case "$out"

# a worker killed on its host: reported with its signal (not ssh's 255),
# the others stop at once (no SIGKILL needed), the server cleanly
case=ssh_a_killed_remote_worker_is_named_with_its_signal_and_the_rest_stop
why=""
out=$T/kill.out
if training "$out"; then
    wpid=$(pgrep -f "^[^ ]*ps_worker .*$T/w1\.csv" | head -n 1)
    [ -n "$wpid" ] && kill -9 "$wpid"
    [ -n "$wpid" ] || kill -TERM "$(pgrep -P "$lpid")"
    wait "$lpid"
    rc=$?
    [ -n "$wpid" ] || why="no remote ps_worker for rank 1 found"
    [ "$rc" -eq 1 ] || why="$why; exit status $rc, expected 1"
    grep -Eq '^ps_launch: worker 1 \(pid [0-9]+, ssh to 127\.0\.0\.2\) was killed by signal 9 \(SIGKILL\); stopping the others$' \
        "$out" || why="$why; no line saying worker 1 on 127.0.0.2 was killed by signal 9"
    has "$out" "sending SIGKILL" && why="$why; $(grep -m1 'sending SIGKILL' "$out")"
    add "$(servers_stopped "$out" "$T/ckpt-async" 1 --num-workers 2 --mode async)"
fi
done_case $case "$out"

case=ssh_sigint_reaches_every_remote_process_without_sigkill
why=""
out=$T/int.out
rm -rf "$T/ckpt-async"
if training "$out"; then
    kill -INT "$(pgrep -P "$lpid")"
    wait "$lpid"
    rc=$?
    [ "$rc" -eq 130 ] || why="exit status $rc, expected 130"
    has "$out" "ps_launch: got SIGINT; sending SIGINT to the 3 running processes" ||
        why="$why; no line saying SIGINT was forwarded"
    has "$out" "sending SIGKILL" && why="$why; $(grep -m1 'sending SIGKILL' "$out")"
    add "$(servers_stopped "$out" "$T/ckpt-async" 1 --num-workers 2 --mode async)"
fi
done_case $case "$out"

# ps_launch killed outright: its ssh processes get SIGTERM (they ask the
# kernel for it), the connections drop, and each remote wrapper stops its
# program; the server, its stdin gone, stops too
case=ssh_a_killed_launcher_leaves_no_remote_process
why=""
out=$T/kill9.out
if training "$out"; then
    kill -9 "$(pgrep -P "$lpid")"
    wait "$lpid"
    i=0
    while [ -n "$(ours)" ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
fi
done_case $case "$out"

exit $failed
