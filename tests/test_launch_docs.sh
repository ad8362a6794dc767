#!/bin/sh
# docs/LAUNCH.md quotes the shipped job scripts: each block under a line
# "<!-- file: PATH ... -->" must equal PATH, and every script in
# examples/slurm/ and examples/mpi/ must be quoted.  One PASS/FAIL line.
set -u
DOC=docs/LAUNCH.md
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_docs.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
case=launch_docs_quote_the_job_scripts
why=""
# each quoted block into $T/N.block, its path into $T/N.path
awk -v dir="$T" '
    /^<!-- file: / { path = $3; n++; want = 1; next }
    want && /^```/ { inside = 1; want = 0; printf "%s", "" > (dir "/" n ".block"); print path > (dir "/" n ".path"); next }
    inside && /^```$/ { inside = 0; next }
    inside { print > (dir "/" n ".block") }
' "$DOC"
quoted=""
for p in "$T"/*.path; do
    [ -f "$p" ] || continue
    f=$(cat "$p")
    quoted="$quoted $f"
    if [ ! -f "$f" ]; then
        why="$why; $DOC quotes $f, which does not exist"
    elif ! cmp -s "$f" "${p%.path}.block"; then
        why="$why; $DOC's copy of $f differs: $(diff "$f" "${p%.path}.block" | head -n 3 | tr '\n' ' ')"
    fi
done
for f in examples/slurm/*.sbatch examples/mpi/*.sh; do
    [ -f "$f" ] || continue
    case " $quoted " in *" $f "*) ;; *) why="$why; $DOC does not quote $f" ;; esac
done
if [ -z "$why" ]; then echo "PASS $case"; else echo "FAIL $case: ${why#; }"; exit 1; fi
