#!/usr/bin/env bash
# Builds the library, CLI and tests with nvcc and cc alone (no make, no cmake) into
# ${BUILD:-build-nvcc}, then runs every test through scripts/run_tests.sh.
#   bash scripts/run_tests_nvcc.sh          (KDT_CUDA=0 for a CPU-only build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-nvcc}
CC=${CC:-cc}
NVCC=${NVCC:-$(command -v nvcc || true)}
if [ -z "${KDT_CUDA:-}" ]; then KDT_CUDA=$([ -n "$NVCC" ] && echo 1 || echo 0); fi
CFLAGS="-O2 -g -std=c11 -Wall -Wextra -fPIC -fvisibility=hidden -Iinclude -Isrc -D_GNU_SOURCE -DKDT_HAVE_CUDA=$KDT_CUDA"
NVFLAGS="-O3 -lineinfo -std=c++17 -Iinclude -Isrc -DKDT_HAVE_CUDA=1 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra --expt-relaxed-constexpr"
ARCH="-gencode arch=compute_90,code=sm_90 -gencode arch=compute_120,code=sm_120 -gencode arch=compute_120,code=compute_120"
LIBS="-lm -lpthread -lpcre2-8"
pkg-config --exists libcjson 2>/dev/null && LIBS="$LIBS $(pkg-config --libs libcjson)"
mkdir -p "$BUILD/obj" "$BUILD/tests"
if [ "$KDT_CUDA" = 1 ]; then
    CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
    CFLAGS="$CFLAGS -I$CUDA_HOME/include"  # src/common/cublas_lazy.c
fi

objs=()
compile_c() { local o="$BUILD/obj/${1//\//_}.o"; echo "cc   $1"; $CC $CFLAGS -c "$1" -o "$o"; objs+=("$o"); }
LIB_DIRS="src/common src/kdtr src/ops src/cpu src/model src/spec src/tokenizer"  # the layers, as in the Makefile
for d in $LIB_DIRS; do for f in "$d"/*.c; do [ -e "$f" ] && compile_c "$f"; done; done
if [ "$KDT_CUDA" = 1 ]; then
    CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
    for f in src/cuda/*.cu src/cuda/sm90/*.cu $(for d in $LIB_DIRS; do echo "$d"/cuda/*.cu; done); do
        [ -e "$f" ] || continue
        arch=$ARCH; case $f in src/cuda/sm90/*) arch="-gencode arch=compute_90a,code=sm_90a";; esac
        o="$BUILD/obj/${f//\//_}.o"; echo "nvcc $f"; $NVCC $NVFLAGS $arch -c "$f" -o "$o"; objs+=("$o")
    done
    LIBS="$LIBS -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcudart_static -ldl -lrt -lstdc++"
fi
rm -f "$BUILD/libkdt.a"; ar rcs "$BUILD/libkdt.a" "${objs[@]}"
$CC -shared -o "$BUILD/libkdt.so" "${objs[@]}" $LIBS

cli=(); for f in src/cli/*.c src/server/*.c; do o="$BUILD/obj/${f//\//_}.o"; $CC $CFLAGS -c "$f" -o "$o"; cli+=("$o"); done
$CC -o "$BUILD/kdt" "${cli[@]}" "$BUILD/libkdt.a" $LIBS -lmicrohttpd

helpers=(); for f in tests/*.c; do case $f in tests/test_*) continue;; esac
    o="$BUILD/obj/${f//\//_}.o"; $CC $CFLAGS -c "$f" -o "$o"; helpers+=("$o"); done
for f in tests/test_*.c tests/test_*.cu; do
    [ -e "$f" ] || continue
    name=$(basename "${f%.*}"); o="$BUILD/obj/${f//\//_}.o"
    case $f in
        *.cu) [ "$KDT_CUDA" = 1 ] || continue; $NVCC $NVFLAGS $ARCH -c "$f" -o "$o";;
        *) $CC $CFLAGS -c "$f" -o "$o";;
    esac
    $CC -o "$BUILD/tests/$name" "$o" "${helpers[@]}" "$BUILD/libkdt.a" $LIBS
done
for f in tests/test_*.cc; do  # C++ tests (CUDA device code emulated on CPU threads): no helpers
    [ -e "$f" ] || continue
    name=$(basename "${f%.*}"); o="$BUILD/obj/${f//\//_}.o"
    ${CXX:-c++} -O2 -g -std=c++20 -pthread -Wall -Wextra -Wno-unknown-pragmas -Iinclude -Isrc -c "$f" -o "$o"
    ${CXX:-c++} -pthread -o "$BUILD/tests/$name" "$o" "$BUILD/libkdt.a" $LIBS
done
exec bash scripts/run_tests.sh "$BUILD"
