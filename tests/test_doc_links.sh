#!/bin/sh
# Every relative link of the Markdown documents ([text](path) in README.md,
# docs/*.md, tests/gpu/README.md, python/README.md) names a file of this
# repository: a link that leaves it (../shared/...) is broken in every clone.
# One PASS/FAIL line.
cd "$(dirname "$0")/.." || exit 1
case=markdown_links_name_files_of_the_repository
bad=""
for doc in README.md docs/*.md tests/gpu/README.md python/README.md; do
    [ -f "$doc" ] || continue
    dir=$(dirname "$doc")
    # the targets of [text](target), without #anchors; http(s) and mailto left out
    for target in $(grep -o '\](\([^)]*\))' "$doc" | sed 's/^](//; s/)$//; s/#.*//' |
        grep -v '^[a-z][a-z]*:' | grep -v '^$'); do
        path=$dir/$target
        case "$(realpath -m "$path")" in
        "$(pwd -P)"/*) [ -e "$path" ] || bad="$bad; $doc: $target does not exist" ;;
        *) bad="$bad; $doc: $target is outside the repository" ;;
        esac
    done
done
if [ -z "$bad" ]; then echo "PASS $case"; else echo "FAIL $case: ${bad#; }"; exit 1; fi
