# Helpers of the engine tests (test_ssh.sh, test_mpi.sh, test_slurm.sh; and
# test_monitoring.sh), sourced by them.  The sourcing test defines CASES (its case names, for
# skip_all) and ours() (the pids of the processes it started that are still
# running); $failed becomes 1 at the first failure.

failed=0
pass() { echo "PASS $1"; }
# fail CASE WHY [FILE]: the FAIL line, and FILE's last lines on stderr
fail() {
    echo "FAIL $1: $2"
    failed=1
    if [ -n "${3:-}" ] && [ -f "$3" ]; then
        # the periodic progress lines left out: they would push out what
        # says why (a signal's note, a warning, the launcher's lines)
        echo "---- $1: last lines of $3 but the workers' 'iter' lines" >&2
        grep -v ' iter [0-9]*/' "$3" | tail -n 40 >&2
    fi
}
# skip_all WHY: every case skipped, and the test ends
skip_all() {
    for c in $CASES; do echo "SKIP $c: skipped: $1"; done
    exit 0
}
# has FILE FIXED-STRING
has() { grep -qF -- "$2" "$1"; }
# add WHAT: append the lines of WHAT (if any) to $why
add() { [ -n "$1" ] && why="$why; $(echo "$1" | paste -sd';' -)"; }
# done_case CASE FILE: PASS, or FAIL with $why; also fails when ours()
# still finds something after 5 s
done_case() {
    no_leftovers || why="$why; left running: $(ours | head -n 3 | tr '\n' ' ')"
    if [ -z "$why" ]; then pass "$1"; else fail "$1" "${why#; }" "$2"; fi
}
# wait_for FILE REGEX SECONDS PID: until FILE has a line matching REGEX;
# gives up early when process PID has ended
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
# no_leftovers: ours() finds nothing (waits up to 5 s)
no_leftovers() {
    i=0
    while [ "$i" -lt 50 ]; do
        [ -z "$(ours)" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
# free_ports N: the first of N consecutive TCP ports free on every address
# (servers bind tcp://*:PORT), below the ephemeral range
free_ports() {
    python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randint(20000, 32000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("", p))
            socks.append(s)
        print(base)
        sys.exit(0)
    except OSError:
        pass
    finally:
        for s in socks:
            s.close()
sys.exit(1)
PY
}
# servers_stopped OUT CKPT-DIR N FLAGS...: servers 0..N-1 each printed
# 'stopped:' after 'stop requested', and their last checkpoint holds every
# update they had applied: $SERVER (ps_server) restarted with --restore from
# a copy of CKPT-DIR (FLAGS: what they ran with besides --bind, --rank,
# --num-servers) restores as many updates as its 'stopped:' line counted,
# and stops at once (--exit-on-stdin-eof).  Prints what is wrong.
servers_stopped() {
    _out=$1 _dir=$2 _n=$3
    shift 3
    _got=$(grep -c 'ps_server\[[0-9]*\] info .*stopped: ' "$_out")
    [ "$_got" -eq "$_n" ] || echo "$_got 'stopped:' lines, expected $_n"
    rm -rf "$_dir.check"
    cp -r "$_dir" "$_dir.check" 2>/dev/null || { echo "no checkpoint directory $_dir"; return; }
    _r=0
    while [ "$_r" -lt "$_n" ]; do
        _stopped=$(awk -v r="$_r" 'index($0, "ps_server[" r "] ") && /stop requested/ { s = 1 }
            s && index($0, "ps_server[" r "] ") && / stopped: / {
                match($0, /[0-9]+ updates/); print substr($0, RSTART, RLENGTH) }' "$_out")
        _restored=$(timeout 30 "$SERVER" --bind "ipc://$_dir.check/s$_r" --rank "$_r" \
            --num-servers "$_n" --checkpoint-dir "$_dir.check" --restore --exit-on-stdin-eof \
            "$@" </dev/null 2>&1 | sed -n 's/.* info .*: restored .*, \([0-9]* updates\), .*/\1/p')
        if [ -z "$_stopped" ]; then
            echo "server $_r printed no 'stopped:' line after 'stop requested'"
        elif [ "$_stopped" != "$_restored" ]; then
            echo "server $_r stopped after $_stopped but its last checkpoint restores ${_restored:-nothing}"
        fi
        _r=$((_r + 1))
    done
    rm -rf "$_dir.check"
}
# summaries OUT N: workers 0..N-1 printed their summary; prints what is wrong
summaries() {
    r=0
    while [ "$r" -lt "$2" ]; do
        grep -q "ps_worker\[$r\] info .*summary: " "$1" || echo "no summary from worker $r"
        r=$((r + 1))
    done
}
