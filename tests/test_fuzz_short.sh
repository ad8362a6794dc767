#!/bin/sh
# Every fuzz target (tests/fuzz/, docs/SECURITY.md "Fuzzing") for a few
# seconds from its committed corpus and regressions, so a target that stops
# building, or a checker that stops agreeing with the code, fails `make test`
# and not the next hour-long `make fuzz`.  Needs clang with libFuzzer;
# otherwise prints SKIP with the reason.  PS_FUZZ_SECONDS (10) per target.
set -u
SECS=${PS_FUZZ_SECONDS:-10}
FUZZ_CC=${FUZZ_CC:-clang}
TARGETS="fuzz_proto fuzz_idx fuzz_smap"
TMP=$(mktemp -d /tmp/ps_test_fuzz.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM

case_name() { echo "${1}_finds_nothing_in_${SECS}s_from_its_corpus"; }
skip() { for t in $TARGETS; do echo "SKIP $(case_name "$t"): $1"; done; exit 0; }

command -v "$FUZZ_CC" >/dev/null 2>&1 ||
    skip "no $FUZZ_CC to build the fuzz targets (Debian: apt-get install clang libclang-rt-dev)"
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return d && n && 0; }\n' \
    >"$TMP/probe.c"
"$FUZZ_CC" -fsanitize=fuzzer "$TMP/probe.c" -o "$TMP/probe" >"$TMP/probe.err" 2>&1 ||
    skip "$FUZZ_CC cannot link a libFuzzer target ($(grep -m1 -i error "$TMP/probe.err" | cut -c1-120)); Debian: apt-get install libclang-rt-dev"
# `make test` built them; a run of this script alone builds what is missing
if ! make -s --no-print-directory fuzz-build >"$TMP/build.log" 2>&1; then
    for t in $TARGETS; do
        echo "FAIL $(case_name "$t"): make fuzz-build failed: $(grep -m3 -E 'error|Error' "$TMP/build.log")"
    done
    exit 1
fi
# the table messages are in fuzz_proto's corpus (make fuzz-seeds writes them)
for m in table spull spush spushpull; do
    if [ ! -f "tests/fuzz/corpus/fuzz_proto/$m-request.bin" ]; then
        echo "FAIL $(case_name fuzz_proto): no $m seed in tests/fuzz/corpus/fuzz_proto (make fuzz-seeds)"
        exit 1
    fi
done
rc_all=0
for t in $TARGETS; do
    mkdir -p "$TMP/$t/new" "$TMP/$t/found"
    # new inputs go to a scratch directory: the committed corpus stays as it is
    ./build/fuzz/$t -max_len=4096 -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$TMP/$t/found/" "$TMP/$t/new" "tests/fuzz/corpus/$t" \
        $( [ -d "tests/fuzz/regress/$t" ] && echo "tests/fuzz/regress/$t") >"$TMP/$t.log" 2>&1
    rc=$?
    found=$(ls "$TMP/$t/found")
    runs=$(sed -n 's/^#\([0-9]*\).*DONE.*/\1/p' "$TMP/$t.log" | tail -n 1)
    if [ "$rc" -eq 0 ] && [ -z "$found" ] && [ -n "$runs" ]; then
        echo "PASS $(case_name "$t") ($runs inputs)"
        continue
    fi
    rc_all=1
    keep=build/fuzz/artifacts/$t
    mkdir -p "$keep"
    for f in $found; do cp "$TMP/$t/found/$f" "$keep/"; done
    echo "FAIL $(case_name "$t"): exit $rc; $(grep -m3 -E "^$t: |SUMMARY" "$TMP/$t.log" | tr '\n' ' ')${found:+; input(s) in $keep: $found (reproduce: build/fuzz/$t $keep/FILE; commit it to tests/fuzz/regress/$t/ with the fix)}"
    tail -n 30 "$TMP/$t.log" >&2
done
exit $rc_all
