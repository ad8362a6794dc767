# Parameter server build.  `make` builds bin/ and lib/; `make test` runs every
# test and ends with "N passed, N failed, N skipped".
#
#   SAN=1     build with AddressSanitizer + UndefinedBehaviorSanitizer
#   CUDA=0    never build the CUDA backend;  CUDA=1  fail if nvcc is missing
#   CUDA_HOME where the CUDA toolkit lives (default /usr/local/cuda)
#   CUDA_ARCHS GPU architectures to build machine code for (default "80 90":
#             A100 and, binary compatible, sm_86/89 GPUs; H100/H200), plus
#             PTX of the newest for the driver to compile on newer GPUs
#   WERROR=0  warnings stay warnings (a newer compiler than the one the tree
#             is kept clean with, e.g. on a GPU machine building for itself)
#   make gpu-bundle [GPU_BUNDLE=build/gpu-bundle]  the CUDA build with every
#             shared library it needs that is not glibc or CUDA's, in one
#             folder that runs on a GPU machine without Debian's packages
#             (tests/gpu/README.md)
#   make install [PREFIX=/usr/local] [DESTDIR=]   programs, libps (static and
#             shared), public headers, pkg-config file, Python package;
#             make uninstall removes exactly those (docs/INSTALL.md)

.DEFAULT_GOAL := all
VERSION   := 0.1.0
SOMAJOR   := $(firstword $(subst ., ,$(VERSION)))
CC        ?= cc

# --- Before anything compiles: the Debian packages the build needs, so a new
# machine gets their names and `make deps` instead of "zmq.h: No such file".
# One shell and a few pkg-config calls; skipped for the targets that need
# nothing (deps, clean, uninstall).
DEP_PROBE := command -v $(CC) >/dev/null 2>&1 || echo build-essential; \
  if command -v pkg-config >/dev/null 2>&1; then \
    for m in libzmq:libzmq3-dev msgpack:libmsgpack-dev zlib:zlib1g-dev \
             libmicrohttpd:libmicrohttpd-dev libcurl:libcurl4-openssl-dev \
             json-c:libjson-c-dev; do \
      pkg-config --exists $${m%%:*} || echo $${m\#*:}; done; \
    pkg-config --exists openblas || [ -f /usr/include/cblas.h ] || echo libopenblas-dev; \
  else \
    echo pkg-config; \
    for m in zmq.h:libzmq3-dev msgpack.h:libmsgpack-dev zlib.h:zlib1g-dev \
             microhttpd.h:libmicrohttpd-dev curl/curl.h:libcurl4-openssl-dev \
             json-c/json.h:libjson-c-dev; do \
      [ -f /usr/include/$${m%%:*} ] || echo $${m\#*:}; done; \
  fi
ifneq ($(filter-out deps clean uninstall,$(or $(MAKECMDGOALS),all)),)
  DEP_MISSING := $(strip $(shell $(DEP_PROBE)))
  ifneq ($(DEP_MISSING),)
    $(error missing Debian packages: $(DEP_MISSING).  Install them with `make deps` \
      (as root; it runs .ci/deps.sh), or: sudo apt-get install $(DEP_MISSING))
  endif
endif
SAN       ?= 0
CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc

PKGS      := libzmq msgpack
# libmicrohttpd: its header only; metrics/ps_metrics_http.c loads the library
# when an exporter starts (a process with metrics off never maps it)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) libmicrohttpd 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
# libcurl: ps_top reads the workers' /metrics with it; the tests link it
# as needed (only the programs that call it depend on it)
CURL_LIBS   := $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)
CURL_IF_USED := -Wl,--as-needed $(CURL_LIBS) -Wl,--no-as-needed
# json-c: coord/ (etcd's JSON gateway: the bodies; libcurl for HTTP, which
# coord/ps_etcd.c loads when an etcd client opens, as metrics/ loads
# libmicrohttpd) and ps_server --import (an export's manifest.json,
# server/import.c): ps_server links it, the tests and benchmarks as needed
JSON_CFLAGS := $(shell pkg-config --cflags json-c 2>/dev/null)
JSON_LIBS   := $(shell pkg-config --libs json-c 2>/dev/null || echo -ljson-c)
COORD_LIBS  := $(JSON_LIBS) -ldl
COORD_IF_USED := -Wl,--as-needed $(COORD_LIBS) -Wl,--no-as-needed

BUILD := build$(if $(filter 1,$(SAN)),-san,)
# sanitized programs and library live apart so the two builds never mix
BIN   := $(if $(filter 1,$(SAN)),$(BUILD)/bin,bin)
LIB   := $(if $(filter 1,$(SAN)),$(BUILD)/lib,lib)
# Each folder's objects see only the headers their layer may include
# (DESIGN.md "Folders"), so a wrong include fails to compile.
INC_common := -Iinclude -Icommon
INC_metrics := $(INC_common) -Imetrics
INC_proto  := $(INC_common) -Iproto
INC_coord  := $(INC_common) -Icoord
INC_server := $(INC_proto) -Imetrics -Icoord -Iserver
INC_client := $(INC_proto) -Imetrics -Iclient
INC_worker := $(INC_client) -Iworker
INC_launch := $(INC_metrics) -Icoord -Ilaunch
# tools/: operator programs over libps, and (ps_export) over the checkpoint
# format: the server's own reader and restore (server/checkpoint.h,
# ckpt_coord.h)
INC_tools  := $(INC_client) -Iserver -Itools
INCLUDES   := -Iinclude -Icommon -Imetrics -Iproto -Icoord -Iserver -Iclient -Iworker -Ilaunch -Itools
INC := $(INCLUDES)
$(BUILD)/common/%.o: INC := $(INC_common)
$(BUILD)/metrics/%.o: INC := $(INC_metrics)
$(BUILD)/proto/%.o:  INC := $(INC_proto)
$(BUILD)/coord/%.o:  INC := $(INC_coord)
$(BUILD)/server/%.o: INC := $(INC_server)
$(BUILD)/client/%.o: INC := $(INC_client)
$(BUILD)/worker/%.o: INC := $(INC_worker)
$(BUILD)/launch/%.o: INC := $(INC_launch)
$(BUILD)/tools/%.o:  INC := $(INC_tools)
$(BUILD)/examples/%.o: INC := -Iinclude
WERROR    ?= 1
WERR      := $(if $(filter 1,$(WERROR)),-Werror)
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -DPS_VERSION=\"$(VERSION)\" -g -O3 \
  -Wall -Wextra $(WERR) -pthread -fno-strict-aliasing
ifeq ($(SAN),1)
  CFLAGS_BASE += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
                 -fno-sanitize-recover=undefined
  LDSAN := -fsanitize=address,undefined
endif
CFLAGS  := $(CFLAGS_BASE) $(PKG_CFLAGS) $(BLAS_CFLAGS) $(JSON_CFLAGS) $(EXTRA_CFLAGS)
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
# Architectures: machine code (SASS) for each of CUDA_ARCHS this nvcc can
# build (nvcc --list-gpu-code), and PTX of the newest of them, which the
# driver compiles at load time on a GPU newer than all of them.
CUDA_ARCHS ?= 80 90
comma := ,
ifeq ($(BUILD_CUDA),1)
  NVCC_CODES := $(shell $(NVCC) --list-gpu-code 2>/dev/null)
  CUDA_SASS  := $(if $(NVCC_CODES),$(foreach a,$(CUDA_ARCHS),$(if $(filter sm_$(a),$(NVCC_CODES)),$(a))),$(CUDA_ARCHS))
  CUDA_NOT_BUILT := $(filter-out $(CUDA_SASS),$(CUDA_ARCHS))
  ifeq ($(strip $(CUDA_SASS)),)
    $(error CUDA_ARCHS="$(CUDA_ARCHS)": $(NVCC) builds none of them (it builds: $(NVCC_CODES)))
  endif
  CUDA_PTX   := $(shell printf '%s\n' $(CUDA_SASS) | sort -n | tail -n 1)
  CUDA_BUILT := $(foreach a,$(CUDA_SASS),sm_$(a)) + PTX compute_$(CUDA_PTX)
  NVCCFLAGS := -O3 -std=c++17 $(foreach a,$(CUDA_SASS),-gencode arch=compute_$(a),code=sm_$(a)) \
    -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX) \
    -Xcompiler -Wall,-Wextra,-fPIC$(if $(WERR),$(comma)-Werror) \
    $(if $(WERR),-Werror all-warnings) $(INC_worker)
  CFLAGS += -DPS_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  # the shared libcudart (not nvcc's static default): the fault tests put
  # tests/fake_cudart.c in front of it, and the GPU bundle takes the
  # device's own, the one that matches its driver
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
  CUDA_SRCS := $(wildcard worker/*.cu)
  # cuDNN (convolutions and pooling in one call per batch) when its header is
  # in the toolkit; without it the backend does them with im2col + cuBLAS
  HAVE_CUDNN := $(shell test -f $(CUDA_HOME)/include/cudnn.h && echo 1)
  ifeq ($(HAVE_CUDNN),1)
    CFLAGS += -DPS_HAVE_CUDNN=1
    NVCCFLAGS += -DPS_HAVE_CUDNN=1
    LDLIBS += -lcudnn
  endif
  FAKE_CUDART := $(BUILD)/tests/libfake_cudart.so
endif

# --- sources.  Files named *_main.c hold a program's main().  libps is
# common/, metrics/, proto/ and client/ (the client, the exchange, local
# aggregation, the host-memory backend, the metrics exporter); worker/ is the
# ps_worker program alone.
LIB_SRCS    := $(filter-out %_main.c,$(wildcard common/*.c metrics/*.c proto/*.c client/*.c))
SERVER_SRCS := $(filter-out %_main.c,$(wildcard server/*.c))
# coord/: the coordination service's client (etcd) and the shard groups'
# configuration in it; ps_server and ps_launch use it
COORD_SRCS  := $(wildcard coord/*.c)
WORKER_SRCS := $(filter-out %_main.c,$(wildcard worker/*.c))
# ps_launch: the plan and the supervisor (launch/ may include only common/
# and include/, which its objects' include path enforces)
LAUNCH_SRCS := $(filter-out %_main.c,$(wildcard launch/*.c))
# tools/: operator programs over libps (ps_top) and the checkpoint format (ps_export)
TOOLS_SRCS  := $(filter-out %_main.c,$(wildcard tools/*.c))
TEST_SRCS   := $(wildcard tests/test_*.c)
# examples/*.c: programs on the public header and lib/libps.a alone, built
# into $(BUILD)/examples/ (tests/test_example_*.c run them)
EXAMPLE_SRCS := $(wildcard examples/*.c)
BENCH_SRCS  := $(wildcard bench/*_bench.c)

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))
LIB_OBJS    := $(call obj,$(LIB_SRCS))
SERVER_OBJS := $(call obj,$(SERVER_SRCS))
COORD_OBJS  := $(call obj,$(COORD_SRCS))
WORKER_OBJS := $(call obj,$(WORKER_SRCS)) $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRCS))
LAUNCH_OBJS := $(call obj,$(LAUNCH_SRCS))
TOOLS_OBJS  := $(call obj,$(TOOLS_SRCS))
# libps's objects go into libps.so as well as libps.a.  Objects built with
# other flags (before libps.so existed, or with another CFLAGS) are rebuilt:
# the stamp changes whenever the flags do.
$(LIB_OBJS): PIC := -fPIC
$(LIB_OBJS): $(BUILD)/libps.flags
$(BUILD)/libps.flags: FORCE
	@mkdir -p $(@D)
	@echo '$(CFLAGS) -fPIC' | cmp -s - $@ || echo '$(CFLAGS) -fPIC' >$@
.PHONY: FORCE

PROGRAMS := $(BIN)/ps_server $(BIN)/ps_worker $(BIN)/ps_launch $(BIN)/ps_keygen $(BIN)/ps_top \
            $(BIN)/ps_export $(BIN)/ps_servers
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
BENCHES  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS))

.PHONY: all test bench deps clean run install uninstall
all: $(PROGRAMS) $(LIB)/libps.a $(LIB)/libps.so $(EXAMPLES) tests-build
	@if [ "$(BUILD_CUDA)" != 1 ]; then echo "make: CUDA backend skipped (no nvcc at $(NVCC), or CUDA=0)"; \
	else echo "make: CUDA backend for $(CUDA_BUILT)$(if $(CUDA_NOT_BUILT), (not $(addprefix sm_,$(CUDA_NOT_BUILT)): $(NVCC) cannot build them)), $(if $(HAVE_CUDNN),with cuDNN,without cuDNN (no $(CUDA_HOME)/include/cudnn.h))"; fi

tests-build: $(TESTS) $(BUILD)/tests/public_header.o $(BUILD)/tests/readme_client \
  $(BUILD)/tests/abi_layout $(FAKE_CUDART) $(BUILD)/tests/ctr_dump
.PHONY: tests-build
# keep test objects between builds (they are intermediate files of a chain)
.SECONDARY:

$(LIB)/libps.a: $(LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# libps.so.MAJOR.MINOR.PATCH with soname libps.so.MAJOR; it exports the
# ps_ names of client/libps.map and nothing else (internal psc_ names, and
# what the static library's users might define themselves, stay inside).
LIBPS_SO := libps.so.$(VERSION)
$(LIB)/$(LIBPS_SO): $(LIB_OBJS) client/libps.map
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,libps.so.$(SOMAJOR) -Wl,--version-script=client/libps.map \
	  -Wl,--no-undefined -o $@ $(LIB_OBJS) $(PKG_LIBS) -lm -pthread $(LDSAN)
$(LIB)/libps.so: $(LIB)/$(LIBPS_SO)
	ln -sf $(LIBPS_SO) $(LIB)/libps.so.$(SOMAJOR)
	ln -sf libps.so.$(SOMAJOR) $@

$(BUILD)/libserver.a: $(SERVER_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libcoord.a: $(COORD_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libworker.a: $(WORKER_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/liblaunch.a: $(LAUNCH_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libtools.a: $(TOOLS_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

ALL_LIBS := $(BUILD)/libserver.a $(BUILD)/libworker.a $(BUILD)/liblaunch.a $(BUILD)/libtools.a \
  $(BUILD)/libcoord.a $(LIB)/libps.a

$(BIN)/ps_server: $(BUILD)/server/ps_server_main.o $(BUILD)/libserver.a $(BUILD)/libcoord.a \
  $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(COORD_LIBS)
$(BIN)/ps_worker: $(BUILD)/worker/ps_worker_main.o $(BUILD)/libworker.a $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_launch: $(BUILD)/launch/ps_launch_main.o $(BUILD)/liblaunch.a $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_keygen: $(BUILD)/common/ps_keygen_main.o $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_top: $(BUILD)/tools/ps_top_main.o $(BUILD)/libtools.a $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(CURL_LIBS)
$(BIN)/ps_servers: $(BUILD)/tools/ps_servers_main.o $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BIN)/ps_export: $(BUILD)/tools/ps_export_main.o $(BUILD)/libtools.a $(BUILD)/libserver.a \
  $(LIB)/libps.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/ps_test.o $(BUILD)/tests/ps_test_server.o $(ALL_LIBS)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/tests/ps_test.o $(BUILD)/tests/ps_test_server.o $(ALL_LIBS) $(LDLIBS) $(COORD_IF_USED) $(CURL_IF_USED)
$(BUILD)/examples/%: $(BUILD)/examples/%.o $(LIB)/libps.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(ALL_LIBS)
	$(CC) $(CFLAGS) -o $@ $< $(ALL_LIBS) $(LDLIBS) $(COORD_IF_USED) $(CURL_IF_USED)

# libps's public headers stand alone: -Iinclude and nothing else
$(BUILD)/tests/public_header.o: tests/public_header.c $(PUBLIC_HEADERS)
	@mkdir -p $(@D)
	$(CC) -std=c99 -pedantic-errors -Wall -Wextra $(WERR) -Iinclude -c -o $@ $<

# The CUDA runtime with faults on demand (tests/test_cuda_faults.sh), not
# sanitized: it is preloaded in front of libcudart.
$(FAKE_CUDART): tests/fake_cudart.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 -Wall -Wextra $(WERR) -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< -ldl

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

# the layouts of libps's public structs, for the Python package's mirror of
# them (tests/test_python.sh compares)
$(BUILD)/tests/abi_layout: tests/abi_layout.c include/ps_client.h include/ps_types.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -Wall -Wextra $(WERR) -Iinclude -o $@ $<

# the synthetic click-through samples of worker/data_ctr.c, for the Python
# generator's comparison with them (tests/python/test_data_ctr.py)
$(BUILD)/tests/ctr_dump: $(BUILD)/tests/ctr_dump.o $(BUILD)/libworker.a $(LIB)/libps.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# the optimizers keep a block's old values in the loop that overwrites them:
# not a separate memcpy per block (server/optimizer.c says why)
$(BUILD)/server/optimizer.o: CFLAGS += -fno-tree-loop-distribute-patterns
$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(PIC) $(INC) -MMD -MP -c -o $@ $<
$(BUILD)/%.o: %.cu $(BUILD)/cuda.flags
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<
# rebuilt when the flags change (another CUDA_ARCHS, WERROR)
$(BUILD)/cuda.flags: FORCE
	@mkdir -p $(@D)
	@echo '$(NVCCFLAGS)' | cmp -s - $@ || echo '$(NVCCFLAGS)' >$@

test: all
	@BUILD=$(BUILD) SAN=$(SAN) PS_BIN_DIR=$(BIN) tests/run.sh

# docs/PROTOCOL.md's list of message types, written from proto/ps_msg_table.h
# (tests/test_msg_table.c fails while the two differ)
$(BUILD)/ps_msg_doc: $(BUILD)/proto/ps_msg_doc_main.o $(LIB)/libps.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
protocol-doc: $(BUILD)/ps_msg_doc
	./$(BUILD)/ps_msg_doc docs/PROTOCOL.md
.PHONY: protocol-doc
# README.md's flag tables, made from the settings table (common/ps_settings.h)
# by each program's --help-markdown; tests/test_readme_flags.sh compares them
readme-flags: $(PROGRAMS)
	PS_BIN_DIR=$(BIN) sh tests/test_readme_flags.sh --write
.PHONY: readme-flags

bench: all $(BENCHES)
	@BUILD=$(BUILD) PS_BIN_DIR=$(BIN) bench/run.sh

# --- The GPU bundle: this CUDA build, its Python package, and the shared
# libraries it loads that are neither glibc's nor the device's CUDA, with a
# wrapper (GPU_BUNDLE/run) that puts them on the paths; for a GPU machine
# without Debian's packages, where tests/gpu/check.sh --bundle runs it.
GPU_BUNDLE ?= build/gpu-bundle
ifneq ($(filter gpu-bundle,$(MAKECMDGOALS)),)
  ifneq ($(BUILD_CUDA),1)
    $(error make gpu-bundle needs the CUDA backend: no nvcc at $(NVCC) (set CUDA_HOME), or CUDA=0)
  endif
  ifeq ($(SAN),1)
    $(error make gpu-bundle: not with SAN=1 (a sanitized build runs only where it was built))
  endif
endif
gpu-bundle: all $(BENCHES)
	BUILD=$(BUILD) BIN=$(BIN) LIB=$(LIB) NVCC=$(NVCC) sh tests/gpu/bundle.sh \
	  --out $(GPU_BUNDLE) --archs "$(CUDA_BUILT)"
.PHONY: gpu-bundle

deps:
	sh .ci/deps.sh

# install what is missing, build, and train with the multi-GPU example
run:
	sh examples/quickstart.sh $(RUN_ARGS)

clean:
	rm -rf build build-san bin lib

# --- install: programs, libps (static and shared, with its symlinks),
# public headers, pkg-config file, Python package.  DESTDIR stages the files
# for a package; the paths written into ps.pc and the Python package are
# PREFIX's.  Python: Debian's python3 reads /usr/lib/python3/dist-packages for
# PREFIX=/usr and PREFIX/lib/python3.X/dist-packages otherwise.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PYTHON     ?= /usr/bin/python3
# recursive: asked of the interpreter only when installing
PYTHONDIR  ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/$(shell \
  $(PYTHON) -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null || echo python3)/dist-packages)
PUBLIC_HEADERS := include/ps_client.h include/ps_types.h include/ps_exchange.h
PY_FILES := $(wildcard python/ps/*.py python/ps/torch/*.py)
INSTALLED_PROGRAMS := $(notdir $(PROGRAMS))
PS_PC := $(BUILD)/ps.pc

# Outside the loader's own directories a program linked with ps.pc finds
# libps.so through an rpath, so it runs without LD_LIBRARY_PATH.
comma := ,
PC_RPATH := $(if $(filter /usr/lib /usr/local/lib /usr/lib/x86_64-linux-gnu,$(LIBDIR)),, -Wl$(comma)-rpath$(comma)$${libdir})
$(PS_PC): Makefile
	@mkdir -p $(@D)
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: ps' 'Description: parameter server client library (libps)' 'Version: $(VERSION)' \
	  'Requires.private: libzmq msgpack' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir}$(PC_RPATH) -lps' 'Libs.private: -lm -pthread' >$@
.PHONY: $(PS_PC)

install: $(PROGRAMS) $(LIB)/libps.a $(LIB)/libps.so $(PS_PC)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	  $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(PYTHONDIR)/ps/torch
	install -m 755 $(PROGRAMS) $(DESTDIR)$(BINDIR)/
	install -m 644 $(LIB)/libps.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIB)/$(LIBPS_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(LIBPS_SO) $(DESTDIR)$(LIBDIR)/libps.so.$(SOMAJOR)
	ln -sf libps.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libps.so
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(PS_PC) $(DESTDIR)$(PKGCONFIGDIR)/ps.pc
	install -m 644 $(wildcard python/ps/*.py) $(DESTDIR)$(PYTHONDIR)/ps/
	install -m 644 $(wildcard python/ps/torch/*.py) $(DESTDIR)$(PYTHONDIR)/ps/torch/
	printf '# written by make install: where libps.so was installed\nLIBDIR = %s\n' \
	  "'$(LIBDIR)'" >$(DESTDIR)$(PYTHONDIR)/ps/_installed.py
	@case "$(DESTDIR):$(LIBDIR):$$(id -u)" in \
	  :/usr/lib:0|:/usr/local/lib:0) ldconfig && echo "install: ran ldconfig" ;; \
	  *) echo "install: the loader finds libps.so.$(SOMAJOR) once $(LIBDIR) is in its path" \
	       "(/etc/ld.so.conf.d, then ldconfig as root) or in LD_LIBRARY_PATH" ;; \
	esac
	@echo "install: Python package in $(PYTHONDIR)/ps (import ps, ps.torch)"

uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(INSTALLED_PROGRAMS))
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,libps.a $(LIBPS_SO) libps.so.$(SOMAJOR) libps.so)
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(PUBLIC_HEADERS)))
	rm -f $(DESTDIR)$(PKGCONFIGDIR)/ps.pc
	rm -f $(addprefix $(DESTDIR)$(PYTHONDIR)/,$(PY_FILES:python/%=%)) \
	  $(DESTDIR)$(PYTHONDIR)/ps/_installed.py
	rm -rf $(DESTDIR)$(PYTHONDIR)/ps/__pycache__ $(DESTDIR)$(PYTHONDIR)/ps/torch/__pycache__
	-rmdir $(DESTDIR)$(PYTHONDIR)/ps/torch $(DESTDIR)$(PYTHONDIR)/ps 2>/dev/null

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# fuzz targets (clang libFuzzer): `make fuzz`
-include tests/fuzz/fuzz.mk
