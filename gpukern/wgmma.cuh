/* wgmma.cuh: Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only) for the attention kernels:
 * shared-memory descriptors of 128-byte-swizzled bf16 tiles, the two instruction shapes used,
 * the fences. A tile of R rows x 128 bf16 is two column blocks of 64 (128 bytes a row), each
 * [R rows][128 B] with 16-byte chunk c of row r at chunk c ^ (r % 8), each block 1024-aligned:
 * the same bytes serve as a K-major operand (rows = M or N, the 128 values = K) and as an
 * N-major one (rows = K). The instructions compile only for sm_90a (GK_WGMMA); the address
 * helpers are plain arithmetic. */
#pragma once
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GK_WGMMA 1
#endif

namespace {

/* Byte offset of 16-byte chunk c (of 16) of row r in a swizzled [rows x 128] bf16 tile. */
__device__ __forceinline__ uint32_t sw128_off(int r, int c, int rows)
{
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Descriptor of a 128-byte-swizzled operand at shared address tile + off (tile 16-aligned; shared
 * addresses are below 2^18, so the start field tile / 16 + off / 16 never carries into LBO's bits
 * and the sum of constants folds): lbo / sbo in bytes. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t tile, uint32_t off, uint32_t lbo, uint32_t sbo)
{
    const uint32_t lo = (tile >> 4) + ((off >> 4) + ((lbo >> 4) << 16));  /* start 0-13, LBO 16-29 */
    const uint32_t hi = (sbo >> 4) | (1u << 30);                          /* SBO 32-45, swizzle 62-63 */
    return (uint64_t)hi << 32 | lo;
}

/* K-major operand: rows [0, 64) of a tile (8-row groups 1024 B apart), K step kk of 16 values:
 * 32 B into the 128-byte row, the second column block from kk = 4. */
__device__ __forceinline__ uint64_t wg_desc_k(uint32_t tile, int rows, int kk)
{
    return wg_desc(tile, (uint32_t)((kk >> 2) * rows * 128 + (kk & 3) * 32), 16, 1024);
}

/* N-major operand: rows [16 kt, 16 kt + 16) of a tile as K, its 128 values as N (the second 64
 * of them one column block further). */
__device__ __forceinline__ uint64_t wg_desc_n(uint32_t tile, int rows, int kt)
{
    return wg_desc(tile, (uint32_t)(kt * 16 * 128), (uint32_t)(rows * 128), 1024);
}

#ifdef GK_WGMMA
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Shared memory written by this thread's generic (cp.async, st.shared) accesses becomes visible
 * to the async proxy that wgmma reads through; a barrier must follow before another thread's
 * wgmma reads it. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Pins registers after wg_wait: the compiler may not read them before (volatile asm keeps its
 * order, and each register is an operand of it). */
template <int N> __device__ __forceinline__ void wg_pin(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i]));
}

/* d[64 x 64] = A[64 x 16] B[64 x 16]^T (+ d if accumulate): A and B K-major in shared memory. */
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* d[64 x 128] = A[64 x 16] B[16 x 128] (+ d if accumulate): A in registers (four bf16 pairs per
 * thread, laid out as an accumulator's two n8 tiles), B N-major in shared memory. */
__device__ __forceinline__ void wgmma_m64n128_rs_nt(float (&d)[64], const uint32_t a[4], uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
#endif  /* GK_WGMMA */

} // namespace
