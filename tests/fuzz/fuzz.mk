# Fuzz targets (clang libFuzzer), included by the top-level Makefile.
#
#   make fuzz                  build every target and run each for FUZZ_SECONDS
#   make fuzz FUZZ_SECONDS=600 FUZZ_TARGETS=fuzz_idx
#   make fuzz-build            only build them (build/fuzz/<target>)
#   make fuzz-seeds            regenerate the committed seeds (tests/fuzz/corpus/)
#
# Each run starts from the committed seeds (tests/fuzz/corpus/<target>/) and
# a scratch corpus that grows between runs (build/fuzz/corpus/<target>/).  A
# crash, leak, out-of-memory or timeout stops the run; the input is copied to
# tests/fuzz/regress/<target>/ (commit it with the fix: `make test` replays
# every file there through tests/test_fuzz_regress.c) and `make fuzz` fails.
# See docs/SECURITY.md.

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_MAX_LEN ?= 4096
FUZZ_TARGETS ?= fuzz_proto fuzz_idx
FUZZ_FLAGS   ?=
FUZZ_DIR     := build/fuzz

FUZZ_PKG_CFLAGS := $(shell pkg-config --cflags msgpack zlib 2>/dev/null)
FUZZ_PKG_LIBS   := $(shell pkg-config --libs msgpack zlib 2>/dev/null || echo -lmsgpackc -lz)
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -DPS_VERSION=\"$(VERSION)\" -g -O1 \
  -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Werror $(INCLUDES) -Itests/fuzz $(FUZZ_PKG_CFLAGS)
FUZZ_LIBS := $(FUZZ_PKG_LIBS) -lm -pthread

# Every target is built from its entry file and these sources (compiled right
# here, instrumented, rather than taken from lib/).
FUZZ_SRCS := proto/ps_proto.c worker/data.c worker/rng.c common/ps_error.c common/ps_log.c \
  common/ps_opt_table.c common/ps_flags.c
FUZZ_HDRS := tests/fuzz/fuzz_checks.h proto/ps_proto.h worker/data.h worker/rng.h common/ps_error.h \
  common/ps_opt_table.h include/ps_types.h

.PHONY: fuzz fuzz-build fuzz-seeds

fuzz-build: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/%)

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRCS) $(FUZZ_HDRS)
	@mkdir -p $(@D)
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: needs clang with libFuzzer" \
	  "(FUZZ_CC=$(FUZZ_CC) not found; Debian: apt-get install clang libclang-rt-dev)"; exit 1; }
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_SRCS) $(FUZZ_LIBS)

# -timeout: one input taking 10 s is a hang.  -rss_limit_mb (and so the
# malloc limit): an input that makes the loader allocate 2 GiB is a bug.
fuzz: fuzz-build
	@set -u; failed=""; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/artifacts/$$t tests/fuzz/corpus/$$t; \
	  rm -f $(FUZZ_DIR)/artifacts/$$t/*; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS)s (log: $(FUZZ_DIR)/$$t.log)"; \
	  ./$(FUZZ_DIR)/$$t -max_len=$(FUZZ_MAX_LEN) -max_total_time=$(FUZZ_SECONDS) \
	    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_DIR)/artifacts/$$t/ $(FUZZ_FLAGS) \
	    $(FUZZ_DIR)/corpus/$$t tests/fuzz/corpus/$$t >$(FUZZ_DIR)/$$t.log 2>&1; \
	  rc=$$?; \
	  grep -E '^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+ +DONE' \
	    $(FUZZ_DIR)/$$t.log | sed "s/^/  $$t: /"; \
	  found=$$(ls $(FUZZ_DIR)/artifacts/$$t 2>/dev/null); \
	  if [ $$rc -ne 0 ] || [ -n "$$found" ]; then \
	    mkdir -p tests/fuzz/regress/$$t; \
	    for f in $$found; do cp $(FUZZ_DIR)/artifacts/$$t/$$f tests/fuzz/regress/$$t/$$f; \
	      echo "  $$t: FOUND $$f -> tests/fuzz/regress/$$t/$$f"; done; \
	    grep -E 'ERROR|SUMMARY|fuzz_[a-z]+: ' $(FUZZ_DIR)/$$t.log | head -5 | sed "s/^/  $$t: /"; \
	    failed="$$failed $$t"; \
	  fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed (see $(FUZZ_DIR)/*.log)"; exit 1; fi; \
	echo "fuzz: no crash in $(FUZZ_TARGETS)"

fuzz-seeds: $(FUZZ_DIR)/gen_seeds
	./$(FUZZ_DIR)/gen_seeds tests/fuzz/corpus

$(FUZZ_DIR)/gen_seeds: tests/fuzz/gen_seeds.c proto/ps_proto.c common/ps_error.c proto/ps_proto.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_BASE) $(INCLUDES) $(FUZZ_PKG_CFLAGS) -o $@ tests/fuzz/gen_seeds.c \
	  proto/ps_proto.c common/ps_error.c $(FUZZ_LIBS)
