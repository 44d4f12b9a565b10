# dflash: one plain Makefile. `make` builds everything under build/,
# `make test` runs every test, `make SAN=address|undefined|thread` switches sanitizer.

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PREFIX  ?= /usr/local
DESTDIR ?=
SAN     ?=
O       ?= 2

PKGS    := libuv libsystemd inih libcjson sqlite3 openblas
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)  # no .pc files (e.g. packages unpacked by tools/device-env.sh)
  PKG_LIBS := -luv -lsystemd -linih -lcjson -lsqlite3 -lopenblas
endif

comma   := ,
BUILD   := build$(if $(SAN),-$(subst $(comma),-,$(SAN)))
CFLAGS  := -std=c11 -D_GNU_SOURCE -O$(O) -g -Wall -Wextra -Wno-unused-parameter \
           -Wshadow -Wformat=2 -fno-strict-aliasing -pthread -MMD -MP -I. $(PKG_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -lpthread -lrt

ifneq ($(SAN),)
  CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=$(SAN)
  ifneq ($(findstring undefined,$(SAN)),)
    CFLAGS  += -fno-sanitize-recover=all
  endif
endif

# CUDA is optional: compiled where nvcc exists, never required at run time.
# NOCUDA=1 forces a CPU-only build; sanitizer builds are CPU-only.
# A toolkit counts only when nvcc, the runtime header and the libraries sit
# together (an nvcc found on PATH alone, e.g. a wrapper or a pip wheel, is not one).
CUDA_HOME  := $(if $(NVCC),$(realpath $(dir $(realpath $(NVCC)))..))
CUDA_FOUND := $(and $(NVCC),$(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h),\
                    $(wildcard $(CUDA_HOME)/lib64/libcudart.so),$(wildcard $(CUDA_HOME)/lib64/libcublasLt.so))
ifeq ($(SAN)$(NOCUDA),)
  ifneq ($(CUDA_FOUND),)
    HAVE_CUDA := 1
  else ifneq ($(NVCC),)
    # to stderr: `make -s print-build` output is read by scripts
    $(shell echo 'note: $(NVCC) found but no CUDA toolkit (headers, libcudart, cuBLAS) under $(CUDA_HOME): CPU-only build' >&2)
  endif
endif
# Hopper code with its arch-specific features (sm_90a: warpgroup MMA, used where GK_SM90A says it
# is there) plus compute_90 PTX for any later GPU; NVCC_ARCH=-arch=sm_90 builds without them.
NVCC_ARCH  ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 -DGK_SM90A=1
NVCCFLAGS  := -O3 -g -std=c++17 $(NVCC_ARCH) -I. -Xcompiler -Wall,-fno-strict-aliasing -MMD -MP
ifeq ($(HAVE_CUDA),1)
  CFLAGS  += -DDFLASH_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  ifneq ($(wildcard model/target_cuda.cu),)
    CFLAGS += -DDFLASH_HAVE_TARGET_CUDA=1   # target.c dispatches TARGET_BACKEND_CUDA
  endif
  LDLIBS  += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
  NCCL_OK := $(shell test -f /usr/include/nccl.h -o -f $(CUDA_HOME)/include/nccl.h && echo 1)
  ifeq ($(NCCL_OK),1)
    CFLAGS += -DDFLASH_HAVE_NCCL=1
    LDLIBS += -lnccl
  endif
endif

# Library code: common/, ipc/, model/ (+ gpukern/ with CUDA) -> one static library.
# LIBDIRS narrows the library while a part is being built alone.
LIBDIRS  ?= common ipc model
LIB_SRC  := $(wildcard $(addsuffix /*.c,$(LIBDIRS)))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CU_SRC   := $(if $(HAVE_CUDA),$(wildcard gpukern/*.cu $(addsuffix /*.cu,$(LIBDIRS))))
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o)
LIB      := $(BUILD)/libdflash.a

# Programs: each is the .c files of one folder.
BINS := coordinator-d target-d drafter-d dflashctl dflash-data dflash-replay
coordinator-d_SRC := $(wildcard daemons/coordinator/*.c)
target-d_SRC      := $(wildcard daemons/target/*.c)
drafter-d_SRC     := $(wildcard daemons/drafter/*.c)
dflashctl_SRC     := $(wildcard daemons/dflashctl/*.c)
dflash-data_SRC   := $(wildcard tools/dflash-data/*.c)
# (rebuilds the run's batches with the coordinator's schedule)
dflash-replay_SRC := $(wildcard tools/dflash-replay/*.c) daemons/coordinator/sched.c
BIN_PATHS := $(foreach b,$(BINS),$(if $($(b)_SRC),$(BUILD)/bin/$(b)))

# Tests and benches: one .c file = one program.
TEST_SRC   := $(wildcard tests/test_*.c)
TEST_BINS  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC  := $(wildcard bench/*_bench.c)
BENCH_BINS := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: $(BIN_PATHS) $(TEST_BINS) $(BENCH_BINS)

# Objects follow the flags they were built with: a build folder used again with others (NOCUDA=1
# after a CUDA build, another O=) is rebuilt, never linked from objects of the other kind (a
# drafter-d without its CUDA feed, a target.c without the CUDA backend).
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW   := $(CC) $(CFLAGS) | $(if $(HAVE_CUDA),$(NVCC) $(NVCCFLAGS)) | $(LDFLAGS) $(LDLIBS)
# (`sudo make install` after `make` installs what was built: root's environment, another PATH or
# CC, does not rebuild it)
FLAGS_DEP   := $(if $(filter-out install clean print-build print-bins deps check fuzz,$(MAKECMDGOALS)),$(FLAGS_STAMP),$(if $(MAKECMDGOALS),,$(FLAGS_STAMP)))
# Written as the Makefile is read, and only when the flags differ: an unchanged build is up to date
# for `make -q` and `make -n` too, which never write it (other flags: every object out of date).
# With `clean` among the goals it is left to the rule below, run after clean (a stamp that clean
# removed is made again; one it did not, in a BUILD outside build*, is written when it differs).
ifneq ($(FLAGS_DEP),)
ifneq ($(shell [ "$$(cat $(FLAGS_STAMP) 2>/dev/null)" = '$(FLAGS_NOW)' ] && echo same),same)
ifneq ($(findstring n,$(firstword -$(MAKEFLAGS)))$(findstring q,$(firstword -$(MAKEFLAGS))),)
FLAGS_DEP := flags-changed
else ifeq ($(filter clean,$(MAKECMDGOALS)),)
ifneq ($(shell mkdir -p $(BUILD) && printf '%s' '$(FLAGS_NOW)' >$(FLAGS_STAMP) && echo ok),ok)
$(error cannot write $(FLAGS_STAMP))
endif
else
FLAGS_REDO := flags-changed
endif
endif
endif
$(FLAGS_STAMP): $(FLAGS_REDO)
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = '$(FLAGS_NOW)' ] || printf '%s' '$(FLAGS_NOW)' >$@

$(BUILD)/%.o: %.c $(FLAGS_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(FLAGS_DEP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

.SECONDEXPANSION:
$(BUILD)/bin/%: $$(addprefix $(BUILD)/,$$(subst .c,.o,$$($$*_SRC))) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# `make test` builds then runs everything; T=regex selects tests by name.
test: all
	BUILD=$(BUILD) SAN=$(SAN) tests/run.sh '$(T)'

demo:
	tools/install-deps.sh
	$(MAKE) all
	DFLASH_BUILD=$(abspath $(BUILD)) tools/demo.sh

# `make check`: what CI runs. Installs what is missing, builds, runs every test.
check:
	tools/check.sh

# `make fuzz`: every libFuzzer target of tests/fuzz/ for FUZZ_SECONDS each (clang, ASan+UBSan).
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) tools/fuzz.sh

print-build:
	@echo $(BUILD)

print-bins:
	@echo $(BINS)

deps:
	tools/install-deps.sh

install: $(BIN_PATHS)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)/etc/dflash \
	  $(DESTDIR)$(PREFIX)/share/doc/dflash
	install -m 0755 $(BIN_PATHS) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 README.md docs/*.md $(DESTDIR)$(PREFIX)/share/doc/dflash/
	for u in systemd/*.service systemd/*.target; do \
	  sed 's|@BINDIR@|$(PREFIX)/bin|g; s|@DOCDIR@|$(PREFIX)/share/doc/dflash|g' $$u \
	    > $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u) && \
	  chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u) || exit 1; done
	@case "$(PREFIX)" in /usr|/usr/local) ;; *) echo "note: systemd does not look in $(PREFIX)/lib/systemd/system:" \
	  "link the units into /etc/systemd/system (systemctl link)";; esac
	@# the operator's config is kept: the shipped one goes beside it
	if [ -e $(DESTDIR)/etc/dflash/dflash.ini ]; then \
	  install -m 0644 etc/dflash.ini $(DESTDIR)/etc/dflash/dflash.ini.dist; \
	  echo "kept /etc/dflash/dflash.ini; the shipped one is /etc/dflash/dflash.ini.dist"; \
	else install -m 0644 etc/dflash.ini $(DESTDIR)/etc/dflash/dflash.ini; fi

clean:
	rm -rf build build-*

.PHONY: all test check fuzz print-build demo deps install clean flags-changed
.SECONDARY:

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
