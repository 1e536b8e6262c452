/// \file mma.cuh
/// \brief Tensor-core building blocks (sm_80+): the XOR swizzle of a shared-memory tile,
/// ldmatrix (shared memory -> MMA fragments), mma.sync m16n8k16 with fp32 accumulation,
/// and the packing of fp32 accumulators into a 16-bit A operand.
///
/// **Fragments of m16n8k16** (PTX ISA, "Matrix Fragments for mma.m16n8k16"). A warp
/// multiplies A (16 x 16) by B (16 x 8) into C (16 x 8). Lane l is g = l / 4 (its row
/// group) and t = l % 4 (its place in the group); each register holds two 16-bit values
/// with consecutive column (A, C) or row (B) indices, the lower index in the low half:
///
///     A (row-major)  a0: row g,   cols 2t, 2t+1      a2: row g,   cols 2t+8, 2t+9
///                    a1: row g+8, cols 2t, 2t+1      a3: row g+8, cols 2t+8, 2t+9
///     B (col-major)  b0: rows 2t, 2t+1, col g        b1: rows 2t+8, 2t+9, col g
///     C (fp32)       c0, c1: row g,   cols 2t, 2t+1
///                    c2, c3: row g+8, cols 2t, 2t+1
///
/// So a row of C is spread over the 4 lanes of a group: a row's max or sum takes two
/// shuffles (xor 1, xor 2). And the C of two neighbouring n-tiles has exactly the shape of
/// one A fragment: that is why attention's probabilities P can feed the second product
/// straight from registers.
///
/// **Swizzle.** Tiles are stored row-major in 16-byte chunks (8 elements). A row of 64
/// or more elements is a multiple of 128 bytes, so without a swizzle chunk c of every row
/// sits in the same 4 banks, and ldmatrix, which reads chunk c of 8 consecutive rows,
/// would hit those 4 banks 8 times. Storing chunk c of row r at chunk c ^ (r % 8) puts
/// the 8 rows' chunks in 8 different bank groups: one conflict-free shared-memory cycle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashstep::kernels {

/// Element offset of chunk `chunk` (8 elements) of row `row` in a swizzled row-major
/// tile whose rows are `row_elems` long (a multiple of 64 16-bit elements).
__device__ __forceinline__ uint32_t swizzled_offset(uint32_t row, uint32_t chunk, uint32_t row_elems) {
  return row * row_elems + ((chunk ^ (row & 7u)) << 3);
}

/// Shared-memory address of `ptr` as the 32-bit value ldmatrix and cp.async take.
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

/// Four 8x8 16-bit matrices from shared memory into fragments: lanes 8i..8i+7 give the
/// row addresses (16 bytes each) of matrix i, and register i receives matrix i with
/// lane l holding row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// ldmatrix_x4 with each matrix transposed: lane l receives rows 2 (l % 4) and
/// 2 (l % 4) + 1 of column l / 4. Reads a row-major [k][n] tile as a B operand.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// C += A B on one m16n8k16 tile, 16-bit inputs of type T (__half or __nv_bfloat16),
/// fp32 accumulators. Fragments as in the file comment.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

/// fp16 inputs.
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// bf16 inputs.
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two fp32 values rounded into one register of two T, `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

/// fp16: round to nearest even.
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

/// bf16: round to nearest even.
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace flashstep::kernels
