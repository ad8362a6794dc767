#!/bin/sh
# The one exit-status rule (docs/OPERATIONS.md "Exit statuses") for every
# program: 0 done, 1 failed while running, 2 something to fix first, 128+N a
# worker stopped by signal N.  One PASS/FAIL line per program; every process
# is bounded by `timeout -k 5` (a program that ignores the TERM, or one sent
# by the test, is killed 5 s later and its status says so: 137, not a hung
# test) and started with the temp dir in its argv, so the exit trap finds
# and kills leftovers.

BIN=$(cd "${PS_BIN_DIR:-bin}" 2>/dev/null && pwd -P) || BIN=$(pwd -P)/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_exit.XXXXXX") || exit 1
cleanup() {
    pids=$(pgrep -f "$T")
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# expect NAME WANT GOT: remembers a mismatch for the program's line
bad=""
expect() {
    [ "$2" = "$3" ] || bad="$bad $1: exit $3, expected $2;"
}
# wait_for FILE STRING SECONDS
wait_for() {
    i=0
    while [ "$i" -lt $(($3 * 10)) ]; do
        grep -qF -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
result() {
    if [ -z "$bad" ]; then echo "PASS $1"; else echo "FAIL $1:$bad"; fi
    bad=""
}

# ---- ps_server
timeout -k 5 10 "$BIN/ps_server" --bind tcp://127.0.0.1:0 --threads 0 --timeline "$T/a.json" 2>/dev/null
expect "bad flag" 2 $?
timeout -k 5 10 "$BIN/ps_server" --bind 127.0.0.1:5555 --timeline "$T/b.json" 2>/dev/null
expect "bad endpoint" 2 $?
timeout -k 5 10 "$BIN/ps_server" --bind tcp://127.0.0.1:0 --wire-dtype f64 --timeline "$T/c.json" \
    2>/dev/null
expect "bad wire-dtype" 2 $?
P=$(free_port)
timeout -k 5 30 "$BIN/ps_server" --bind "tcp://127.0.0.1:$P" --timeline "$T/s.json" >"$T/s1.log" 2>&1 &
S1=$!
wait_for "$T/s1.log" "listening" 10
timeout -k 5 10 "$BIN/ps_server" --bind "tcp://127.0.0.1:$P" --timeline "$T/s2.json" >"$T/s2.log" 2>&1
expect "port taken" 1 $?
kill -TERM "$S1"
wait "$S1"
expect "SIGTERM" 0 $?
result ps_server_exits_2_on_bad_flags_1_when_its_port_is_taken_0_on_sigterm

# ---- ps_worker
timeout -k 5 10 "$BIN/ps_worker" --servers none --batch 0 --data "$T" 2>/dev/null
expect "bad flag" 2 $?
P=$(free_port)
timeout -k 5 60 "$BIN/ps_server" --bind "tcp://127.0.0.1:$P" --mode sync --num-workers 1 \
    --timeline "$T/s3.json" >"$T/s3.log" 2>&1 &
S=$!
wait_for "$T/s3.log" "listening" 10
timeout -k 5 30 "$BIN/ps_worker" --servers "tcp://127.0.0.1:$P" --mode async --data synthetic:256 \
    --log-csv "$T/w1.csv" >"$T/w1.log" 2>&1
expect "mode mismatch" 2 $?
grep -q "mode: server has sync, worker 0 has async" "$T/w1.log" || bad="$bad no mismatch message;"
timeout -k 5 30 "$BIN/ps_worker" --servers "tcp://127.0.0.1:$P" --mode sync --data synthetic:256 \
    --wire-dtype bf16 --log-csv "$T/w3.csv" >"$T/w3.log" 2>&1
expect "wire-dtype mismatch" 2 $?
grep -q "wire-dtype: server has f32, worker 0 has bf16" "$T/w3.log" ||
    bad="$bad no wire-dtype mismatch message;"
timeout -k 5 10 "$BIN/ps_worker" --servers none --wire-dtype f64 --log-csv "$T/w4.csv" 2>/dev/null
expect "bad wire-dtype" 2 $?
timeout -k 5 60 "$BIN/ps_worker" --servers "tcp://127.0.0.1:$P" --mode sync --data synthetic:4096 \
    --epochs 1000 --batch 16 --log-every 10 --log-csv "$T/w2.csv" >"$T/w2.log" 2>&1 &
W=$!
wait_for "$T/w2.log" "iter 10/" 20
kill -TERM "$W"
wait "$W"
expect "SIGTERM" 143 $?
kill -TERM "$S"
wait "$S"
Q=$(free_port)
timeout -k 5 30 "$BIN/ps_worker" --servers "tcp://127.0.0.1:$Q" --hello-timeout 300 \
    --data synthetic:256 --log-csv "$T/w3.csv" >"$T/w3.log" 2>&1
expect "no server" 1 $?
result ps_worker_exits_2_on_bad_flags_or_a_mismatch_143_on_sigterm_1_without_a_server

# ---- ps_keygen
timeout -k 5 10 "$BIN/ps_keygen" --dir "$T/keys" --servers 0 --workers 1 2>/dev/null
expect "bad flag" 2 $?
timeout -k 5 10 "$BIN/ps_keygen" --dir "$T/keys" --servers 1 --workers 1 >/dev/null 2>&1
expect "keys made" 0 $?
timeout -k 5 10 "$BIN/ps_keygen" --dir "$T/keys" --servers 1 --workers 1 >/dev/null 2>&1
expect "keys exist" 1 $?
result ps_keygen_exits_2_on_bad_flags_0_when_done_1_when_the_keys_exist

# ---- every program's flags (the settings table's parser): an unknown flag,
# also given last, a missing value and a bad one exit 2 saying which; both
# --flag VALUE and --flag=VALUE are taken
for prog in ps_server ps_worker; do
    timeout -k 5 10 "$BIN/$prog" --bogus >/dev/null 2>"$T/flag.err"
    expect "$prog --bogus" 2 $?
    grep -qF "$prog: unknown flag '--bogus' (see --help)" "$T/flag.err" ||
        bad="$bad $prog --bogus: '$(cat "$T/flag.err")';"
    timeout -k 5 10 "$BIN/$prog" --mode >/dev/null 2>"$T/flag.err"
    expect "$prog --mode" 2 $?
    grep -qF "$prog: --mode needs a value (see --help)" "$T/flag.err" ||
        bad="$bad $prog --mode: '$(cat "$T/flag.err")';"
    timeout -k 5 10 "$BIN/$prog" --mode=bsp >/dev/null 2>"$T/flag.err"
    expect "$prog --mode=bsp" 2 $?
    grep -qF "$prog: --mode must be sync or async, got 'bsp'" "$T/flag.err" ||
        bad="$bad $prog --mode=bsp: '$(cat "$T/flag.err")';"
done
# the unknown flag last, after valid ones (it used to be taken for a flag
# missing its value)
timeout -k 5 10 "$BIN/ps_worker" --servers none --batch=8 --bogus >/dev/null 2>"$T/flag.err"
expect "ps_worker ... --bogus" 2 $?
grep -qF "ps_worker: unknown flag '--bogus' (see --help)" "$T/flag.err" ||
    bad="$bad ps_worker ... --bogus: '$(cat "$T/flag.err")';"
timeout -k 5 10 "$BIN/ps_server" --bind=tcp://127.0.0.1:0 --threads=0 >/dev/null 2>"$T/flag.err"
expect "ps_server --threads=0" 2 $?
grep -qF "ps_server: --threads must be an integer in [1, 64], got '0'" "$T/flag.err" ||
    bad="$bad ps_server --threads=0: '$(cat "$T/flag.err")';"
timeout -k 5 10 "$BIN/ps_launch" --servers=1 --workers 1 --bogus >/dev/null 2>"$T/flag.err"
expect "ps_launch --bogus" 2 $?
grep -qF "ps_launch: unknown flag '--bogus' (see --help; worker flags go after --)" \
    "$T/flag.err" || bad="$bad ps_launch --bogus: '$(cat "$T/flag.err")';"
timeout -k 5 10 "$BIN/ps_launch" --servers=1 --workers 1 --mode >/dev/null 2>"$T/flag.err"
expect "ps_launch --mode" 2 $?
grep -qF "ps_launch: --mode needs a value (see --help)" "$T/flag.err" ||
    bad="$bad ps_launch --mode: '$(cat "$T/flag.err")';"
timeout -k 5 10 "$BIN/ps_launch" --servers=1 --workers=1 --gpus=none --mode=async --dry-run -- \
    --batch=8 >"$T/plan.out" 2>/dev/null
expect "ps_launch --flag=value" 0 $?
grep -q -- "--mode async --batch=8 --device cpu" "$T/plan.out" ||
    bad="$bad ps_launch --flag=value: no worker line with them;"
result flags_of_every_program_exit_2_naming_the_flag

# ---- ps_launch (bad flags before anything starts)
timeout -k 5 10 "$BIN/ps_launch" --servers 0 --workers 1 --timeline-dir "$T/tl" -- --data "$T" 2>/dev/null
expect "bad flag" 2 $?
# a worker that exits 2 (here: a mode the servers do not share is impossible
# under ps_launch, so an unreadable --data) makes the whole run exit 2
timeout -k 5 60 "$BIN/ps_launch" --servers 1 --workers 1 --timeline-dir "$T/tl2" -- \
    --data "$T/no-such-data" >"$T/l2.log" 2>&1
expect "worker exited 2" 2 $?
result ps_launch_exits_2_on_bad_flags_or_when_a_worker_exits_2
exit 0
