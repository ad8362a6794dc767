#!/bin/sh
# profile_transport: where the CPU goes on the push-pull path, ours against the
# raw ZeroMQ baseline.  Runs transport_bench for one row (ipc, 1 server x 1
# client, push-pull; PROFILE_SIZE, default 16M) under `perf record` (following
# the bench's children: the ps_server, the raw server and the clients), and
# sorts every sample of those processes into a few categories.  Prints a
# markdown table; prints a note and exits 0 when perf cannot record.
#   BUILD (build)  PS_BIN_DIR (bin)  PROFILE_SIZE (16M)  PROFILE_TIME (3)
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
export PS_BIN_DIR=${PS_BIN_DIR:-bin}
SIZE=${PROFILE_SIZE:-16M}
T=${PROFILE_TIME:-3}
TB=$BUILD/bench/transport_bench
if ! command -v perf >/dev/null 2>&1; then
    echo "(perf is not installed: no profile)"
    exit 0
fi
if [ ! -x "$TB" ]; then
    echo "(no $TB: build it with make $TB)"
    exit 0
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/ps_prof.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT

# categorize DATA: "category share" lines, plus "total N" (our samples)
categorize() {
    perf script -i "$1" -F comm,pid,tid,ip,sym 2>/dev/null | awk '
    {
        # "comm pid/tid ip sym"; comm may hold spaces (rare): find the pid/tid field
        for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+\/[0-9]+$/) break
        if (i > NF) next
        split($i, pt, "/"); pid = pt[1]; tid = pt[2]
        comm = $1; for (k = 2; k < i; k++) comm = comm " " $k
        ip = (i < NF) ? $(i + 1) : ""
        sym = (i + 1 < NF) ? $(i + 2) : "?"
        if (pid == tid) main[pid] = comm
        n++; P[n] = pid; C[n] = comm; S[n] = sym; K[n] = (ip ~ /^ffff/)
    }
    END {
        for (j = 1; j <= n; j++) {
            pid = P[j]; sym = S[j]; comm = C[j]; kern = K[j]
            role = main[pid]
            if (role != "ps_server" && role != "transport_bench") continue
            srv = (role == "ps_server")
            if (kern && sym ~ /^(_copy_to_iter|_copy_from_iter|copy_user|rep_movs|copy_page_to_iter|copy_page_from_iter|skb_copy_datagram|__skb_datagram_iter)/)
                c = "kernel: socket copies (send and receive)"
            else if (sym ~ /^ps_opt_/)
                c = "server: optimizer apply"
            else if (!kern && sym ~ /memmove|memcpy/)
                c = srv ? "server: memcpy (weights into the pull reply)" \
                        : "client: memcpy (reply frame into the caller'"'"'s buffer)"
            else if (kern && sym ~ /page_fault|clear_page|do_anonymous|handle_mm|folio|pte|lru|memcg|page_counter|alloc_pages|free_pages|free_unref|zap_|unmap_|mmap|munmap|madvise|list_del|list_add|rmqueue|_page/)
                c = srv ? "kernel: page faults, page alloc and free in ps_server" \
                        : "kernel: page faults, page alloc and free in the other processes"
            else if (!kern && sym ~ /malloc|free|_int_|calloc|realloc|arena|sysmalloc|aligned_alloc/)
                c = "libc: malloc and free"
            else if (!kern && sym ~ /msgpack|ps_proto|ps_header/)
                c = "header encode and decode (msgpack)"
            else if (kern)
                c = "kernel: other (scheduling, locks, syscalls, socket bookkeeping)"
            else if (comm ~ /^ZMQbg/)
                c = "user: ZeroMQ I/O threads, other"
            else
                c = "user: other"
            cnt[c]++; tot++
        }
        for (c in cnt) printf "%s\t%d\n", c, cnt[c]
        printf "total\t%d\n", tot
    }'
}

gp() { sed -n 's/^| ipc | 1x1 | [^|]* | pushpull | \([0-9.]*\) | \([0-9.]*\) | .*/\1 \2/p' "$1"; }

for v in ours raw; do
    if ! perf record -q -e cpu-clock -F 999 -o "$W/$v.data" -- "$TB" --time "$T" --rounds 1 \
        --transports ipc --topos 1x1 --sizes "$SIZE" --ops pushpull --variants "$v" \
        >"$W/$v.md" 2>"$W/$v.err"; then
        echo "(perf record failed: $(tail -n 1 "$W/$v.err"); no profile)"
        exit 0
    fi
    categorize "$W/$v.data" >"$W/$v.cat"
done
ours_gbs=$(gp "$W/ours.md" | awk '{ print $1 }')
raw_gbs=$(gp "$W/raw.md" | awk '{ print $2 }')
# CPU seconds per GB moved: samples / 999 Hz over (goodput x time)
awk -F'\t' -v og="$ours_gbs" -v rg="$raw_gbs" -v t="$T" '
    FNR == 1 { f++ }
    { if ($1 == "total") tot[f] = $2; else { v[f, $1] = $2; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } } }
    END {
        ob = og * t; rb = rg * t
        printf "Push-pull of %s over ipc, 1 server x 1 client, %s s per variant; goodput ours %.2f GB/s, raw %.2f GB/s.\n", size, t, og, rg
        printf "CPU time of the bench'"'"'s processes only (both cores), sampled at 999 Hz; ms of CPU per GB of payload moved.\n\n"
        printf "| where the CPU goes | ours: share | ours: CPU ms/GB | raw: share | raw: CPU ms/GB |\n"
        printf "| --- | ---: | ---: | ---: | ---: |\n"
        for (i = 1; i <= n; i++) {
            c = order[i]
            printf "| %s | %.1f%% | %.0f | %.1f%% | %.0f |\n", c, 100 * v[1, c] / tot[1],
                (ob > 0 ? v[1, c] / 999 * 1000 / ob : 0), (tot[2] ? 100 * v[2, c] / tot[2] : 0),
                (rb > 0 ? v[2, c] / 999 * 1000 / rb : 0)
        }
        printf "| **total** | 100%% | %.0f | 100%% | %.0f |\n", (ob > 0 ? tot[1] / 999 * 1000 / ob : 0),
            (rb > 0 ? tot[2] / 999 * 1000 / rb : 0)
    }' size="$SIZE" "$W/ours.cat" "$W/raw.cat"
