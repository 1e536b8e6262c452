/// \file mma_decode.cuh
/// \brief Stage 03's second kernel: the same work items and partial rows as
/// chunk_decode.cuh, with q . k and p v done by mma.sync instead of one fused multiply-add
/// per element and query head.
///
/// Why a second kernel. On an H200 the CUDA-core loop of chunk_decode.cuh runs out of
/// instruction issue before it runs out of bytes (the chapter's "On an H200: instructions,
/// not bytes"): each K/V element costs a multiply-add per query head of the group, plus its
/// share of the shared-memory reads and shuffles, and at 4.4 TB/s an SM must take about
/// 16 bytes a clock. Here the tensor cores take the multiply-adds.
///
/// **The two products, with the keys on the M side.** A decode has one query row per
/// head, so a group of G <= 8 query heads is an n8 operand, and the keys fill M:
///
///     S^T (16 keys x 8 heads)  = K   (16 keys x D)       Q^T (D x 8 heads)      D / 16 MMAs
///     O^T (D x 8 heads)       += V^T (D x 16 keys)       P^T (16 keys x 8 heads)  D / 16 MMAs
///
/// Every accumulator holds heads 2t and 2t+1 in lane group t (mma.cuh's C fragment), in
/// S^T and O^T alike, so each lane rescales its own output columns with its own heads'
/// maxima. P^T, the B operand of the second product, is S^T's C fragment transposed:
/// one movmatrix per 8 keys turns "row g = key g, columns = heads" into "column g = head
/// g, rows = keys".
///
/// **How an element reaches the tensor cores is a policy** (`KVFormat`, below): it loads
/// Q^T's fragments once, K's and V^T's fragments from a landed tile, and says which output
/// dim each accumulator row holds. The lesson's format, `SameAsQ`, reads K and V in q's
/// dtype with ldmatrix (V^T by its transposing form), in mma.cuh's fragment order. An FP8
/// cache is another format (stages/fp8/fp8_kv.cuh: bytes widened to fp16 on the way), and
/// this kernel's body does not change for it.
///
/// **Softmax.** Each warp keeps its own running max and sum per head (its keys are a
/// quarter of every tile), merged across the 4 warps at the end as chunk_decode.cuh
/// merges its token groups. The running max moves only when a new score exceeds it by
/// more than 8 (base 2): until then the probabilities are at most 2^8, well inside fp16,
/// bf16 and fp32, and the rescaling multiplies of the output are skipped — in a long chunk
/// nearly every tile. P is rounded to the operand type for the second product, as stage
/// 04 rounds it; the row sums use the fp32 values.
///
/// **Pipeline.** A tile is 16 keys per warp (64 keys, K then V), copied by cp.async into
/// `num_stages` stages with the XOR swizzle of mma.cuh (16-byte chunk c of key row r at
/// chunk c ^ (r % 8)), so ldmatrix's eight rows, and the FP8 format's reads, touch 32
/// different banks. A copy thread takes consecutive keys of a tile, in at most two pages:
/// their page ids are read one tile ahead and made addresses only after the next wait.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "03_split_kv/chunk_decode.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/paged_kv.cuh"

namespace flashstep::stages::split_kv {

/// Compile-time shape of mma_decode_kernel for head_dim HEAD_DIM and a pool element of
/// ELEM_BYTES bytes.
template <int HEAD_DIM, int ELEM_BYTES>
struct MmaDecodeTraits {
  static constexpr int kWarps = 4;                          ///< warps of a block, each 16 keys of a tile
  static constexpr int kThreads = 32 * kWarps;              ///< threads of a block
  static constexpr int KEYS_PER_WARP = 16;                  ///< one m16 tile of S^T per warp and tile
  static constexpr int TILE = kWarps * KEYS_PER_WARP;       ///< keys per pipeline stage
  static constexpr int ROW_BYTES = HEAD_DIM * ELEM_BYTES;   ///< one key row of K (or V) in shared memory
  static constexpr int CHUNKS = ROW_BYTES / 16;             ///< 16-byte chunks of one row
  static constexpr int KSTEPS = HEAD_DIM / 16;              ///< k-steps of S^T, m-tiles of O^T
  static constexpr int MAX_GROUP = 8;                       ///< query heads per kv head (the n8 operand)
  static constexpr int STAGE_BYTES = 2 * TILE * ROW_BYTES;  ///< K tile, then V tile
  static constexpr int ROWS_PER_PASS = kThreads / CHUNKS;   ///< key rows one copy pass covers
  static constexpr int PASSES = TILE / ROWS_PER_PASS;       ///< copy passes per tile (K and V each)
  static_assert(CHUNKS >= 8 && kThreads % CHUNKS == 0 && TILE % ROWS_PER_PASS == 0,
                "a row must be 8 or more chunks (the swizzle), and a tile whole copy passes");

  /// Bytes of the merge buffers: each warp's o (MAX_GROUP x D fp32), m and sum per head.
  static constexpr size_t merge_bytes() { return size_t(kWarps) * MAX_GROUP * (HEAD_DIM + 2) * sizeof(float); }
  /// Dynamic shared memory of a launch with `num_stages` stages.
  static constexpr size_t smem_bytes(int num_stages) {
    const size_t pipeline = size_t(num_stages) * STAGE_BYTES;
    return pipeline > merge_bytes() ? pipeline : merge_bytes();
  }
  /// Byte offset of 16-byte chunk `c` of key row `r` in a K or V tile.
  __device__ __forceinline__ static uint32_t chunk_offset(int r, int c) {
    return uint32_t(r) * ROW_BYTES + (uint32_t(c ^ (r & 7)) << 4);
  }
};

/// The transpose of an 8x8 matrix of 16-bit elements held as one register per lane (row
/// lane / 4, columns 2 (lane % 4) and +1). PTX movmatrix; no CUDA API wraps it.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/// The lesson's K/V format: the pool holds K and V in q's dtype T (fp16 or bf16), and the
/// MMAs take them as they are. Every hook below is one a format must have:
///   - `Stored`, the pool's element, and `Operand`, the MMAs' input type;
///   - `q_fragments`: Q^T's B fragments of the block's heads, and the factor of a score
///     unit (a format may scale q into its operand's range);
///   - `KFrags` / `load_k` / `k_fragment`: a lane's share of K for its warp's 16 keys,
///     read from a landed tile, then the A fragment of each k-step;
///   - `VFrags` / `load_v` / `vt_fragment`: the same for V^T, per m-tile of dims;
///   - `o_dims`: the dims rows g and g+8 of m-tile i of O^T hold.
/// Fragment order is mma.cuh's: k-step s of S^T covers dims 16s .. 16s+15, m-tile i of
/// O^T dims 16i .. 16i+15.
template <typename T>
struct SameAsQ {
  using Stored = T;   ///< the pool's element: q's dtype
  using Operand = T;  ///< the MMAs' input type: the same

  /// Q^T's B fragments: lane (g, t) holds head g's dims 16s+2t, +1 and 16s+2t+8, +9 for
  /// every k-step s (zero where the group has no head g). q's bits go in as they are.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void q_fragments(const T* q_row, bool has_head, int lane,
                                                     uint32_t (&qb)[HEAD_DIM / 16][2], float& unit) {
    const int t = lane % 4;
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q_row);
#pragma unroll
    for (int s = 0; s < HEAD_DIM / 16; ++s) {
      qb[s][0] = has_head ? q32[(16 * s + 2 * t) / 2] : 0u;
      qb[s][1] = has_head ? q32[(16 * s + 2 * t + 8) / 2] : 0u;
    }
    unit = 1.f;
  }

  /// A lane's K: the start of the key row its ldmatrix reads, and the XOR its chunks take.
  struct KFrags {
    uint32_t row;  ///< shared-memory address of the row
    uint32_t x;    ///< chunk 2s + x0 sits at chunk (2s + x0) ^ (r % 8) = 2s ^ x
  };
  /// This lane's K of the warp's 16 keys (rows row0 ..) of a landed K tile.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void load_k(KFrags& k, const uint8_t* tile, int row0, int lane) {
    // A fragment of K (keys x dims): matrices (keys 0-7, chunk 2s), (keys 8-15, 2s),
    // (keys 0-7, 2s+1), (keys 8-15, 2s+1); lanes 8j .. 8j+7 give matrix j's rows.
    const int r = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
    k.row = kernels::smem_u32(tile) + uint32_t(r) * MmaDecodeTraits<HEAD_DIM, sizeof(T)>::ROW_BYTES;
    k.x = uint32_t((lane >> 4) ^ (r & 7));
  }
  /// K's A fragment of k-step s (dims 16s .. 16s+15).
  template <int HEAD_DIM>
  __device__ __forceinline__ static void k_fragment(const KFrags& k, int s, uint32_t (&a)[4]) {
    kernels::ldmatrix_x4(a, k.row + ((uint32_t(2 * s) ^ k.x) << 4));
  }

  /// A lane's V: as KFrags, for the transposing ldmatrix of V^T.
  struct VFrags {
    uint32_t row;  ///< shared-memory address of the row
    uint32_t x;    ///< chunk 2i + x0 sits at chunk 2i ^ x
  };
  /// This lane's V of the warp's 16 keys (rows row0 ..) of a landed V tile.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void load_v(VFrags& v, const uint8_t* tile, int row0, int lane) {
    // A fragment of V^T (dims x keys) from V (keys x dims), transposed by ldmatrix:
    // matrices (keys 0-7, chunk 2i), (keys 0-7, 2i+1), (keys 8-15, 2i), (keys 8-15, 2i+1).
    const int r = row0 + (lane & 7) + (lane >> 4) * 8;
    v.row = kernels::smem_u32(tile) + uint32_t(r) * MmaDecodeTraits<HEAD_DIM, sizeof(T)>::ROW_BYTES;
    v.x = uint32_t(((lane >> 3) & 1) ^ (r & 7));
  }
  /// V^T's A fragment of m-tile i (dims 16i .. 16i+15).
  template <int HEAD_DIM>
  __device__ __forceinline__ static void vt_fragment(const VFrags& v, int i, uint32_t (&a)[4]) {
    kernels::ldmatrix_x4_trans(a, v.row + ((uint32_t(2 * i) ^ v.x) << 4));
  }

  /// Rows g and g+8 of m-tile i hold dims 16i+g and 16i+g+8.
  __device__ __forceinline__ static int2 o_dims(int i, int g) { return make_int2(16 * i + g, 16 * i + g + 8); }
};

/// Decode attention of one work item on the tensor cores: block (kv head, k) computes the
/// group_size (<= 8) query heads of that kv head over the keys of work item k's chunk and
/// writes their normalized state to partial row k (partition_kv) or to the request's o
/// and lse — chunk_decode_kernel's contract.
/// grid = (num_kv_heads, padded_batch_size), MmaDecodeTraits::kThreads threads, dynamic
/// shared memory MmaDecodeTraits::smem_bytes(p.num_stages).
/// \tparam T element type of q and o (__half or __nv_bfloat16)
/// \tparam Format how K/V elements reach the MMAs (SameAsQ<T>, or stages/fp8/'s)
template <typename T, int HEAD_DIM, typename Format>
__global__ void __launch_bounds__(MmaDecodeTraits<HEAD_DIM, sizeof(typename Format::Stored)>::kThreads)
    mma_decode_kernel(const ChunkDecodeParams<T, typename Format::Stored> p) {
  using KV = typename Format::Stored;
  using Tr = MmaDecodeTraits<HEAD_DIM, sizeof(KV)>;
  extern __shared__ __align__(128) uint8_t smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // as chunk_decode_kernel: the merge may be scheduled early
#endif

  // ---- which work item (padding of a graph-sized grid exits here).
  const int kv_head = blockIdx.x, item = blockIdx.y;
  const uint8_t valid_item = p.block_valid_mask[item];
  const int b = p.request_indices[item];
  const int32_t page_begin = p.kv_page_begin[item];
  const int len = p.kv_chunk_len[item];
  if (!valid_item) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma.cuh's row group and place in it
  const int G = p.group_size;

  // ---- Q^T's B fragments (every warp loads the same: L1 hits), and a score unit's scale.
  uint32_t qb[Tr::KSTEPS][2];
  float unit;
  const int64_t q_row = int64_t{b} * p.num_qo_heads + int64_t{kv_head} * G + (g < G ? g : 0);
  Format::template q_fragments<HEAD_DIM>(p.q + q_row * HEAD_DIM, g < G, lane, qb, unit);
  const float scale = p.sm_scale_log2 * unit;  // base-2 score of one unit of the S^T product

  // ---- this warp's running state: heads 2t and 2t+1 (base-2 max, lane-partial sum), and
  // O^T's accumulators: o[i] = {(dim x, head 2t), (x, 2t+1), (y, 2t), (y, 2t+1)} for
  // (x, y) = Format::o_dims(i, g).
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float o[Tr::KSTEPS][4];
#pragma unroll
  for (int i = 0; i < Tr::KSTEPS; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  // ---- the copies: thread tid copies chunk tid % CHUNKS of PASSES consecutive key rows,
  // (tid / CHUNKS) * PASSES + 0 .. PASSES-1 of each tile, of K and of V. Pages hold at least
  // kMmaMinPageSize >= PASSES keys (split_kv.cu asserts it), so a thread's rows lie in at most
  // two pages: fetch() reads their two ids a tile ahead, and issue() turns them into addresses
  // only once they have long landed, so no warp waits on the page table between tiles.
  const uint8_t* pool = reinterpret_cast<const uint8_t*>(p.kv.pool);
  const int64_t v_bytes = p.kv.stride_kv * int64_t{sizeof(KV)};
  const int64_t token_bytes = p.kv.stride_token * int64_t{sizeof(KV)};
  const int64_t head_bytes = kv_head * p.kv.stride_head * int64_t{sizeof(KV)};
  const int copy_chunk = threadIdx.x % Tr::CHUNKS, copy_row = (threadIdx.x / Tr::CHUNKS) * Tr::PASSES;
  const int num_tiles = (len + Tr::TILE - 1) / Tr::TILE;
  const int S = p.num_stages;
  struct Rows {
    int32_t page[2];  // the ids of the pages of the thread's first row and of the next
    uint32_t slot;    // the first row's slot in page[0]
    int valid;        // rows before the end of the chunk, 0 .. PASSES
  } next;
  auto fetch = [&](int tile) {
    const int tok = tile * Tr::TILE + copy_row;
    uint32_t page_iter, slot;
    p.kv.page_size.divmod(static_cast<uint32_t>(tok), page_iter, slot);
    const int in_first = static_cast<int>(p.kv.page_size.divisor - slot);  // rows in page[0]
    next.slot = slot;
    next.valid = min(max(len - tok, 0), Tr::PASSES);
    next.page[0] = next.valid > 0 ? p.kv.kv_indices[page_begin + page_iter] : 0;
    next.page[1] = next.valid > in_first ? p.kv.kv_indices[page_begin + page_iter + 1] : next.page[0];
  };
  auto issue = [&](int stage) {
    uint8_t* base = smem + stage * Tr::STAGE_BYTES;
    const int in_first = static_cast<int>(p.kv.page_size.divisor - next.slot);
    // byte offsets of the rows' chunk in the first page and (counted from the same first
    // slot) in the second
    const int64_t at0 = next.page[0] * p.kv.stride_page * int64_t{sizeof(KV)} + next.slot * token_bytes + head_bytes +
                        copy_chunk * 16;
    const int64_t at1 = at0 + (next.page[1] - int64_t{next.page[0]}) * p.kv.stride_page * int64_t{sizeof(KV)} -
                        int64_t{p.kv.page_size.divisor} * token_bytes;
#pragma unroll
    for (int r = 0; r < Tr::PASSES; ++r) {
      uint8_t* dst = base + Tr::chunk_offset(copy_row + r, copy_chunk);
      const bool ok = r < next.valid;
      const uint8_t* from = pool + (ok ? (r < in_first ? at0 : at1) + r * token_bytes : 0);
      kernels::cp_async_16(dst, from, ok);  // rows past the chunk are zero-filled
      kernels::cp_async_16(dst + Tr::TILE * Tr::ROW_BYTES, from + (ok ? v_bytes : 0), ok);
    }
  };

  // ---- one tile: S^T, the softmax update, O^T += V^T P^T (this warp's 16 keys).
  auto compute = [&](int stage, int tile_start) {
    const uint8_t* ks = smem + stage * Tr::STAGE_BYTES;
    const uint8_t* vs = ks + Tr::TILE * Tr::ROW_BYTES;
    const int row0 = warp * Tr::KEYS_PER_WARP;
    typename Format::KFrags kf;
    Format::template load_k<HEAD_DIM>(kf, ks, row0, lane);
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int st = 0; st < Tr::KSTEPS; ++st) {
      uint32_t a[4];
      Format::template k_fragment<HEAD_DIM>(kf, st, a);
      kernels::mma_m16n8k16<typename Format::Operand>(s, a, qb[st][0], qb[st][1]);
    }
    // s: (key g, head 2t), (key g, 2t+1), (key g+8, 2t), (key g+8, 2t+1); keys past the chunk masked
    const int key0 = tile_start + row0 + g;
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = (key0 + (j / 2) * 8 < len) ? s[j] * scale : -INFINITY;
    float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
    for (int x = 4; x <= 16; x *= 2) {
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], x));
      mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], x));
    }
    // Move the max only when a score passes it by more than 2^8 (or on the first keys).
    const bool grow = mx[0] > m[0] + 8.f || mx[1] > m[1] + 8.f;
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mn = fmaxf(m[h], mx[h]);
        const float alpha = (m[h] == -INFINITY) ? 0.f : exp2f(m[h] - mn);
        m[h] = mn;
        l[h] *= alpha;
#pragma unroll
        for (int i = 0; i < Tr::KSTEPS; ++i) o[i][h] *= alpha, o[i][h + 2] *= alpha;
      }
    }
    const float m0 = m[0] == -INFINITY ? 0.f : m[0], m1 = m[1] == -INFINITY ? 0.f : m[1];
    const float p0 = exp2f(s[0] - m0), p1 = exp2f(s[1] - m1), p2 = exp2f(s[2] - m0), p3 = exp2f(s[3] - m1);
    l[0] += p0 + p2;
    l[1] += p1 + p3;
    // P^T's B fragment: rows (keys) 2t, 2t+1 / 2t+8, 2t+9 of column (head) g.
    using Op = typename Format::Operand;
    const uint32_t pb0 = movmatrix_trans(kernels::pack2<Op>(p0, p1));
    const uint32_t pb1 = movmatrix_trans(kernels::pack2<Op>(p2, p3));
    typename Format::VFrags vf;
    Format::template load_v<HEAD_DIM>(vf, vs, row0, lane);
#pragma unroll
    for (int i = 0; i < Tr::KSTEPS; ++i) {
      uint32_t a[4];
      Format::template vt_fragment<HEAD_DIM>(vf, i, a);
      kernels::mma_m16n8k16<Op>(o[i], a, pb0, pb1);
    }
  };

  // ---- the pipeline, as attend_chunk's: S - 1 tiles in flight while one is computed.
  for (int st = 0; st < S - 1; ++st) {
    if (st < num_tiles) {
      fetch(st);
      issue(st);
    }
    kernels::cp_async_commit_group();
  }
  if (S - 1 < num_tiles) fetch(S - 1);
  int read_stage = 0, write_stage = S - 1;  // i % S and (i + S - 1) % S, without a division
  for (int i = 0; i < num_tiles; ++i) {
    kernels::cp_async_wait_group_dynamic(S - 2);
    __syncthreads();
    const int next = i + S - 1;
    if (next < num_tiles) issue(write_stage);
    kernels::cp_async_commit_group();
    if (next + 1 < num_tiles) fetch(next + 1);
    compute(read_stage, i * Tr::TILE);
    read_stage = read_stage + 1 == S ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == S ? 0 : write_stage + 1;
  }
  kernels::cp_async_wait_group<0>();
  __syncthreads();  // the pipeline memory is free for the merge

  // ---- each warp's state to shared memory: m and the full sum per head, o per (head, dim).
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int x = 4; x <= 16; x *= 2) l[h] += __shfl_xor_sync(0xffffffffu, l[h], x);
  float* m_buf = reinterpret_cast<float*>(smem);      // [warp][MAX_GROUP]
  float* l_buf = m_buf + Tr::kWarps * Tr::MAX_GROUP;  // [warp][MAX_GROUP]
  float* o_buf = l_buf + Tr::kWarps * Tr::MAX_GROUP;  // [warp][MAX_GROUP][HEAD_DIM]
  if (g == 0) {
    m_buf[warp * Tr::MAX_GROUP + 2 * t] = m[0], m_buf[warp * Tr::MAX_GROUP + 2 * t + 1] = m[1];
    l_buf[warp * Tr::MAX_GROUP + 2 * t] = l[0], l_buf[warp * Tr::MAX_GROUP + 2 * t + 1] = l[1];
  }
#pragma unroll
  for (int i = 0; i < Tr::KSTEPS; ++i) {
    const int2 dims = Format::o_dims(i, g);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = o_buf + (warp * Tr::MAX_GROUP + 2 * t + h) * HEAD_DIM;
      row[dims.x] = o[i][h];
      row[dims.y] = o[i][h + 2];
    }
  }
  __syncthreads();

  // ---- merge the warps and write: 4 consecutive dims of one head per thread and pass.
  for (int e = 4 * threadIdx.x; e < G * HEAD_DIM; e += 4 * Tr::kThreads) {
    const int h = e / HEAD_DIM, d = e % HEAD_DIM;
    float mmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) mmax = fmaxf(mmax, m_buf[w * Tr::MAX_GROUP + h]);
    float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float mw = m_buf[w * Tr::MAX_GROUP + h];
      const float f = (mw == -INFINITY) ? 0.f : exp2f(mw - mmax);
      sum += f * l_buf[w * Tr::MAX_GROUP + h];
      const float4 ow = *reinterpret_cast<const float4*>(o_buf + (w * Tr::MAX_GROUP + h) * HEAD_DIM + d);
      acc[0] += f * ow.x, acc[1] += f * ow.y, acc[2] += f * ow.z, acc[3] += f * ow.w;
    }
    const float inv = sum > 0.f ? p.v_scale / sum : 0.f;
    const float lse = sum > 0.f ? (mmax + log2f(sum)) * 0.69314718055994531f : -INFINITY;
    const int qo_head = kv_head * G + h;
    if (p.partition_kv) {
      const int64_t row = int64_t{item} * p.num_qo_heads + qo_head;
      *reinterpret_cast<float4*>(p.partial_o + row * HEAD_DIM + d) = make_float4(acc[0] * inv, acc[1] * inv,
                                                                                 acc[2] * inv, acc[3] * inv);
      if (d == 0) p.partial_lse[row] = lse;
    } else {
      const int64_t row = int64_t{b} * p.num_qo_heads + qo_head;
      T* dst = p.o + row * HEAD_DIM + d;
      dst[0] = static_cast<T>(acc[0] * inv), dst[1] = static_cast<T>(acc[1] * inv);
      dst[2] = static_cast<T>(acc[2] * inv), dst[3] = static_cast<T>(acc[3] * inv);
      if (d == 0 && p.lse != nullptr) p.lse[row] = lse;
    }
  }
}

}  // namespace flashstep::stages::split_kv
