#!/bin/sh
# The flag tables of README.md (and docs/LAUNCH.md's of ps_launch), each
# between "<!-- flags:PROGRAM -->" and "<!-- /flags -->", are what PROGRAM
# --help-markdown prints from the settings table (common/ps_settings.h).
# One PASS/FAIL line per section, naming the first line that differs.  With
# --write (make readme-flags) it rewrites the sections instead.
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${PS_BIN_DIR:-bin}
T=$(mktemp -d "${TMPDIR:-/tmp}/ps_test_flags.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
status=0
for section in README.md:ps_server README.md:ps_worker README.md:ps_launch \
    README.md:ps_keygen README.md:ps_top docs/LAUNCH.md:ps_launch; do
    DOC=${section%%:*} prog=${section#*:}
    case=$(echo "${DOC%.md}" | tr 'A-Z/' 'a-z_')_flags_of_${prog}_are_the_settings_table
    if ! "$BIN/$prog" --help-markdown >"$T/want" 2>"$T/err"; then
        echo "FAIL $case: $BIN/$prog --help-markdown failed: $(head -n 1 "$T/err")"
        status=1
        continue
    fi
    # the table's links are written from the top of the tree: from docs/ they
    # name the file beside
    case "$DOC" in docs/*) sed -i 's#](docs/#](#g' "$T/want" ;; esac
    # the section's lines, without the markers
    awk -v p="$prog" '$0 == "<!-- /flags -->" { s = 0 } s { print } $0 == "<!-- flags:" p " -->" { s = 1; n++ }
        END { if (n != 1) exit 1 }' "$DOC" >"$T/have" ||
        { echo "FAIL $case: $DOC needs one '<!-- flags:$prog -->' ... '<!-- /flags -->' section"; status=1; continue; }
    if [ "${1:-}" = --write ]; then
        awk -v p="$prog" -v f="$T/want" '
            $0 == "<!-- flags:" p " -->" { print; while ((getline l < f) > 0) print l; s = 1; next }
            $0 == "<!-- /flags -->" { s = 0 }
            !s { print }' "$DOC" >"$T/doc" && cat "$T/doc" >"$DOC"
        echo "wrote the $prog section of $DOC"
        continue
    fi
    if cmp -s "$T/have" "$T/want"; then
        echo "PASS $case"
    else
        # the first line that differs, as the README has it and as it should be
        n=$(awk 'NR == FNR { a[FNR] = $0; next } !(FNR in a) || a[FNR] != $0 { print FNR; f = 1; exit }
                 END { if (!f) print FNR + 1 }' "$T/have" "$T/want")
        start=$(grep -n -x -F "<!-- flags:$prog -->" "$DOC" | cut -d: -f1)
        echo "FAIL $case: $DOC line $((start + n)) differs (make readme-flags rewrites it):" \
            "has '$(sed -n "${n}p" "$T/have")', the table says '$(sed -n "${n}p" "$T/want")'"
        status=1
    fi
done
exit $status
