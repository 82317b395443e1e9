/* The RMSNorm's sum of squares as every norm of the forward takes it (kernels.cu's rmsnorm and
 * kv_append, route.cu's router norm), with no includes of its own. One summation order per row
 * length and stride, whatever the batch, grid or timing: thread t of a group of `stride` threads
 * sums elements t, t + stride, ... in increasing order; the caller then reduces the group's sums
 * in a fixed tree. The loads go out 16 at a time, so that a thread waits for one round trip per 16
 * elements instead of one per element: a 7168-wide row is 2 round trips, not 28. */
#pragma once

__device__ __forceinline__ float norm_sumsq_part(const float *x, int n, int t, int stride) {
    float ss = 0.f;
    for (int j = t; j < n; j += 16 * stride) {
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; i++) v[i] = j + i * stride < n ? x[j + i * stride] : 0.f;
#pragma unroll
        for (int i = 0; i < 16; i++)
            if (j + i * stride < n) ss = fmaf(v[i], v[i], ss);
    }
    return ss;
}
