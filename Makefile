# Parameter server build.  `make` builds bin/ and lib/; `make test` runs every
# test and ends with "N passed, N failed, N skipped".
#
#   SAN=1     build with AddressSanitizer + UndefinedBehaviorSanitizer
#   CUDA=0    never build the CUDA backend;  CUDA=1  fail if nvcc is missing
#   CUDA_HOME where the CUDA toolkit lives (default /usr/local/cuda)
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
    for m in libzmq:libzmq3-dev msgpack:libmsgpack-dev zlib:zlib1g-dev; do \
      pkg-config --exists $${m%%:*} || echo $${m\#*:}; done; \
    pkg-config --exists openblas || [ -f /usr/include/cblas.h ] || echo libopenblas-dev; \
  else \
    echo pkg-config; \
    for m in zmq.h:libzmq3-dev msgpack.h:libmsgpack-dev zlib.h:zlib1g-dev; do \
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
INC_client := $(INC_proto) -Iclient
INC_worker := $(INC_client) -Iworker
INC_launch := $(INC_common) -Ilaunch
INCLUDES   := -Iinclude -Icommon -Iproto -Iserver -Iclient -Iworker -Ilaunch
INC := $(INCLUDES)
$(BUILD)/common/%.o: INC := $(INC_common)
$(BUILD)/proto/%.o:  INC := $(INC_proto)
$(BUILD)/server/%.o: INC := $(INC_server)
$(BUILD)/client/%.o: INC := $(INC_client)
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
# common/, proto/ and client/ (the client, the exchange, local aggregation,
# the host-memory backend); worker/ is the ps_worker program alone.
LIB_SRCS    := $(filter-out %_main.c,$(wildcard common/*.c proto/*.c client/*.c))
SERVER_SRCS := $(filter-out %_main.c,$(wildcard server/*.c))
WORKER_SRCS := $(filter-out %_main.c,$(wildcard worker/*.c))
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
# libps's objects go into libps.so as well as libps.a.  Objects built with
# other flags (before libps.so existed, or with another CFLAGS) are rebuilt:
# the stamp changes whenever the flags do.
$(LIB_OBJS): PIC := -fPIC
$(LIB_OBJS): $(BUILD)/libps.flags
$(BUILD)/libps.flags: FORCE
	@mkdir -p $(@D)
	@echo '$(CFLAGS) -fPIC' | cmp -s - $@ || echo '$(CFLAGS) -fPIC' >$@
.PHONY: FORCE

PROGRAMS := $(BIN)/ps_server $(BIN)/ps_worker $(BIN)/ps_launch $(BIN)/ps_keygen
TESTS    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
BENCHES  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS))

.PHONY: all test bench deps clean run install uninstall
all: $(PROGRAMS) $(LIB)/libps.a $(LIB)/libps.so $(EXAMPLES) tests-build
	@if [ "$(BUILD_CUDA)" != 1 ]; then echo "make: CUDA backend skipped (no nvcc at $(NVCC), or CUDA=0)"; fi

tests-build: $(TESTS) $(BUILD)/tests/public_header.o $(BUILD)/tests/readme_client \
  $(BUILD)/tests/abi_layout
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
$(BUILD)/tests/public_header.o: tests/public_header.c $(PUBLIC_HEADERS)
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

# the layouts of libps's public structs, for the Python package's mirror of
# them (tests/test_python.sh compares)
$(BUILD)/tests/abi_layout: tests/abi_layout.c include/ps_client.h include/ps_types.h
	@mkdir -p $(@D)
	$(CC) -std=c11 -Wall -Wextra -Werror -Iinclude -o $@ $<

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(PIC) $(INC) -MMD -MP -c -o $@ $<
$(BUILD)/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

test: all
	@BUILD=$(BUILD) SAN=$(SAN) PS_BIN_DIR=$(BIN) tests/run.sh

# README.md's flag tables, made from the settings table (common/ps_settings.h)
# by each program's --help-markdown; tests/test_readme_flags.sh compares them
readme-flags: $(PROGRAMS)
	PS_BIN_DIR=$(BIN) sh tests/test_readme_flags.sh --write
.PHONY: readme-flags

bench: all $(BENCHES)
	@BUILD=$(BUILD) PS_BIN_DIR=$(BIN) bench/run.sh

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

$(PS_PC): Makefile
	@mkdir -p $(@D)
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: ps' 'Description: parameter server client library (libps)' 'Version: $(VERSION)' \
	  'Requires.private: libzmq msgpack' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -lps' 'Libs.private: -lm -pthread' >$@
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
