# kdtree-engine. `make` builds build/kdt, build/libkdt.a, build/libkdt.so, the tests and benches;
# the CUDA backend is built when nvcc is found (KDT_CUDA=0 forces a CPU-only build).
# CPPFLAGS / LDFLAGS add include and library paths (e.g. a cJSON outside /usr).
# `make test` runs every test and ends with "N passed, M failed, K skipped".

BUILD     ?= build
CC        ?= cc
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
KDT_CUDA  ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

CFLAGS   ?= -O2 -g
CXXFLAGS ?= -O2 -g
CXXFLAGS += -std=c++20 -pthread -Wall -Wextra -Wno-unknown-pragmas -Iinclude -Isrc -MMD -MP
CFLAGS   += -std=c11 -Wall -Wextra -fPIC -fvisibility=hidden -Iinclude -Isrc \
            -D_GNU_SOURCE -DKDT_HAVE_CUDA=$(KDT_CUDA) -MMD -MP
LDLIBS   := -lm -lpthread -lcjson
SERVE_LIBS := -lmicrohttpd   # kdt serve's HTTP library, for the kdt binary alone

# sm_90 and sm_120 machine code plus PTX for later chips; Hopper-only kernels (src/cuda/sm90/)
# are built for sm_90a alone, where wgmma and setmaxnreg exist.
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_120,code=sm_120 \
              -gencode arch=compute_120,code=compute_120
SM90_ARCH  ?= -gencode arch=compute_90a,code=sm_90a
NVCCFLAGS  ?= -O3 -lineinfo
NVCCFLAGS  += -std=c++17 -Iinclude -Isrc -DKDT_HAVE_CUDA=1 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
              --expt-relaxed-constexpr -MMD -MP

LIB_C   := $(wildcard src/common/*.c src/kdtr/*.c src/ops/*.c src/cpu/*.c src/model/*.c src/spec/*.c)
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/obj/%.o)
ifeq ($(KDT_CUDA),1)
LIB_CU    := $(wildcard src/cuda/*.cu)
SM90_CU   := $(wildcard src/cuda/sm90/*.cu)
LIB_OBJ   += $(LIB_CU:%.cu=$(BUILD)/obj/%.o) $(SM90_CU:%.cu=$(BUILD)/obj/%.o)
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt -lstdc++
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
$(shell mkdir -p $(BUILD); echo '$(KDT_CUDA) $(CC) $(CFLAGS) $(NVCCFLAGS) $(CUDA_ARCH)' | cmp -s - $(CONFIG) 2>/dev/null || echo '$(KDT_CUDA) $(CC) $(CFLAGS) $(NVCCFLAGS) $(CUDA_ARCH)' > $(CONFIG))

.PHONY: all lib test fuzz clean
.SECONDARY:
all: $(BUILD)/kdt $(BUILD)/libkdt.a $(BUILD)/libkdt.so $(TEST_BIN) $(BENCH_BIN)
lib: $(BUILD)/libkdt.a $(BUILD)/libkdt.so

$(BUILD)/obj/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/src/cuda/sm90/%.o: src/cuda/sm90/%.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) $(SM90_ARCH) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) $(CUDA_ARCH) -c $< -o $@

$(BUILD)/libkdt.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libkdt.so: $(LIB_OBJ)
	$(CC) $(LDFLAGS) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/kdt: $(CLI_C:%.c=$(BUILD)/obj/%.o) $(BUILD)/libkdt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SERVE_LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_HELP:%.c=$(BUILD)/obj/%.o) $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# C++ tests (the emulated kernel code): no harness, linked with the C++ runtime and threads.
$(TEST_CC:tests/%.cc=$(BUILD)/tests/%): $(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CXX) $(LDFLAGS) -pthread -o $@ $^ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BUILD)/libkdt.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: all
	bash scripts/run_tests.sh $(BUILD)

# libFuzzer + ASan/UBSan build of the KDTR reader (clang from Debian's packages).
fuzz:
	@mkdir -p $(BUILD)/fuzz
	clang -std=c11 -g -O1 -Iinclude -Isrc -D_GNU_SOURCE -DKDT_HAVE_CUDA=0 \
	  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  tests/fuzz/fuzz_kdtr.c src/kdtr/*.c src/common/*.c -o $(BUILD)/fuzz/fuzz_kdtr

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
