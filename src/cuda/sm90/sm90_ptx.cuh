/* Thin PTX wrappers for the Hopper kernels in this folder (and dev/cuda/): cp.async (sm_80+),
 * wgmma with shared-memory matrix descriptors (sm_90a only), mbarrier, TMA and named barriers.
 *
 * Shared-memory tile layout used with all of them (the 128-byte swizzle of wgmma / TMA):
 * a [rows, 64 * c] bf16 tile is c column blocks of [rows, 64]; in each block row r is 128 bytes
 * at r * 128, and its 16-byte chunk k sits at chunk position k ^ (r % 8). Blocks start at
 * 1024-byte aligned addresses, so the XOR pattern matches the address bits wgmma swizzles. */
#pragma once

#include <stdint.h>

namespace kdt_sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, bypassing L1; bytes < 16 zero-fills the rest (0: all zeros). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* The line of global memory at p into L2, not waiting for it. */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
/* A TMA descriptor (a __grid_constant__ kernel parameter) into the TMA unit's cache, before its first load. */
__device__ __forceinline__ void prefetch_tensormap(const void *p) { asm volatile("prefetch.tensormap [%0];\n" ::"l"(p) : "memory"); }

/* Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
 * async proxy (wgmma operand reads); a barrier must follow before another thread's wgmma. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ float ex2(float x) { /* 2^x; ex2(-inf) = 0 */
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}

/* ---- wgmma (sm_90a) ---- */

/* Shared-memory matrix descriptor with the 128-byte swizzle: start address, leading and stride
 * byte offsets (each >> 4), layout type 1 (128B) in bits 62-63, base offset 0.
 *   K-major operand (rows of K contiguous): lbo unused (16), sbo = 1024 (next 8-row group).
 *   MN-major operand (rows of N contiguous): lbo = byte step to the next 64-wide column block,
 *   sbo = 1024 (next 8 rows of K).
 * Kept as two words for loops over one tile: desc_lo(addr, lbo) + off / 16 is the low word of the
 * descriptor of addr + off (the 14-bit address field does not overflow below 256 KB of shared
 * memory), so a k-step costs one add instead of rebuilding the descriptor. */
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr, uint32_t lbo) { return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16); }
__device__ __forceinline__ uint64_t desc_from(uint32_t lo, uint32_t sbo) {
    uint64_t d;
    asm("mov.b64 %0, {%1, %2};\n" : "=l"(d) : "r"(lo), "r"((sbo >> 4) | (1u << 30)));
    return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

/* Waits until at most N of this warpgroup's committed wgmma groups are pending (groups complete
 * in commit order). */
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pins accumulator registers in place around async wgmma: the compiler may not move their reads
 * or writes across this point (the wgmma asm statements alone do not order them). */
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
/* Same for A fragments in registers (wgmma reads them asynchronously). */
template <int N, int M>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < M; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

/* ---- mbarrier, TMA and named barriers (sm_90) ---- */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes mbarrier.init visible to the async proxy (TMA completes transactions on the barriers). */
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* One arrival that also announces `bytes` of TMA transactions for the current phase. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* Blocks until the phase with the given parity (0 or 1) of the barrier has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
/* 2-D TMA load of one box of the tensor map at element coordinates (x innermost, y) into shared
 * memory; completes `bar`'s transactions with the box's byte count (out-of-range parts read 0). */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *tmap, int x, int y, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)tmap), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
/* Named barriers (id 1..15; 0 is __syncthreads): n threads, a multiple of 32, meet. arrive does
 * not wait; its writes are visible to the threads that sync on the same barrier. */
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

#define KDT_F4(i) "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define KDT_F16(i) KDT_F4(i), KDT_F4((i) + 4), KDT_F4((i) + 8), KDT_F4((i) + 12)
#define KDT_F64(i) KDT_F16(i), KDT_F16((i) + 16), KDT_F16((i) + 32), KDT_F16((i) + 48)

/* d[64x64] += A[64x16] B[16x64]: A and B K-major in shared memory. */
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : KDT_F16(0), KDT_F16(16)
                 : "l"(da), "l"(db), "r"(1));
}

#define KDT_D128                                                                                                \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, "  \
    "%65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, "  \
    "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, " \
    "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "     \
    "%123, %124, %125, %126, %127}"

/* d[64x256] += A[64x16] B[16x256]: A from registers (the m16n8k16 A fragment per warp), B
 * N-major in shared memory (transposed: imm-trans-b = 1). */
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " KDT_D128
                 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : KDT_F64(0), KDT_F64(64)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* d[64x256] += A[64x16] B[16x256]: A K-major, B N-major, both in shared memory. */
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " KDT_D128 ", %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : KDT_F64(0), KDT_F64(64)
                 : "l"(da), "l"(db), "r"(1));
}

#undef KDT_D128
#undef KDT_F64
#undef KDT_F16
#undef KDT_F4

} // namespace kdt_sm90
