#!/bin/sh
# Run every test program (build/tests/test_*) and shell test (tests/test_*.sh),
# each under a time limit, and print the closing "N passed, N failed, N skipped".
# Each program prints PASS/FAIL/SKIP lines; a program that dies without a FAIL
# line counts as one failure.
BUILD=${BUILD:-build}
# a program's time limit: 300 s, three times that under the sanitizers
# (ASan and UBSan make the Python package's cases about 2.5x slower)
LIMIT=${PS_TEST_LIMIT:-$([ "$SAN" = 1 ] && echo 900 || echo 300)}
export PS_BIN_DIR=${PS_BIN_DIR:-bin}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pass=0 fail=0 skip=0
out=$(mktemp)
start=$(date +%s)
for t in "$BUILD"/tests/test_* tests/test_*.sh; do
    [ -x "$t" ] || continue
    case "$t" in *.o|*.d) continue ;; esac
    name=$(basename "$t")
    if [ -n "$PS_TESTS" ] && ! echo " $PS_TESTS " | grep -q " $name "; then continue; fi
    t0=$(date +%s)
    timeout -k 5 "$LIMIT" "$t" >"$out" 2>"$out.err"
    rc=$?
    cat "$out"
    p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out"); s=$(grep -c '^SKIP ' "$out")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after ${LIMIT}s"; else why="exit status $rc"; fi
        echo "FAIL $name: $why"
        f=$((f + 1))
    fi
    if [ "$f" -gt 0 ] || [ "$rc" -ne 0 ]; then
        echo "---- stderr of $name (last 40 lines) ----"
        tail -n 40 "$out.err"
        echo "----"
    fi
    echo "# $name: $p passed, $f failed, $s skipped ($(( $(date +%s) - t0 ))s)"
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
rm -f "$out" "$out.err"
echo "# total time $(( $(date +%s) - start ))s"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
