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
# `make test` also runs each target for a few seconds (tests/test_fuzz_short.sh).
# See docs/SECURITY.md.

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 3600
FUZZ_MAX_LEN ?= 4096
FUZZ_TARGETS ?= fuzz_proto fuzz_idx fuzz_smap
FUZZ_FLAGS   ?=
FUZZ_DIR     := build/fuzz

# The targets link the library and program sources the Makefile builds from
# (libps: common/, proto/, client/; ps_worker: worker/), every one of them,
# compiled here with the fuzzer's instrumentation into one archive: a new
# source file joins the archive as it joins the programs, and the linker
# takes from it what a target needs.
FUZZ_LIB_SRCS := $(LIB_SRCS) $(WORKER_SRCS)
FUZZ_OBJS := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(FUZZ_LIB_SRCS))
FUZZ_BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -DPS_VERSION=\"$(VERSION)\" -g -O1 \
  -fno-omit-frame-pointer -fno-sanitize-recover=undefined -Wall -Wextra -Werror \
  $(INCLUDES) -Itests/fuzz $(PKG_CFLAGS) $(BLAS_CFLAGS)
FUZZ_LIBS := $(PKG_LIBS) $(BLAS_LIBS) -lz -lm -pthread

.PHONY: fuzz fuzz-build fuzz-seeds fuzz-check-cc

fuzz-check-cc:
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: needs clang with libFuzzer" \
	  "(FUZZ_CC=$(FUZZ_CC) not found; Debian: apt-get install clang libclang-rt-dev)"; exit 1; }

fuzz-build: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/%)

$(FUZZ_DIR)/obj/%.o: %.c | fuzz-check-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_BASE_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP \
	  -c -o $@ $<
$(FUZZ_DIR)/libfuzz.a: $(FUZZ_OBJS)
	rm -f $@ && ar rcs $@ $^
$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_DIR)/libfuzz.a | fuzz-check-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_BASE_CFLAGS) -fsanitize=fuzzer,address,undefined -MMD -MP -o $@ $< \
	  $(FUZZ_DIR)/libfuzz.a $(FUZZ_LIBS)

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

# the seeds come from the encoder the programs use: libps itself
$(FUZZ_DIR)/gen_seeds: tests/fuzz/gen_seeds.c $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(INCLUDES) -o $@ $< $(LIB)/libps.a $(LDLIBS)

-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)

# `make test` builds the targets where clang can build one, and
# tests/test_fuzz_short.sh runs each for a few seconds (elsewhere it says why
# it skips).
ifneq ($(filter test,$(MAKECMDGOALS)),)
  FUZZ_CAN := $(shell d=$$(mktemp -d) && \
    printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return d && n && 0; }\n' \
      >$$d/p.c && $(FUZZ_CC) -fsanitize=fuzzer $$d/p.c -o $$d/p >/dev/null 2>&1 && echo 1; \
    rm -rf $$d)
endif
test: $(if $(FUZZ_CAN),fuzz-build)
