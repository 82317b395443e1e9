/* Programmatic dependent launch (KDT_MODEL_PDL) for the model's own kernels. The forward's step is
 * launch bound (a hundred small kernels, each waiting for the one before): launched with
 * programmatic stream serialization, a kernel may be scheduled while the one before it still runs
 * and waits on the device (griddepcontrol.wait: the previous grid complete, its writes visible)
 * instead of the launch waiting on the stream, which hides most of the gap between dependent
 * kernels, in a CUDA graph too. Every kernel launched so calls kdt_pdl_begin() first, before any
 * global memory access, so it orders exactly as a plain launch; then it lets the next kernel be
 * scheduled (its blocks wait the same way). Without the attribute both instructions do nothing. */
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "model/cuda/kernels.h"

__device__ __forceinline__ void kdt_pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* k<<<grid, block, smem, s>>>(args...), with programmatic stream serialization while the calling
 * thread's forward asks for it (kdt_mk_pdl). k must start with kdt_pdl_begin(). */
template <typename... KArgs, typename... Args>
cudaError_t kdt_pdl_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    c.attrs = at;
    c.numAttrs = kdt_mk_pdl() ? 1 : 0;
    return cudaLaunchKernelEx(&c, k, std::forward<Args>(args)...);
}
