/* The CUDA block that test_tree_build_emu.cc and test_tree_sample_accept_emu.cc run device code
 * on: one std::thread per CUDA thread, __syncthreads a barrier, warp votes and shuffles through a
 * per-warp exchange. Define kEmuWarps (the block's warps) before including it. */
#pragma once

#include <barrier>
#include <cstdint>
#include <thread>
#include <vector>

#define __device__
#define __host__
#define __forceinline__ inline

struct emu_block {
    std::barrier<> *block;
    std::barrier<> *warp[kEmuWarps];
    uint64_t xchg[kEmuWarps][32];
};
static emu_block *g_blk;
struct emu_thread_index {
    unsigned x;
};
static thread_local emu_thread_index threadIdx;

static inline void __syncthreads() { g_blk->block->arrive_and_wait(); }

/* Every lane posts v; returns lane src's. Two warp barriers: posts are read only after all are
 * in, and the slots are reused only after all have read. */
static inline uint64_t exchange(uint64_t v, int src) {
    const int w = (int)threadIdx.x >> 5;
    g_blk->xchg[w][threadIdx.x & 31] = v;
    g_blk->warp[w]->arrive_and_wait();
    const uint64_t r = g_blk->xchg[w][src & 31];
    g_blk->warp[w]->arrive_and_wait();
    return r;
}
static inline unsigned __ballot_sync(unsigned, bool p) {
    const int w = (int)threadIdx.x >> 5;
    g_blk->xchg[w][threadIdx.x & 31] = p;
    g_blk->warp[w]->arrive_and_wait();
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= (unsigned)(g_blk->xchg[w][i] != 0) << i;
    g_blk->warp[w]->arrive_and_wait();
    return m;
}
static inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }

/* Runs body(t) for every thread t of one block, each on its own std::thread. */
template <class Body> static void emu_run_block(Body body) {
    std::barrier<> block(32 * kEmuWarps);
    emu_block blk;
    blk.block = &block;
    for (int w = 0; w < kEmuWarps; w++) blk.warp[w] = new std::barrier<>(32);
    g_blk = &blk;
    std::vector<std::thread> th;
    for (int t = 0; t < 32 * kEmuWarps; t++)
        th.emplace_back([&, t] {
            threadIdx.x = (unsigned)t;
            body(t);
        });
    for (auto &x : th) x.join();
    for (int w = 0; w < kEmuWarps; w++) delete blk.warp[w];
}
