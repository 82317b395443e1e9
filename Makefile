# kdtree-engine. `make` builds build/kdt, build/libkdt.a, build/libkdt.so, the tests and benches;
# the CUDA backend is built when nvcc is found (KDT_CUDA=0 forces a CPU-only build).
# CFLAGS, CXXFLAGS, NVCCFLAGS, CPPFLAGS, LDFLAGS and LDLIBS given on the command line add to the
# project's own flags (KDT_*), which the build needs whatever they say; CPPFLAGS / LDFLAGS add
# include and library paths (e.g. a cJSON outside /usr).
# `make test` runs every test and ends with "N passed, M failed, K skipped".

BUILD     ?= build
CC        ?= cc
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
KDT_CUDA  ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

CFLAGS   ?= -O2 -g
CXXFLAGS ?= -O2 -g
KDT_CXXFLAGS := -std=c++20 -pthread -Wall -Wextra -Wno-unknown-pragmas -Iinclude -Isrc -MMD -MP
KDT_CFLAGS   := -std=c11 -Wall -Wextra -fPIC -fvisibility=hidden -Iinclude -Isrc \
                -D_GNU_SOURCE -DKDT_HAVE_CUDA=$(KDT_CUDA) -MMD -MP
KDT_LDLIBS   := -lm -lpthread -lcjson -lpcre2-8
SERVE_LIBS   := -lmicrohttpd   # kdt serve's HTTP library, for the kdt binary alone

# sm_90 and sm_120 machine code plus PTX for later chips; Hopper-only kernels (src/cuda/sm90/)
# are built for sm_90a alone, where wgmma and setmaxnreg exist.
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_120,code=sm_120 \
              -gencode arch=compute_120,code=compute_120
SM90_ARCH  ?= -gencode arch=compute_90a,code=sm_90a
NVCCFLAGS  ?= -O3 -lineinfo
KDT_NVCCFLAGS := -std=c++17 -Iinclude -Isrc -DKDT_HAVE_CUDA=1 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
              --expt-relaxed-constexpr -MMD -MP

# The library's layers, lowest first: a layer's C files in its folder, its CUDA code in <layer>/cuda/
# (the ops' CUDA backend is src/cuda/, beside src/cpu/), its CPU-only stubs in <layer>/no_cuda.c.
LIB_DIRS := src/common src/kdtr src/ops src/cpu src/model src/spec src/tokenizer
LIB_C   := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/obj/%.o)
ifeq ($(KDT_CUDA),1)
LIB_CU    := $(wildcard src/cuda/*.cu $(LIB_DIRS:%=%/cuda/*.cu))
SM90_CU   := $(wildcard src/cuda/sm90/*.cu)
LIB_OBJ   += $(LIB_CU:%.cu=$(BUILD)/obj/%.o) $(SM90_CU:%.cu=$(BUILD)/obj/%.o)
# cuBLAS is opened on first use (src/common/cublas_lazy.c), not linked: see there why.
KDT_CFLAGS += -I$(CUDA_HOME)/include
# kdt/comm.h's NCCL backend opens libnccl.so.2 at run time ($KDT_NCCL_LIB first): by default the one
# of the wheel nvidia-nccl-cu13 (python/requirements-gpu.txt) where python3 finds it.
NCCL_LIB ?= $(shell python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
KDT_NVCCFLAGS += -DKDT_NCCL_LIB='"$(NCCL_LIB)"'
KDT_LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif

CLI_C     := $(wildcard src/cli/*.c src/server/*.c)
TEST_C    := $(wildcard tests/test_*.c)
TEST_HELP := $(filter-out $(TEST_C),$(wildcard tests/*.c))
TEST_BIN  := $(TEST_C:tests/%.c=$(BUILD)/tests/%)
TEST_CC   := $(wildcard tests/test_*.cc)
TEST_BIN  += $(TEST_CC:tests/%.cc=$(BUILD)/tests/%)
BENCH_C   := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_C:bench/%.c=$(BUILD)/bench/%)
ifeq ($(KDT_CUDA),1)
TEST_CU   := $(wildcard tests/test_*.cu)
TEST_BIN  += $(TEST_CU:tests/%.cu=$(BUILD)/tests/%)
BENCH_CU  := $(wildcard bench/*.cu)
BENCH_BIN += $(BENCH_CU:bench/%.cu=$(BUILD)/bench/%)
endif

# Objects depend on the flags they were built with, so switching KDT_CUDA or flags rebuilds.
CONFIG := $(BUILD)/config.stamp
$(shell mkdir -p $(BUILD); echo '$(KDT_CUDA) $(CC) $(KDT_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(NVCCFLAGS) $(CUDA_ARCH)' | cmp -s - $(CONFIG) 2>/dev/null || echo '$(KDT_CUDA) $(CC) $(KDT_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(NVCCFLAGS) $(CUDA_ARCH)' > $(CONFIG))

.PHONY: all lib test dev fuzz clean
.SECONDARY:
all: $(BUILD)/kdt $(BUILD)/libkdt.a $(BUILD)/libkdt.so $(TEST_BIN) $(BENCH_BIN)
lib: $(BUILD)/libkdt.a $(BUILD)/libkdt.so

$(BUILD)/obj/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(KDT_CFLAGS) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(KDT_CXXFLAGS) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/src/cuda/sm90/%.o: src/cuda/sm90/%.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(KDT_NVCCFLAGS) $(CPPFLAGS) $(NVCCFLAGS) $(SM90_ARCH) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(KDT_NVCCFLAGS) $(CPPFLAGS) $(NVCCFLAGS) $(CUDA_ARCH) -c $< -o $@

$(BUILD)/libkdt.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libkdt.so: $(LIB_OBJ)
	$(CC) $(LDFLAGS) -shared -o $@ $^ $(KDT_LDLIBS) $(LDLIBS)

$(BUILD)/kdt: $(CLI_C:%.c=$(BUILD)/obj/%.o) $(BUILD)/libkdt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(KDT_LDLIBS) $(LDLIBS) $(SERVE_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_HELP:%.c=$(BUILD)/obj/%.o) $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(KDT_LDLIBS) $(LDLIBS)

# C++ tests (the emulated kernel code): no harness, linked with the C++ runtime and threads.
$(TEST_CC:tests/%.cc=$(BUILD)/tests/%): $(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) -pthread -o $@ $^ $(KDT_LDLIBS) $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(KDT_LDLIBS) $(LDLIBS)

# What the build and the tests need is checked first: one line naming what is missing, not a
# compiler error or a traceback half way.
test:
	@CC="$(CC)" CXX="$(CXX)" CPPFLAGS="$(CPPFLAGS)" bash scripts/check_deps.sh test
	@$(MAKE) --no-print-directory all
	bash scripts/run_tests.sh $(BUILD)

# Kernel experiments outside the library (dev/cuda/, one file each, its compile line in its header;
# Hopper kernels, built for sm_90a). Not part of `all` or `test`.
DEV_CU := $(wildcard dev/cuda/*.cu)
ifeq ($(KDT_CUDA),1)
dev: $(DEV_CU:dev/cuda/%.cu=$(BUILD)/dev/%)
else
dev:
	@echo "make dev needs nvcc (KDT_CUDA=1)" >&2; exit 1
endif

# The CUPTI timeline (dev/trace/cupti_trace.c), a driver injection library:
# CUDA_INJECTION64_PATH=$$PWD/build/dev/libkdt_trace.so KDT_TRACE_OUT=t.json <program>.
ifeq ($(KDT_CUDA),1)
dev: $(BUILD)/dev/libkdt_trace.so
endif
$(BUILD)/dev/libkdt_trace.so: dev/trace/cupti_trace.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(KDT_CFLAGS) $(CPPFLAGS) $(CFLAGS) -shared $(LDFLAGS) -o $@ $< -L$(CUDA_HOME)/lib64 \
	  -Wl,-rpath,$(CUDA_HOME)/lib64 -lcupti -lcjson $(LDLIBS)

$(BUILD)/obj/dev/cuda/%.o: dev/cuda/%.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(KDT_NVCCFLAGS) $(CPPFLAGS) $(NVCCFLAGS) $(SM90_ARCH) -c $< -o $@

$(BUILD)/dev/%: $(BUILD)/obj/dev/cuda/%.o $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(KDT_LDLIBS) $(LDLIBS)

# libFuzzer + ASan/UBSan build of the KDTR reader (clang from Debian's packages).
fuzz:
	@mkdir -p $(BUILD)/fuzz
	clang -std=c11 -g -O1 -Iinclude -Isrc -D_GNU_SOURCE -DKDT_HAVE_CUDA=0 \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  tests/fuzz/fuzz_kdtr.c src/kdtr/*.c src/common/*.c -o $(BUILD)/fuzz/fuzz_kdtr

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
