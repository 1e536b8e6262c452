/// \file chunk_decode.cuh
/// \brief Stage 03's first kernel: stage 02's decode loop (02_paged/decode_loop.cuh) over
/// one work item of the plan — one chunk of one request's KV, for the query heads of one
/// kv head — instead of a whole request.
///
/// What differs from stage 02's kernel: a block reads its work item from the schedule in
/// the workspace (request, first page, chunk length; padding of a CUDA-graph-sized grid
/// exits at once), and writes the chunk's normalized state as an fp32 partial row when the
/// plan split (merge_states.cuh combines them), or o and lse directly when it did not.
/// The chapter (README.md, "The two kernels") draws the work items and the grid.
///
/// The fused merge (merge_counters set): no second kernel. Each block that wrote a partial
/// row counts itself on its (request, kv head) counter; the block that brings the count to
/// the request's number of chunks is the last, so every other row is written, and it merges
/// them into o and lse (merge_request_chunks), then puts the counter back to 0 for the next
/// run or graph replay. A request of one chunk writes o and lse directly.
///
///     block (kv head h, item k of request r):  write row k   -> fence -> n = ++count[r][h]
///                                              n < chunks(r): exit
///                                              n = chunks(r): merge rows of r, count[r][h] = 0
#pragma once

#include <cstdint>

#include "02_paged/decode_loop.cuh"
#include "03_split_kv/merge_states.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::split_kv {

/// Arguments of chunk_decode_kernel; raw pointers and sizes only.
/// \tparam T element type of q and o \tparam KV element type of the pool (T, or FP8)
template <typename T, typename KV = T>
struct ChunkDecodeParams {
  const T* q = nullptr;       ///< (batch_size, num_qo_heads, head_dim)
  kernels::PagedKV<KV> kv{};  ///< the page pool and its CSR page table
  // The schedule, in the workspace (written by plan()'s one copy).
  const int32_t* request_indices = nullptr;  ///< (padded_batch_size) request r of work item k
  const int32_t* kv_page_begin =
      nullptr;  ///< (padded_batch_size) kv_indptr[r] + t * c: item k's first page in kv_indices
  const int32_t* kv_chunk_len = nullptr;      ///< (padded_batch_size) tokens of item k's chunk, 0..c * page_size
  const uint8_t* block_valid_mask = nullptr;  ///< (padded_batch_size) 0: padding, exit
  const int32_t* o_indptr = nullptr;          ///< (batch_size + 1) request r's items; read by the fused merge
  /// Fused merge (the FUSED_MERGE kernel): (batch_size, num_kv_heads) counters, 0 between runs.
  int32_t* merge_counters = nullptr;
  // Where the result goes: partial rows (split) or the outputs (no split).
  bool partition_kv = false;     ///< the plan split: write partial rows, else o and lse
  float* partial_o = nullptr;    ///< split: (padded_batch_size, num_qo_heads, head_dim) fp32
  float* partial_lse = nullptr;  ///< split: (padded_batch_size, num_qo_heads) natural log
  T* o = nullptr;                ///< no split: (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;          ///< no split: (batch_size, num_qo_heads) natural log
  int num_qo_heads = 0;          ///< query heads, Hq (the row stride of q, o and the partials)
  int group_size = 0;            ///< num_qo_heads / num_kv_heads
  int bdy = 0;                   ///< ceil(group_size / kHeadsPerThread)
  int bdz = 0;                   ///< kThreads / (kBDX * bdy)
  int num_stages = 0;            ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f;     ///< sm_scale * k_scale * log2(e), folded into q once
  /// Folded into each chunk's normalisation, so the partial rows (and the merge, linear in
  /// them) already carry it.
  float v_scale = 1.f;
};

/// Shared memory (bytes) for a depth and block shape: the larger of the pipeline and the
/// end-of-block merge buffers (one region serves both). \tparam KV element type of the pool
template <typename KV, int HEAD_DIM>
constexpr size_t chunk_decode_smem_bytes(int num_stages, int bdy, int bdz) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  const size_t pipeline = Tr::pipeline_bytes(num_stages);
  const size_t merge = Tr::merge_bytes(bdz, bdy);
  return pipeline > merge ? pipeline : merge;
}

/// The fused merge, by the last block of request b for one kv head: the partial rows
/// first_item .. end_item of the group's query heads, merged exactly (SoftmaxState::merge,
/// as merge_states_kernel does) into o and lse. The whole block works on it, as the merge
/// kernel's blocks do: thread t takes 4 dims (a column) of one head and one lane of rows
/// (rows lane, lane + lanes, ...), folded by the merge kernel's fold_states with 8 loads in
/// flight, through L2 (other blocks wrote the rows); the lanes' states then meet in shared
/// memory and lane 0 writes.
/// \param buf (blockDim.x * 6) floats of shared memory no copy is still writing
template <typename T, int HEAD_DIM, typename KV>
__device__ __forceinline__ void merge_request_chunks(const ChunkDecodeParams<T, KV>& p, int b, int kv_head,
                                                     int first_item, int end_item, float* buf) {
  constexpr int kInFlight = 8;
  const int columns = p.group_size * (HEAD_DIM / 4);  // 4-float columns of the group's heads
  const int threads = blockDim.x;
  const int lanes = columns >= threads ? 1 : threads / columns;
  const int per_pass = threads / lanes;  // columns merged at once
  const int lane = threadIdx.x / per_pass;
  float* lane_o = buf;                                    // [lanes][per_pass][4]
  float* lane_m = lane_o + 4 * threads;                   // [lanes][per_pass]
  float* lane_d = lane_m + threads;                       // [lanes][per_pass]
  for (int base = 0; base < columns; base += per_pass) {  // the same trip count in every thread
    const int col = base + threadIdx.x % per_pass;
    const bool active = lane < lanes && col < columns;
    const int qo_head = kv_head * p.group_size + col / (HEAD_DIM / 4), c = col % (HEAD_DIM / 4);
    kernels::SoftmaxState<4> st;
    st.init();
    if (active) {
      fold_states<HEAD_DIM, kInFlight, true>(st, p.partial_o, p.partial_lse, p.num_qo_heads, qo_head, c,
                                             first_item + lane, end_item, lanes);
      if (lane > 0) {
        const int slot = threadIdx.x;  // = lane * per_pass + column in pass
#pragma unroll
        for (int e = 0; e < 4; ++e) lane_o[4 * slot + e] = st.o[e];
        lane_m[slot] = st.m;
        lane_d[slot] = st.d;
      }
    }
    __syncthreads();
    if (active && lane == 0) {
      for (int l = 1; l < lanes; ++l) {
        const int slot = l * per_pass + threadIdx.x;
        const float o_b[4] = {lane_o[4 * slot], lane_o[4 * slot + 1], lane_o[4 * slot + 2], lane_o[4 * slot + 3]};
        st.merge(lane_m[slot], lane_d[slot], o_b);
      }
      float out[4];
      st.output(out);
      const int64_t row = int64_t{b} * p.num_qo_heads + qo_head;
      store4<T>(p.o + row * HEAD_DIM + c * 4, out);
      if (c == 0) p.lse[row] = st.lse();
    }
    __syncthreads();  // the buffers are reused by the next pass
  }
}

/// Decode attention of one work item: block (kv head, k) computes the group_size query
/// heads of that kv head over the keys of work item k's chunk, and writes their normalized
/// state to partial row k (partition_kv) or to the request's o and lse. grid =
/// (num_kv_heads, padded_batch_size), DecodeTraits::kThreads threads, shared memory
/// chunk_decode_smem_bytes(num_stages, bdy, bdz); two blocks per SM, so at most 128
/// registers a thread. Blocks whose block_valid_mask entry is 0 exit at once.
/// \tparam T element type of q and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam FUSED_MERGE the last block of a split request merges its chunks (the file
///         comment); a separate instantiation, so the plain kernel carries none of it
/// \tparam KV element type of the pool: T, or __nv_fp8_e4m3 / __nv_fp8_e5m2 with a 16-bit T
/// \param p q (batch_size, num_qo_heads, head_dim), the paged KV view, the schedule
///        (padded_batch_size entries each), and the destination: partial_o
///        (padded_batch_size, num_qo_heads, head_dim) and partial_lse (padded_batch_size,
///        num_qo_heads) in fp32, or o (batch_size, num_qo_heads, head_dim) and lse
///        (batch_size, num_qo_heads)
template <typename T, int HEAD_DIM, bool FUSED_MERGE, typename KV = T>
__global__ void __launch_bounds__(256, 2) chunk_decode_kernel(const ChunkDecodeParams<T, KV> p) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  constexpr int BDX = Tr::kBDX, HPT = Tr::kHeadsPerThread, EPT = Tr::kElemsPerThread;
  constexpr int VEC = Tr::kVec, NV = Tr::kVecsPerThread;
  extern __shared__ __align__(16) uint8_t smem_raw[];

  // Every block of this grid is resident in the one wave the plan sized it for, so the
  // merge kernel may be scheduled as soon as blocks start to retire (programmatic
  // dependent launch, sm_90+; it still waits for this grid's writes before reading them).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif

  // ---- which work item: padding of a graph-sized grid exits here. The four schedule
  // loads are independent, so they are issued together, before the branch.
  const int kv_head = blockIdx.x, item = blockIdx.y;
  const uint8_t valid_item = p.block_valid_mask[item];
  const int b = p.request_indices[item];
  const int32_t page_base = p.kv_page_begin[item];  // a chunk starts on a page boundary
  const int chunk_len = p.kv_chunk_len[item];
  if (!valid_item) return;
  // The fused merge needs the request's items; loaded now, used at the end.
  const bool fused = FUSED_MERGE && p.partition_kv;
  const int first_item = fused ? p.o_indptr[b] : 0, end_item = fused ? p.o_indptr[b + 1] : 0;

  // ---- stage 02's loop over the chunk's keys, then the exact merge of the bdz states in
  // the pipeline's memory (free once attend returns).
  paged::DecodeLoop<T, HEAD_DIM, KV> loop(threadIdx.x, p.bdy, p.bdz);
  loop.load_q(p.q, int64_t{b} * p.num_qo_heads + kv_head * p.group_size, p.group_size, p.sm_scale_log2);
  loop.template attend<1, true>(p.kv, kv_head, page_base, chunk_len, 0, (chunk_len + Tr::kTile - 1) / Tr::kTile,
                                reinterpret_cast<KV*>(smem_raw), p.num_stages, [] { __syncthreads(); });
  const bool holds = loop.merge_states(p.bdz, reinterpret_cast<float*>(smem_raw));
  // Without the fused merge a thread that holds no state is done (no barrier follows).
  if constexpr (!FUSED_MERGE) {
    if (!holds) return;
  }

  // ---- write the chunk's normalized state: a partial row (split) or the output itself
  // (no split, or a request of one chunk under the fused merge).
  const bool direct = !p.partition_kv || (fused && end_item - first_item == 1);
  const int tx = loop.tx;
  if (holds) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      if (!loop.holds_head(j, p.group_size)) continue;
      const int qo_head = kv_head * p.group_size + loop.ty * HPT + j;
      float out[EPT];
      loop.state[j].output(out, p.v_scale);
      if (!direct) {
        const int64_t row = int64_t{item} * p.num_qo_heads + qo_head;
        float* dst = p.partial_o + row * HEAD_DIM;
        // fp32 partials: the merge then rounds once, to the output dtype, at the end.
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int w = 0; w < VEC; w += 4)
            *reinterpret_cast<float4*>(dst + (v * BDX + tx) * VEC + w) = make_float4(
                out[v * VEC + w], out[v * VEC + w + 1], out[v * VEC + w + 2], out[v * VEC + w + 3]);
        if (tx == 0) p.partial_lse[row] = loop.state[j].lse();
      } else {
        loop.store_output(j, out, p.o, p.lse, int64_t{b} * p.num_qo_heads + qo_head);
      }
    }
  }
  if constexpr (FUSED_MERGE) {
    if (!fused || direct) return;
    // ---- the fused merge: the last of the request's blocks for this kv head merges.
    __shared__ int is_last;
    __threadfence();  // this block's partial row is visible device-wide before it is counted
    __syncthreads();
    int32_t* counter = p.merge_counters + int64_t{b} * gridDim.x + kv_head;
    if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == end_item - first_item - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();  // and every other block's rows, counted before ours, are read after it
    merge_request_chunks<T, HEAD_DIM>(p, b, kv_head, first_item, end_item, reinterpret_cast<float*>(smem_raw));
    if (threadIdx.x == 0) *counter = 0;  // ready for the next run, or the next graph replay
  }
}

}  // namespace flashstep::stages::split_kv
