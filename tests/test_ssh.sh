#!/bin/sh
# ps_launch --hostfile over ssh, for real: an sshd this test starts on
# 127.0.0.1 and 127.0.0.2 (its own host key, config, authorized key and a
# free port; stopped by PID), a two-line hostfile (a server and a worker on
# 127.0.0.1, a worker on 127.0.0.2), and three endings: a normal finish, a
# remote worker killed with SIGKILL, and Ctrl-C (SIGINT to ps_launch).  After
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
CASES="ssh_normal_finish ssh_remote_worker_killed ssh_sigint"
SSHD_PID=""
failed=0

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

pass() { echo "PASS $1"; }
fail() {
    echo "FAIL $1: $2"
    failed=1
    if [ -n "${3:-}" ] && [ -f "$3" ]; then
        echo "---- $1: last lines of $3" >&2
        tail -n 40 "$3" >&2
    fi
}
skip_all() {
    for c in $CASES; do echo "SKIP $c: skipped: $1"; done
    exit 0
}
has() { grep -qF -- "$2" "$1"; }
# wait_for FILE REGEX SECONDS PID: until FILE has a line matching REGEX
# (gives up early when PID has ended)
wait_for() {
    i=0
    while [ "$i" -lt $(($3 * 10)) ]; do
        grep -Eq -- "$2" "$1" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# nothing of ours runs any more (waits up to 5 s)
no_leftovers() {
    i=0
    while [ "$i" -lt 50 ]; do
        [ -z "$(ours)" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

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
PORT=$(free_port) && BASE=$(free_port) || skip_all "no free port on 127.0.0.1"
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

# the server stopped cleanly: its stopped: line, a checkpoint written after
# the stop was asked for, the file on disk
check_server_stop() { # out ckpt-dir
    has "$1" "[server 0] " || { echo "no server output"; return; }
    grep -q '^\[server 0\] .*stopped: ' "$1" || echo "no '[server 0] ... stopped:' line"
    awk '/^\[server 0\] .*stop requested/ { s = 1 } s && /^\[server 0\] .*checkpoint [0-9]+ written/ { c = 1 }
         END { exit !c }' "$1" || echo "no checkpoint written after 'stop requested'"
    ls "$2"/shard-0-*.ckpt >/dev/null 2>&1 || echo "no checkpoint file in $2"
}

case=ssh_normal_finish
why=""
out=$T/finish.out
launch sync "$out" --steps 60 --log-every 30
wait "$lpid"
rc=$?
[ "$rc" -eq 0 ] || why="exit status $rc ($(grep '^ps_launch: ' "$out" | tail -n 1))"
for w in 0 1; do
    grep -q "^\[worker $w\] .*summary: " "$out" || why="$why; no summary line from worker $w"
done
r=$(check_server_stop "$out" "$T/ckpt-sync")
[ -z "$r" ] || why="$why; $(echo "$r" | paste -sd';' -)"
grep -q '^ps_launch: done in .*2 workers finished (mode sync), 1 server stopped' "$out" ||
    why="$why; no closing summary line"
has "$out" "warning" && why="$why; $(grep -m1 warning "$out")"
no_leftovers || why="$why; left running: $(ours | head -n 3 | tr '\n' ' ')"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi

# a worker killed on its host: reported with its signal (not ssh's 255),
# the others stop at once (no SIGKILL needed), the server cleanly
case=ssh_remote_worker_killed
why=""
out=$T/kill.out
launch async "$out" --epochs 100000 --log-every 20
if wait_for "$out" '^\[worker 1\] .* iter ' 60 "$lpid" && wait_for "$out" '^\[worker 0\] .* iter ' 30 "$lpid"; then
    wpid=$(pgrep -f "^[^ ]*ps_worker .*$T/w1\.csv" | head -n 1)
    if [ -n "$wpid" ]; then
        kill -9 "$wpid"
        wait "$lpid"
        rc=$?
        [ "$rc" -eq 1 ] || why="exit status $rc, expected 1"
        grep -Eq '^ps_launch: worker 1 \(pid [0-9]+, ssh to 127\.0\.0\.2\) was killed by signal 9 \(SIGKILL\); stopping the others$' \
            "$out" || why="$why; no line saying worker 1 on 127.0.0.2 was killed by signal 9"
        has "$out" "sending SIGKILL" && why="$why; $(grep -m1 'sending SIGKILL' "$out")"
        r=$(check_server_stop "$out" "$T/ckpt-async")
        [ -z "$r" ] || why="$why; $(echo "$r" | paste -sd';' -)"
    else
        why="no remote ps_worker for rank 1 found"
        kill -TERM "$(pgrep -P "$lpid")" 2>/dev/null
        wait "$lpid"
    fi
else
    why="the workers did not start training ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    kill -TERM "$(pgrep -P "$lpid")" 2>/dev/null
    wait "$lpid"
fi
no_leftovers || why="$why; left running: $(ours | head -n 3 | tr '\n' ' ')"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi

case=ssh_sigint
why=""
out=$T/int.out
rm -rf "$T/ckpt-async"
launch async "$out" --epochs 100000 --log-every 20
if wait_for "$out" '^\[worker 1\] .* iter ' 60 "$lpid" && wait_for "$out" '^\[worker 0\] .* iter ' 30 "$lpid"; then
    kill -INT "$(pgrep -P "$lpid")"
    wait "$lpid"
    rc=$?
    [ "$rc" -eq 130 ] || why="exit status $rc, expected 130"
    has "$out" "ps_launch: got SIGINT; sending SIGINT to the 3 running processes" ||
        why="$why; no line saying SIGINT was forwarded"
    has "$out" "sending SIGKILL" && why="$why; $(grep -m1 'sending SIGKILL' "$out")"
    r=$(check_server_stop "$out" "$T/ckpt-async")
    [ -z "$r" ] || why="$why; $(echo "$r" | paste -sd';' -)"
else
    why="the workers did not start training ($(grep '^ps_launch: ' "$out" | tail -n 1))"
    kill -TERM "$(pgrep -P "$lpid")" 2>/dev/null
    wait "$lpid"
fi
no_leftovers || why="$why; left running: $(ours | head -n 3 | tr '\n' ' ')"
if [ -z "$why" ]; then pass $case; else fail $case "${why#; }" "$out"; fi

exit $failed
