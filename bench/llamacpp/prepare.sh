#!/usr/bin/env bash
# Fetches llama.cpp from llama-cpp-python's PyPI source package and packs what bench/llamacpp/run.sh
# needs on the GPU machine (which has no network) into $CARRY; run it here, on a machine with pip's
# network. Nothing it fetches or builds enters the repo.
#   bash bench/llamacpp/prepare.sh     $CARRY/llama-src.tgz: llama.cpp's source, trimmed to what its
#                                      CUDA build and its converter need (run.sh builds it there)
#   BUILD_CUDA=1 ...                   also builds the CUDA tools here (bench/llamacpp/build.sh, about
#                                      350 compiler runs) and packs $CARRY/llama.tgz: the stripped tools,
#                                      their libraries and the converter, no source
#   CHECK=1 ...                        also a CPU build, the GGUF conversion and the checks of
#                                      docs/perf/llamacpp.md: llama.cpp's tokenizer against
#                                      heldout_prompts.ids and its greedy tokens against `kdt generate
#                                      --backend cpu` (needs build-cpu/kdt)
# The lead carries either tarball into the GPU run as .gpu/llama.tgz.
set -eu
cd "$(dirname "$0")/../.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${CACHE:-/work/llama-cache}
CARRY=${CARRY:-/work/llama-carry}
JOBS=${JOBS:-2}
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
mkdir -p "$CACHE" "$CARRY"
[ -f "$CACHE/llama_cpp_python-$VERSION.tar.gz" ] ||
    python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE"
[ -d "$SRC" ] || tar -xzf "$CACHE/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"

# The source, without models, docs, tests, web assets and the backends other than CPU and CUDA.
stage="$CACHE/stage"
rm -rf "$stage" && mkdir -p "$stage/llama"
excl=()
for d in models docs media tests benches tools/ui examples/llama.android examples/llama.swiftui app skills ci scripts; do
    excl+=(--exclude="llama.cpp/$d")
done
for b in virtgpu cann openvino webgpu et metal hexagon sycl vulkan opencl blas rpc zdnn musa hip zendnn; do
    excl+=(--exclude="llama.cpp/ggml/src/ggml-$b")
done
tar -C "$SRC/.." -cf - "${excl[@]}" llama.cpp | tar -C "$stage/llama" -xf -
mv "$stage/llama/llama.cpp" "$stage/llama/src"
echo "llama.cpp from the PyPI sdist llama-cpp-python $VERSION (vendor/llama.cpp)" >"$stage/llama/VERSION"
tar -C "$stage" -cf - llama | gzip -9 >"$CARRY/llama-src.tgz"
echo "prepare.sh: $CARRY/llama-src.tgz, $(du -h "$CARRY/llama-src.tgz" | cut -f1)"

if [ "${BUILD_CUDA:-0}" = 1 ]; then
    nice -n 15 bash bench/llamacpp/build.sh "$SRC" "$CACHE/build-cuda" cuda "$JOBS"
    mkdir -p "$stage/llama/bin" "$stage/llama/lib"
    for t in llama-simple llama-bench llama-lookup llama-speculative llama-speculative-simple llama-tokenize; do
        cp "$CACHE/build-cuda/bin/$t" "$stage/llama/bin/"
    done
    find "$CACHE/build-cuda" -name 'lib*.so*' -exec cp -P {} "$stage/llama/lib/" \;
    strip --strip-unneeded "$stage"/llama/bin/* "$stage"/llama/lib/*.so* 2>/dev/null || true
    # Of the source, the converter alone stays.
    (cd "$stage/llama/src" && find . -mindepth 1 -maxdepth 1 ! -name convert_hf_to_gguf.py ! -name conversion \
        ! -name gguf-py ! -name LICENSE -exec rm -rf {} +)
    tar -C "$stage" -cf - llama | xz -9 >"$CARRY/llama.tgz"
    echo "prepare.sh: $CARRY/llama.tgz, $(du -h "$CARRY/llama.tgz" | cut -f1)"
fi

if [ "${CHECK:-0}" = 1 ]; then
    nice -n 15 bash bench/llamacpp/build.sh "$SRC" "$CACHE/build-cpu" cpu "$JOBS"
    mkdir -p "$CACHE/cpu-llama"
    ln -sfn "$CACHE/build-cpu/bin" "$CACHE/cpu-llama/bin"
    ln -sfn "$SRC" "$CACHE/cpu-llama/src"
    # run.sh itself, on the CPU: f32 GGUFs against kdt's f32 CPU backend, PROMPTS prompts.
    LLAMA_DIR="$CACHE/cpu-llama" BACKEND=cpu NGL=0 GGUF_TYPE=f32 BUILD=build-cpu PROMPTS=${PROMPTS:-2} \
        PROMPT_LIMIT=600 DEADLINE=${DEADLINE:-6000} OUT="$CACHE/check" nice -n 15 bash bench/llamacpp/run.sh
fi
