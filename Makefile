# Parameter server build.  `make` builds bin/ and lib/; `make test` runs every
# test and ends with "N passed, N failed, N skipped".
#
#   SAN=1     build with AddressSanitizer + UndefinedBehaviorSanitizer
#   CUDA=0    never build the CUDA backend;  CUDA=1  fail if nvcc is missing
#   CUDA_HOME where the CUDA toolkit lives (default /usr/local/cuda)

VERSION   := 0.1.0
CC        ?= cc
SAN       ?= 0
CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc

PKGS      := libzmq msgpack
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

BUILD := build$(if $(filter 1,$(SAN)),-san,)
# sanitized programs and library live apart so the two builds never mix
BIN   := $(if $(filter 1,$(SAN)),$(BUILD)/bin,bin)
LIB   := $(if $(filter 1,$(SAN)),$(BUILD)/lib,lib)
# Each folder's objects see only the headers their layer may include
# (DESIGN.md "Folders"), so a wrong include fails to compile.
INC_common := -Iinclude -Icommon
INC_proto  := $(INC_common) -Iproto
INC_server := $(INC_proto) -Iserver
INC_worker := $(INC_proto) -Iworker
INC_launch := $(INC_common) -Ilaunch
INCLUDES   := -Iinclude -Icommon -Iproto -Iserver -Iworker -Ilaunch
INC := $(INCLUDES)
$(BUILD)/common/%.o: INC := $(INC_common)
$(BUILD)/proto/%.o:  INC := $(INC_proto)
$(BUILD)/server/%.o: INC := $(INC_server)
$(BUILD)/worker/%.o: INC := $(INC_worker)
$(BUILD)/launch/%.o: INC := $(INC_launch)
$(BUILD)/examples/%.o: INC := -Iinclude
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -DPS_VERSION=\"$(VERSION)\" -g -O3 \
  -Wall -Wextra -Werror -pthread -fno-strict-aliasing
ifeq ($(SAN),1)
  CFLAGS_BASE += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
                 -fno-sanitize-recover=undefined
  LDSAN := -fsanitize=address,undefined
endif
CFLAGS  := $(CFLAGS_BASE) $(PKG_CFLAGS) $(BLAS_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := $(PKG_LIBS) $(BLAS_LIBS) -lz -lm -pthread $(LDSAN)

# --- CUDA detection: build the backend when nvcc is there, say so when not.
HAVE_NVCC := $(shell test -x $(NVCC) && echo 1)
ifeq ($(CUDA),1)
  ifneq ($(HAVE_NVCC),1)
    $(error CUDA=1 but nvcc was not found at $(NVCC); set CUDA_HOME or use CUDA=0)
  endif
  BUILD_CUDA := 1
else ifeq ($(CUDA),auto)
  BUILD_CUDA := $(HAVE_NVCC)
endif
ifeq ($(BUILD_CUDA),1)
  NVCCFLAGS := -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_90,code=compute_90 -Xcompiler -Wall,-Wextra,-Werror,-fPIC \
    -Werror all-warnings $(INC_worker)
  CFLAGS += -DPS_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
  CUDA_SRCS := $(wildcard worker/*.cu)
endif

# --- sources.  Files named *_main.c hold a program's main().  libps is
# common/, proto/ and every worker/client*.c (the client library's modules).
LIB_SRCS    := $(filter-out %_main.c,$(wildcard common/*.c proto/*.c worker/client*.c))
SERVER_SRCS := $(filter-out %_main.c,$(wildcard server/*.c))
WORKER_SRCS := $(filter-out %_main.c worker/client%.c,$(wildcard worker/*.c))
# ps_launch: the plan and the supervisor (launch/ may include only common/
# and include/, which its objects' include path enforces)
LAUNCH_SRCS := $(filter-out %_main.c,$(wildcard launch/*.c))
TEST_SRCS   := $(wildcard tests/test_*.c)
# examples/*.c: programs on the public header and lib/libps.a alone, built
# into $(BUILD)/examples/ (tests/test_example_*.c run them)
EXAMPLE_SRCS := $(wildcard examples/*.c)
BENCH_SRCS  := $(wildcard bench/*_bench.c)

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))
LIB_OBJS    := $(call obj,$(LIB_SRCS))
SERVER_OBJS := $(call obj,$(SERVER_SRCS))
WORKER_OBJS := $(call obj,$(WORKER_SRCS)) $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRCS))
LAUNCH_OBJS := $(call obj,$(LAUNCH_SRCS))

PROGRAMS := $(BIN)/ps_server $(BIN)/ps_worker $(BIN)/ps_launch $(BIN)/ps_keygen
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
BENCHES  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS))

.PHONY: all test bench deps clean run
all: $(PROGRAMS) $(LIB)/libps.a $(EXAMPLES) tests-build
	@if [ "$(BUILD_CUDA)" != 1 ]; then echo "make: CUDA backend skipped (no nvcc at $(NVCC), or CUDA=0)"; fi

tests-build: $(TESTS) $(BUILD)/tests/public_header.o $(BUILD)/tests/readme_client
.PHONY: tests-build
# keep test objects between builds (they are intermediate files of a chain)
.SECONDARY:

$(LIB)/libps.a: $(LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libserver.a: $(SERVER_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libworker.a: $(WORKER_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/liblaunch.a: $(LAUNCH_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

ALL_LIBS := $(BUILD)/libserver.a $(BUILD)/libworker.a $(BUILD)/liblaunch.a $(LIB)/libps.a

$(BIN)/ps_server: $(BUILD)/server/ps_server_main.o $(BUILD)/libserver.a $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_worker: $(BUILD)/worker/ps_worker_main.o $(BUILD)/libworker.a $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_launch: $(BUILD)/launch/ps_launch_main.o $(BUILD)/liblaunch.a $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_keygen: $(BUILD)/common/ps_keygen_main.o $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/ps_test.o $(BUILD)/tests/ps_test_server.o $(ALL_LIBS)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/tests/ps_test.o $(BUILD)/tests/ps_test_server.o $(ALL_LIBS) $(LDLIBS)
$(BUILD)/examples/%: $(BUILD)/examples/%.o $(LIB)/libps.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(ALL_LIBS)
	$(CC) $(CFLAGS) -o $@ $< $(ALL_LIBS) $(LDLIBS)

# libps's public headers stand alone: -Iinclude and nothing else
$(BUILD)/tests/public_header.o: tests/public_header.c include/ps_client.h include/ps_types.h
	@mkdir -p $(@D)
	$(CC) -std=c99 -pedantic-errors -Wall -Wextra -Werror -Iinclude -c -o $@ $<

# README.md's C program (the ```c block under "## The client library"),
# built the way the README says: -Iinclude and libps, nothing else.  A README
# that stops compiling stops the build; tests/test_readme.c runs it.
README_CFLAGS := $(filter-out -D% -fno-strict-aliasing,$(CFLAGS_BASE)) -Iinclude
$(BUILD)/tests/readme_client.c: README.md
	@mkdir -p $(@D)
	awk '/^## The client library/ {s = 1} s && /^```c$$/ {p = 1; next} p && /^```$$/ {exit} p' $< >$@.tmp
	@test -s $@.tmp || { echo "README.md: no C block under '## The client library'" >&2; rm -f $@.tmp; exit 1; }
	mv $@.tmp $@
$(BUILD)/tests/readme_client: $(BUILD)/tests/readme_client.c $(LIB)/libps.a
	$(CC) $(README_CFLAGS) -o $@ $< $(LIB)/libps.a $(PKG_LIBS) -lm -pthread $(LDSAN)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(INC) -MMD -MP -c -o $@ $<
$(BUILD)/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

test: all
	@BUILD=$(BUILD) SAN=$(SAN) PS_BIN_DIR=$(BIN) tests/run.sh

bench: all $(BENCHES)
	@BUILD=$(BUILD) PS_BIN_DIR=$(BIN) bench/run.sh

deps:
	sh .ci/deps.sh

# install what is missing, build, and train with the multi-GPU example
run:
	sh examples/quickstart.sh $(RUN_ARGS)

clean:
	rm -rf build build-san bin lib

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# fuzz targets (clang libFuzzer): `make fuzz`
-include tests/fuzz/fuzz.mk
