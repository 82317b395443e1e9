#!/usr/bin/env bash
# Builds llama.cpp's tools that bench/llamacpp/run.sh uses, from a llama.cpp source tree.
#   bash bench/llamacpp/build.sh SRC BUILD_DIR cuda|cpu [JOBS]
# cuda: sm_90 only (the H200), shared libraries (one libggml-cuda.so for every tool), flash
# attention kernels for f16/bf16/q4_0/q8_0 caches only (GGML_CUDA_FA_ALL_QUANTS off, the default),
# no NCCL, OpenMP, OpenSSL, tests or server: the fewest CUDA files llama.cpp allows. cpu: the same
# tools without CUDA, for the check on a machine without a GPU (prepare.sh).
set -eu
src=$1 build=$2 kind=$3 jobs=${4:-2}
TARGETS=(llama-simple llama-bench llama-lookup llama-speculative llama-speculative-simple llama-tokenize)
flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_CUDA_NCCL=OFF -DLLAMA_OPENSSL=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF)
case $kind in
    cuda) flags+=(-DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_FA_ALL_QUANTS=OFF
                  -DCMAKE_CUDA_COMPILER="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}") ;;
    cpu) flags+=(-DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=OFF) ;;
    *) echo "build.sh: kind is cuda or cpu, not $kind" >&2; exit 2 ;;
esac
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src" -B "$build" "${gen[@]}" "${flags[@]}"
cmake --build "$build" -j "$jobs" --target "${TARGETS[@]}"
