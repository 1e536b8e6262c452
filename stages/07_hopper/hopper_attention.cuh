// Stage 07 — prefill attention on Hopper: the TMA copies tiles into shared memory, wgmma
// multiplies them, and the warp groups of a block specialise.
//
// What changes from stage 04 (prefill_attention.cuh), and why it is faster:
// - Loads: one thread issues a bulk tensor copy (TMA, cp.async.bulk.tensor) per 64
//   columns of a tile; the copy engine computes every address, swizzles the rows as it
//   writes them (128-byte swizzle) and signals an mbarrier when the bytes have landed.
//   Stage 04 spent its threads' issue slots on address arithmetic and cp.async.
// - MMAs: wgmma.mma_async m64nNk16 runs a 64 x N x 16 product per instruction for a
//   warp group (four warps) reading both operands of S = Q K^T straight from shared
//   memory, and P from registers for O += P V. Stage 04's mma.sync m16n8k16 needs every
//   fragment loaded into registers first (ldmatrix), and issues 16x more instructions.
// - Warp specialisation: warp group 0 only loads (its registers given to the others with
//   setmaxnreg), warp groups 1 and 2 only compute, each on 64 of the tile's 128 query
//   rows (at head_dim 64 three groups, 192 rows: HopperTraits::kConsumers). A ring of
//   kStages K/V buffers decouples them: the producer fills stage s while the consumers
//   read stage s - 1; full and empty mbarriers hand each stage over.
//
//   producer (WG 0)   Q | K0 V0 | K1 V1 | wait empty0 | K2 V2 | wait empty1 | K3 V3 ...
//   consumer (WG 1)       wait K0: S = Q K0^T, softmax, wait V0: O += P V0, free 0 | K1 ...
//   consumer (WG 2)       (the same on query rows 64..127)
//
// - Ping-pong: the consumer warp groups take turns issuing their GEMMs (named
//   barriers), so one group's softmax runs while the other's GEMMs hold the tensor cores;
//   each turn issues S_j = Q K_j^T together with P_{j-1} V_{j-1}.
//
// - Overlap inside a warp group: S_j and P_{j-1} V_{j-1} are two commit groups; the
//   softmax of S_j waits only for the first (wgmma.wait_group 1): both rows' maxima and
//   row 0's exponentials run while the second still accumulates into O, row 1's after
//   it (a branch holds that split in the SASS: split_softmax_at_wait). O's rescale and
//   P_j's packing wait for the second.
//   At head_dim_vo >= 128 the running max moves only when a tile's passes it by more
//   than a factor of 2^8, so most turns skip the rescale (FlashAttention-4's conditional
//   rescaling; kMaxSlack).
//
// - Paged K/V (PAGED = true): a tile of 128 keys may come from 128 different pages, which
//   no one box of a tensor map describes; but one page's rows are a box of the pool seen
//   as a 5-D tensor. With pages of 8, 16, 32 or 64 tokens the TMA copies a tile one page
//   at a time (copy_pages), every 64-column block at once: over pages the tiles lie atom
//   by atom (8 rows of every column block, then the next 8; HopperTraits::kAtomsOuter).
//   A request's last tile (whose keys past kv_len must be zeros) and pages of other sizes
//   are gathered by the producer's four warps: each thread looks up the page of its rows
//   and issues 16-byte cp.async copies straight into the same swizzled layout (chunk c of
//   row r at chunk c ^ (r % 8)), and cp.async.mbarrier.arrive makes the tile's "full"
//   barrier complete when they land.
//
// - Policies (kernels/attention_policy.cuh): the kernel takes a compile-time Policy and calls
//   its on_logit hook on each score tile (only a policy that transforms logits, such as
//   stages/soft_cap/'s, gets the scores scaled first) and its on_state hook on each row's
//   finished (m, l) before the epilogue normalises it. The lesson runs the identity; the
//   soft cap and attention sinks (stages/sinks/) are policies of their own.
//
// - A persistent grid (prefill): one block per multiprocessor. The producer claims the
//   block's next unit from a counter as it starts one and hands its number and Tile to
//   the consumers beside its Q; the K/V ring and the consumers' turns run on from unit to
//   unit, and a consumer frees Q after the unit's last S, so the next unit's Q and first
//   tiles land during its last P V and while its rows are written.
//
// - The output (head_dim 64 and 128): each consumer writes its 64 normalised rows into a
//   swizzled stage in shared memory and one thread stores them with the TMA
//   (store_tile_tma); the next unit starts while the copy engine writes. Tails of requests,
//   splits and the wider head dims write from registers (store_tile).
//
// What it still does badly: a decode batch still runs a block per unit, and over pages of
// 16 a tile is 8 copies where a contiguous tile takes 2 (0.87-0.93 of its speed, H200).
#pragma once

#include <cuda/ptx>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "04_tensor_core/prefill_attention.cuh"  // exp2_approx
#include "07_hopper/mbarrier.cuh"
#include "07_hopper/wgmma.cuh"
#include "flashstep/kernels/attention_policy.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/paged_kv.cuh"

namespace flashstep::stages::hopper {

/// Consumer warp groups of a block, each on 64 of the tile's query rows: two, and three at
/// head_dim 64, where a tile's GEMMs take half the time of head_dim 128's for the same
/// softmax, so that two groups' softmax can run while the third's GEMMs hold the tensor
/// cores (as FlashAttention-3 runs head_dim 64: 192 rows a block). The kernel's traits and
/// the host's planner both ask this one rule.
constexpr int consumer_groups(int head_dim, int head_dim_vo) { return head_dim == 64 && head_dim_vo == 64 ? 3 : 2; }

/// Tile sizes and the shared-memory plan of one instantiation: q and k HEAD_DIM wide, v
/// and o HEAD_DIM_VO (the same, but for MLA's prefill: 192 and 128).
template <typename T, int HEAD_DIM, bool PAGED = false, int HEAD_DIM_VO = HEAD_DIM>
struct HopperTraits {
  static constexpr int kConsumers = consumer_groups(HEAD_DIM, HEAD_DIM_VO);  ///< consumer warp groups
  static constexpr int Br = 64 * kConsumers;                                 ///< packed query rows per block
  /// keys per K/V tile. head_dim 256 takes 64: a 128 x 256 tile is 64 KiB, and Q plus two
  /// stages of K and V at 128 keys (320 KiB) would not fit the 227 KiB a block may have;
  /// at 64 keys they take 192 KiB. (O is 128 fp32 registers per consumer thread there.)
  static constexpr int Bc = HEAD_DIM == 256 ? 64 : 128;
  static constexpr int kStages = 2;  ///< K/V buffers in the ring
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // setmaxnreg: what the producer keeps and each consumer gets, out of the 65536 registers
  // of the multiprocessor: 128 x 24 + 256 x 240 and 128 x 64 + 256 x 216 with two
  // consumers, 128 x 24 + 384 x 160 with three (FlashAttention-3's 160 too). A gathering
  // producer holds a thread's eight page ids at once, and over the persistent grid its
  // unit's state besides: at 56 (consumers 224) ptxas spilled some of it inside the
  // gather's loop, at 64 only a few words once a unit, and no consumer spills at 216.
  static constexpr int kProducerRegisters = PAGED ? 64 : 24;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? (PAGED ? 144 : 160) : PAGED ? 216 : 240;
  static_assert(128 * kProducerRegisters + 128 * kConsumers * kConsumerRegisters <= 65536,
                "setmaxnreg: the warp groups' registers exceed the multiprocessor's");
  static constexpr uint32_t kKVFullArrivals = PAGED ? 128 : 1;  ///< gather: one per producer thread
  static constexpr int kBlockCols = 64;                         ///< elements per 128-byte swizzled row
  static constexpr int kColBlocks = HEAD_DIM / kBlockCols;
  /// Over pages the K and V tiles lie atom by atom: rows 0-7 of every 64-column block, then
  /// rows 8-15, ... ([row / 8][column block][row % 8][64 columns]), so a page's rows (a
  /// whole number of 8-row atoms) are one span of shared memory and one TMA copy. Over
  /// contiguous K/V a tile is one 64-column block after the other ([column block][row][64
  /// columns]), one copy per block. Q is always the latter.
  static constexpr bool kAtomsOuter = PAGED;
  static constexpr uint32_t kQBytes = Br * HEAD_DIM * sizeof(T);
  static constexpr uint32_t kKBytes = Bc * HEAD_DIM * sizeof(T);     ///< one K tile
  static constexpr uint32_t kVBytes = Bc * HEAD_DIM_VO * sizeof(T);  ///< one V tile
  static constexpr uint32_t kOBytes = Br * HEAD_DIM_VO * sizeof(T);  ///< the output tile
  // [Q][K0][V0][K1][V1]...[O][barriers], each tile 1024-byte aligned (the swizzle atom)
  static constexpr uint32_t kOOffset = kQBytes + kStages * (kKBytes + kVBytes);
  static constexpr uint32_t kBarrierBytes = 8 * (2 + 4 * kStages);
  /// The block's shared memory with the barriers at `barrier_offset`: the 1024 bytes that
  /// align the base, the tiles, the barriers, four ints (the unit of the Q in shared memory,
  /// the producer's next unit, two, and one unused) and the unit's Tile (64 bytes), which
  /// the producer works out for the consumers.
  static constexpr size_t bytes_with_barriers_at(uint32_t barrier_offset) {
    return 1024 + barrier_offset + kBarrierBytes + 16 + 64;
  }
  /// The output leaves through shared memory and a TMA store where its tile fits beside Q
  /// and the ring in the 227 KiB a block may have: head_dim 64 and 128 (not 256, nor
  /// MLA's 192 / 128, which write from registers).
  static constexpr bool kStoreByTma = bytes_with_barriers_at(kOOffset + kOBytes) <= 227 * 1024;
  static constexpr uint32_t kBarrierOffset = kOOffset + (kStoreByTma ? kOBytes : 0);
  static constexpr uint32_t kTileOffset = kBarrierOffset + kBarrierBytes + 16;
  static constexpr size_t smem_bytes() { return bytes_with_barriers_at(kBarrierOffset); }
  static_assert(HEAD_DIM % kBlockCols == 0 && HEAD_DIM_VO % kBlockCols == 0,
                "head_dim and head_dim_vo must be multiples of 64");
};

/// What the kernel reads. The tensor maps describe q (nnz_qo, Hq, D) and, over ragged
/// K/V, k and v (nnz_kv, Hkv, D) as 3-D tensors (D, heads, tokens) with boxes of
/// 64 x heads x tokens. Over paged K/V, `kv` is the pool and its page table.
struct HopperParams {
  CUtensorMap q_map;  ///< box (64, group, Br / group): one 64-column block of a packed query tile
  CUtensorMap k_map;  ///< ragged: box (64, 1, Bc)
  CUtensorMap v_map;  ///< ragged: box (64, 1, Bc)
  /// paged, pages of a multiple of 8 tokens: the pool as a 5-D tensor (64 columns, 8 rows,
  /// column blocks, 8-row groups, pages) with the head among the column blocks (NHD) or
  /// among the pages (HND), box (64, 8, D / 64, rows / 8, 1): a page's rows of one head in
  /// every column block, rows = tma_rows (make_pool_map in hopper.cu)
  CUtensorMap kv_map;
  int tma_rows = 0;                          ///< paged: tokens per page copy (page_size); 0: gather every tile
  bool hnd = false;                          ///< paged: the pool's layout is HND
  kernels::PagedKV<uint16_t> kv{};           ///< paged: pool (16-bit elements), CSR page table, strides
  const int32_t* qo_indptr = nullptr;        ///< (batch_size + 1)
  const int32_t* kv_indptr = nullptr;        ///< ragged: (batch_size + 1) token offsets
  const int32_t* request_indices = nullptr;  ///< (num_items): request of work item i
  const int32_t* qo_tile_indices = nullptr;  ///< (num_items): query tile of work item i
  void* o = nullptr;                         ///< (nnz_qo, Hq, D_vo), T
  float* lse = nullptr;                      ///< (nnz_qo, Hq), natural log
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  bool heads_fastest = false;  ///< the grid: (items x kv heads) with the heads fastest, else (items, kv heads)
  int group_size = 1;          ///< Hq / Hkv, divides Br: the packed rows of a token
  bool causal = false;         ///< bottom-right aligned
  int window_left = -1;        ///< keep keys j >= i + (kv_len - qo_len) - window_left; -1 off
  float score_scale = 0.f;     ///< sm_scale * log2(e): q.k to a base-2 logit
  // the KV split (kv_chunk_size > 0): work item i reads chunk kv_chunk_indices[i] and
  // writes fp32 partial states, which stage 03's merge kernel (or stage 05's) folds
  const int32_t* kv_chunk_indices = nullptr;  ///< (num_items)
  int kv_chunk_size = 0;                      ///< keys per chunk; 0: no split
  const int32_t* partial_indptr = nullptr;    ///< (nnz_qo + 1): query token t's partial rows
  float* partial_o = nullptr;                 ///< (partial rows, Hq, D_vo)
  float* partial_lse = nullptr;               ///< (partial rows, Hq), natural log
  // paged, V of its own width (HEAD_DIM_VO != HEAD_DIM, MLA's prefill): V's own pool, one
  // plane a page, and `kv` then K's pool alone (last, so the other kernels' parameters
  // keep their offsets)
  CUtensorMap v_pool_map;             ///< as kv_map, over V's pool, HEAD_DIM_VO wide
  kernels::PagedKV<uint16_t> v_kv{};  ///< V's pool, its page table and strides
  int num_items = 0;                  ///< work items; a unit of work is (item, kv head)
  /// o as q_map describes q, box (64, group, 64 / group): one consumer's 64 rows of one
  /// 64-column block, for the TMA store of a tile whose rows all exist (o_by_tma: set where
  /// HopperTraits::kStoreByTma, o is 16-byte aligned, the group divides 64 and no split)
  CUtensorMap o_map;
  bool o_by_tma = false;
  /// The persistent grid's claims: zero when the kernel starts, and again when it ends.
  /// Null: block b takes units b, b + grid, ... (one each when the grid has a block a unit).
  int* unit_counter = nullptr;
};

namespace detail {

namespace ptx = cuda::ptx;

/// The work of one block: a request's query tile against a range of its keys (all of
/// them, or one chunk of a split), for one kv head.
struct alignas(16) Tile {
  int request, qo_begin, qo_len, kv_len;
  int kv_begin;             ///< ragged: first token of the request in k/v; paged: its first kv_indices entry
  int row_begin;            ///< first packed row of the tile: token row_begin / group, head row_begin % group
  int chunk;                ///< kv chunk of a split, else 0
  int chunk_end;            ///< keys from here on belong to another chunk (or do not exist)
  int key_begin;            ///< first key the block reads: its chunk's, or the window's if later
  int first_pos, last_pos;  ///< positions among the keys of the tile's first and last query token
  int num_kv_tiles;
};
static_assert(sizeof(Tile) <= 64, "HopperTraits keeps 64 bytes of shared memory for a Tile");

template <int Br, int Bc, bool PAGED>
__device__ __forceinline__ Tile make_tile(const HopperParams& p, int item) {
  Tile t;
  t.request = p.request_indices[item];
  t.qo_begin = p.qo_indptr[t.request];
  t.qo_len = p.qo_indptr[t.request + 1] - t.qo_begin;
  if constexpr (PAGED) {
    t.kv_begin = p.kv.kv_indptr[t.request];  // the request's first entry of kv_indices
    t.kv_len = p.kv.kv_len(t.request);
  } else {
    t.kv_begin = p.kv_indptr[t.request];  // the request's first token in k and v
    t.kv_len = p.kv_indptr[t.request + 1] - t.kv_begin;
  }
  t.row_begin = p.qo_tile_indices[item] * Br;
  t.chunk = p.kv_chunk_size ? p.kv_chunk_indices[item] : 0;
  const int chunk_begin = t.chunk * p.kv_chunk_size;
  t.chunk_end = p.kv_chunk_size ? min(t.kv_len, chunk_begin + p.kv_chunk_size) : t.kv_len;
  // query token i sits at key position i + (kv_len - qo_len): it sees keys up to there
  // (causal) and from there - window_left on (window)
  const int delta = t.kv_len - t.qo_len;
  const int row_end = min(t.row_begin + Br, t.qo_len * p.group_size);
  t.first_pos = t.row_begin / p.group_size + delta;
  t.last_pos = (row_end - 1) / p.group_size + delta;
  int lo = chunk_begin, hi = t.chunk_end;
  if (p.causal) hi = min(hi, t.last_pos + 1);
  if (p.window_left >= 0) lo = max(lo, t.first_pos - p.window_left);
  t.key_begin = lo;
  t.num_kv_tiles = hi > lo ? (hi - lo + Bc - 1) / Bc : 0;
  return t;
}

/// Lane 0's copy of the Tile in shared memory, handed to every lane of its warp.
__device__ __forceinline__ Tile lane0_tile(const Tile* src, int lane) {
  constexpr int kWords = sizeof(Tile) / sizeof(int);
  int v[kWords] = {};
  if (lane == 0) memcpy(v, src, sizeof(Tile));
#pragma unroll
  for (int i = 0; i < kWords; ++i) v[i] = __shfl_sync(0xffffffffu, v[i], 0);
  Tile t;
  memcpy(&t, v, sizeof(Tile));
  return t;
}

/// A unit of work: one work item for one kv head. Block b of the persistent grid takes
/// units b, b + gridDim.x, b + 2 gridDim.x, ... of the list, which runs with the kv heads
/// fastest for a decode batch and the work items fastest otherwise (launch() says why);
/// the items are longest first.
struct Unit {
  int item, kv_head;
};

__device__ __forceinline__ Unit unit_of(const HopperParams& p, int u) {
  return p.heads_fastest ? Unit{u / p.num_kv_heads, u % p.num_kv_heads} : Unit{u % p.num_items, u / p.num_items};
}

/// The block's next unit, claimed by the producer's thread 0 when it starts a unit: the
/// first the counter has not handed out (past the grid's first units, which are the
/// blocks' own), so that a block takes the next unit of the longest-first list when it is
/// ready for one, as the hardware hands blocks of a non-persistent grid to the first
/// free multiprocessor. A claim past the last unit ends the block. Each block makes one
/// claim per unit it runs, so the launch makes num_units claims in all; the one that
/// gets num_units - 1 is the last and sets the counter back to zero for the next launch.
__device__ __forceinline__ int claim_unit(const HopperParams& p, int u, int num_units) {
  if (p.unit_counter == nullptr) return u + static_cast<int>(gridDim.x);
  const int c = atomicAdd(p.unit_counter, 1);
  if (c == num_units - 1) atomicExch(p.unit_counter, 0);
  return static_cast<int>(gridDim.x) + c;
}

/// The named barriers of the kernel (barrier 0 is __syncthreads), for up to three consumer
/// warp groups: their turns at the tensor cores (each counting the 128 threads of the group
/// that waits and the 128 of the group before it that lets it go), the producer's, and
/// each consumer's output stage.
enum class NamedBarrier : uint32_t {
  kConsumer0Turn = 1,   ///< kConsumer0Turn + c: consumer c may issue its GEMMs
  kProducer = 4,        ///< the producer's 128 threads, over pages: the next unit is known to all
  kConsumer0Store = 5,  ///< kConsumer0Store + c: consumer c's 128 threads, its output stage is free, then written
};

/// Consumer warp groups take turns issuing their GEMMs (ping-pong, round robin over
/// kConsumers groups): consumer c waits on its own turn's barrier until consumer c - 1 has
/// issued, and after issuing lets consumer c + 1 go. While one group's GEMMs run on the
/// tensor cores, the others do their softmax. A solo consumer (every row of the tile is
/// its own) takes no turns. (bar.sync / bar.arrive with a barrier id: no C++ API, one
/// line of PTX each.)
template <int kConsumers>
struct Turns {
  int consumer;  ///< 0 .. kConsumers - 1
  bool solo;     ///< the other consumers have no rows: no turns to take
  __device__ __forceinline__ uint32_t own() const {
    return uint32_t(NamedBarrier::kConsumer0Turn) + uint32_t(consumer);
  }
  __device__ __forceinline__ uint32_t next() const {
    return uint32_t(NamedBarrier::kConsumer0Turn) + uint32_t(consumer + 1 == kConsumers ? 0 : consumer + 1);
  }
  __device__ __forceinline__ void wait() const {
    if (!solo) asm volatile("bar.sync %0, 256;\n" ::"r"(own()) : "memory");
  }
  __device__ __forceinline__ void pass() const {
    if (!solo) asm volatile("bar.arrive %0, 256;\n" ::"r"(next()) : "memory");
  }
};

/// A place in the ring of K/V buffers: which buffer (index) and which round of the ring
/// (phase: the parity an mbarrier wait names). Tile j sits in buffer j % kStages, in round
/// j / kStages; advance() moves to the next tile.
template <int kStages>
struct PipelineState {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

/// How a K or V tile of kRows rows and kBlocks 64-column blocks lies in shared memory
/// (HopperTraits::kAtomsOuter), in elements: kBlock from one column block's first row to
/// the next's, kAtom from one 8-row atom of a column block to the next. Block by block
/// (contiguous K/V): kBlock = kRows x 64, kAtom = 8 x 64. Atom by atom (over pages):
/// kBlock = 8 x 64, kAtom = kBlocks x 8 x 64.
template <bool kAtomsOuter, int kRows, int kBlocks>
struct TileLayout {
  static constexpr int kBlock = kAtomsOuter ? 8 * 64 : kRows * 64;
  static constexpr int kAtom = kAtomsOuter ? kBlocks * 8 * 64 : 8 * 64;
  /// where atom `atom` of column block `cb` starts, in bytes (16-bit elements)
  static __device__ __forceinline__ uint32_t offset(int atom, int cb) {
    return 2u * uint32_t(cb * kBlock + atom * kAtom);
  }
};

/// S = Q K^T for this warp group's 64 rows: HEAD_DIM / 16 k-steps of wgmma, both operands
/// K-major in 128-byte swizzled column blocks of 64 (a k-step further: 32 bytes further).
template <typename T, int HEAD_DIM, int Br, int Bc, bool kAtomsOuter>
__device__ __forceinline__ void issue_scores(float (&sc)[Bc / 2], const T* q_rows, const T* k_tile) {
  constexpr int kCols = 64, kBlocks = HEAD_DIM / kCols;
  using K = TileLayout<kAtomsOuter, Bc, kBlocks>;
  // Two descriptors built, the others a constant further: the start address is bits 0-13
  // in 16-byte units, and an offset inside shared memory never carries out of them.
  const SmemDescriptor dq(q_rows, 16);
  const StridedSmemDescriptor<K::kAtom * sizeof(T)> dk(k_tile, 16);
#pragma unroll
  for (int c = 0; c < kBlocks; ++c)
#pragma unroll
    for (int k = 0; k < kCols / 16; ++k)
      wgmma_ss<T, Bc>(sc, dq.at((c * Br * kCols + k * 16) * sizeof(T) / 16),
                      dk.at((c * K::kBlock + k * 16) * sizeof(T) / 16), c + k > 0);
}

/// O += P V: Bc / 16 k-steps of 16 keys; P from registers, V MN-major (a 128-byte row
/// holds 64 of O's columns; the next 64 columns are the next column block: Bc rows
/// further, or the next atom over pages). head_dim 256 runs as two N = 128 halves
/// (accumulator registers 0..63 are O's columns 0..127, 64..127 the rest: wgmma's layout
/// repeats every 8 columns), which needs no N = 256 instruction.
template <typename T, int HEAD_DIM, int Bc, bool kAtomsOuter>
__device__ __forceinline__ void issue_pv(float (&o)[HEAD_DIM / 2], const uint32_t (&a)[Bc / 16][4], const T* v_tile) {
  constexpr int kCols = 64, kN = HEAD_DIM > 128 ? 128 : HEAD_DIM, kBlocks = HEAD_DIM / kCols;
  using Half = float[kN / 2];
  using V = TileLayout<kAtomsOuter, Bc, kBlocks>;
  // leading offset: one column block to the next; stride: one 8-key atom to the next; the
  // other k-steps and halves a constant further
  const StridedSmemDescriptor<V::kAtom * sizeof(T)> dv(v_tile, V::kBlock * sizeof(T));
#pragma unroll
  for (int k = 0; k < Bc / 16; ++k)
#pragma unroll
    for (int h = 0; h < HEAD_DIM / kN; ++h)
      wgmma_rs<T, kN>(*reinterpret_cast<Half*>(o + h * kN / 2), a[k],
                      dv.at(((h * kN / kCols) * V::kBlock + 2 * k * V::kAtom) * sizeof(T) / 16), 1);
}

/// -inf for keys past the chunk's end, (causal) keys after the row's position q_pos[h],
/// and (WINDOW) keys more than window_left before it.
template <int Bc, bool WINDOW>
__device__ __forceinline__ void mask_scores(float (&sc)[Bc / 2], int key0, int chunk_end, bool causal, int window_left,
                                            const int (&q_pos)[2], int lane) {
#pragma unroll
  for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * n + 2 * (lane % 4) + e;
        if (key >= chunk_end || (causal && key > q_pos[h]) ||
            (WINDOW && window_left >= 0 && key < q_pos[h] - window_left))
          sc[4 * n + 2 * h + e] = -INFINITY;
      }
}

/// How far (base 2) a tile's row max may pass the running max m before m moves to it. Up
/// to that, m stays, P's entries are at most 2^8, which bf16 P and the fp32 sums hold as
/// well as values near 1, and alpha is 1: O needs no rescaling (FlashAttention-4's
/// conditional rescaling). O and l always share the m they were summed under, so the
/// epilogue's O / l and lse = m + log2 l are exact whatever m is. At head_dim_vo 64 the
/// rescale is 32 multiplies a thread, no more than the warp vote that skips it: there m
/// moves with every new max (on an H200, b4 x 4096 d64 causal ran at 0.977 of the plain
/// loop with a slack of 8; the head_dim 128 and 256 prefill rows 1-6% faster).
template <int HEAD_DIM_VO>
constexpr float kMaxSlack = HEAD_DIM_VO >= 128 ? 8.f : 0.f;

/// The online softmax on one tile of scores, in base 2, without touching O (which the
/// previous tile's P V may still be accumulating into):
///   m_new = rowmax(S) * scale if that passes m + slack, else m;
///   P = exp2(S * scale - m_new);  alpha = exp2(m - m_new);  l = l * alpha + rowsum(P).
/// A row's max is shared by the four threads of a quad (shuffles); l stays per thread
/// until the end. sc holds P afterwards; rescale_output applies alpha to O once the
/// previous P V has landed, when some row of the warp moved its m. It comes in two parts,
/// so that the consumer can place the second against that wait (split_softmax_at_wait).
///
/// First softmax_max, for both of the thread's rows: m moves (or stays), alpha is the
/// factor for O and l, and m_use the max the exponentials subtract.
template <int Bc>
__device__ __forceinline__ void softmax_max(const float (&sc)[Bc / 2], float (&m)[2], float (&alpha)[2],
                                            float (&m_use)[2], float scale, float slack) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < Bc / 8; ++n) mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * h], sc[4 * n + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_tile = mx * scale;
    const float m_new = m_tile > m[h] + slack ? m_tile : m[h];  // m = -inf: any finite max moves it
    // a row that has seen no key yet keeps m = -inf: subtract 0 instead, so exp2 gives 0, not NaN
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = m_new == m[h] ? 1.f : tensor_core::exp2_approx(m[h] - m_use[h]);  // exactly 1 when m stays
    m[h] = m_new;
  }
}

/// Then row h's exponentials, P = exp2(S * scale - m_use), and its running sum.
template <int Bc, int h>
__device__ __forceinline__ void softmax_exp(float (&sc)[Bc / 2], float (&l)[2], const float (&alpha)[2],
                                            const float (&m_use)[2], float scale) {
  float sum = 0.f;
#pragma unroll
  for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = sc[4 * n + 2 * h + e];
      x = tensor_core::exp2_approx(fmaf(x, scale, -m_use[h]));
      sum += x;
    }
  l[h] = l[h] * alpha[h] + sum;
}

/// Where the softmax of S_j falls against the wait for P_{j-1} V_{j-1}, which it does not
/// need (only packing P_j does: that overwrites the A fragments P V still reads). ptxas
/// places the exponentials, and left free it put all of them after the wait (the SASS of
/// 03c3c68's build: every MUFU.EX2 of the main loop after WARPGROUP.DEPBAR.LE gsb0, 0x0),
/// so the softmax began only once P V had landed. An empty asm taking P as an operand
/// orders the PTX, not the SASS; a branch does: ptxas finishes what a branch's condition
/// needs before the branch. So the consumer computes both rows' maxima and row 0's
/// exponentials, branches on row 0's sum and row 1's max, and only then waits and takes
/// row 1's exponentials. The condition never holds (an all-ones bit pattern is a NaN
/// that no addition or max returns: theirs is 0x7fffffff), so the trap is never reached.
/// Measured on an H200 against all of them above the wait and none: see the chapter.
__device__ __forceinline__ void split_softmax_at_wait(const float (&l)[2], const float (&m_use)[2]) {
  if ((__float_as_uint(l[0]) & __float_as_uint(m_use[1])) == 0xffffffffu) __trap();
}

/// O *= alpha, row by row: O moves to the new running max before P_j V_j is added.
template <int HEAD_DIM>
__device__ __forceinline__ void rescale_output(float (&o)[HEAD_DIM / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * n + 2 * h] *= alpha[h];
      o[4 * n + 2 * h + 1] *= alpha[h];
    }
}

/// P (fp32 accumulator layout) as wgmma A fragments: k-step k covers keys 16k..16k+15,
/// which are accumulator column blocks 2k and 2k+1 (the mma.sync A layout).
template <typename T, int Bc>
__device__ __forceinline__ void pack_p(const float (&sc)[Bc / 2], uint32_t (&a)[Bc / 16][4]) {
#pragma unroll
  for (int k = 0; k < Bc / 16; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[k][r] = kernels::pack2<T>(sc[8 * k + 2 * r], sc[8 * k + 2 * r + 1]);
}

/// Paged K/V: the producer warp group's 128 threads copy one K (or V) tile of Bc keys into
/// shared memory in the layout the TMA would have written (atom by atom, kAtomsOuter).
/// Thread `tid` copies 16-byte chunk c = tid % 8 of rows tid / 8 + 16 i, in every 64-column
/// block; the row's page comes from the page table, keys past the chunk's end are written
/// as zeros (past kv_len the pool holds anything, NaN in the tests, and 0 * NaN would
/// reach O through P V).
/// The thread reads all its rows' pages before its first copy: a copy is inline asm with a
/// memory clobber, so a page read after it could not move above it, and at page size 1
/// each row's read would wait for the previous row's to return.
template <int HEAD_DIM, int Bc>
__device__ __forceinline__ void gather_tile(unsigned char* tile, const kernels::PagedKV<uint16_t>& kv, const Tile& t,
                                            int key0, int kv_head, bool is_v, int tid) {
  constexpr int kRows = Bc / 16;  // rows per thread
  const int c = tid % 8;
  using Layout = TileLayout<true, Bc, HEAD_DIM / 64>;
  // row tid / 8 + 16 i is row (tid / 8) % 8 of atom tid / 64 + 2 i: the thread's chunk of its
  // first row in column block 0, and then a constant further for each row and column block
  const uint32_t first = Layout::offset(tid / 64, 0) + ((tid / 8) % 8) * 128 + ((c ^ ((tid / 8) % 8)) * 16);
  int32_t page[kRows];  // -1: the key is past the chunk's end
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int key = key0 + tid / 8 + 16 * i;
    uint32_t page_iter, slot;
    kv.page_size.divmod(static_cast<uint32_t>(key), page_iter, slot);
    page[i] = key < t.chunk_end ? kv.kv_indices[t.kv_begin + page_iter] : -1;
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = tid / 8 + 16 * i;
    const bool valid = page[i] >= 0;
    const uint16_t* src = kv.pool;
    if (valid) {
      // the slot again (a multiply-high and a subtract) rather than eight more live registers
      uint32_t page_iter, slot;
      kv.page_size.divmod(static_cast<uint32_t>(key0 + r), page_iter, slot);
      src += kv.offset(page[i], slot, kv_head) + (is_v ? kv.stride_kv : 0) + 8 * c;
    }
#pragma unroll
    for (int cb = 0; cb < HEAD_DIM / 64; ++cb)
      kernels::cp_async_16(tile + first + Layout::offset(2 * i, cb), src + 64 * cb, valid);
  }
}

/// Paged K/V, a whole tile inside the request and pages of a multiple of 8 tokens: one
/// TMA copy per page instead of the gather. The tile lies atom by atom (kAtomsOuter), so a
/// page's rows in every 64-column block are one span of whole 1024-byte swizzle atoms,
/// which the pool's tensor map (make_pool_map in hopper.cu) reads as one box, and the copy
/// engine's 128-byte swizzle puts every chunk where the tile-wide layout expects it. Lane b
/// of the producer's first warp copies page b of the tile (its rows key0 + b tma_rows ..),
/// whose pool page and slot `find_page_box` looked up.
struct PageBox {
  int32_t page;  ///< the pool page of the lane's rows, -1: the lane copies nothing
  int32_t slot;  ///< the first row's slot in that page
};

/// Lane b's page of the tile starting at key0 (-1 for lanes past the tile's pages). The
/// producer looks it up a tile ahead of the copies, so that the load of kv_indices, a
/// round trip to memory, is not waited for between a buffer coming free and its refill.
template <int Bc>
__device__ __forceinline__ PageBox find_page_box(const HopperParams& p, const Tile& t, int key0, int lane) {
  PageBox box{-1, 0};
  if (lane < Bc / p.tma_rows) {
    uint32_t page_iter, slot;
    p.kv.page_size.divmod(static_cast<uint32_t>(key0 + lane * p.tma_rows), page_iter, slot);
    box.page = p.kv.kv_indices[t.kv_begin + page_iter];
    box.slot = static_cast<int32_t>(slot);
  }
  return box;
}

/// How many of the block's K/V tiles, from the first, go by page copies (the TMA) rather
/// than the gather: a tile wholly inside the chunk, starting on a page boundary, in pages
/// of a multiple of 8 tokens (tma_rows > 0). The tiles are Bc apart, a whole number of
/// pages, so they all start on a boundary or none does, and only the last can end past the
/// chunk. The producer picks its copies by it and the consumers their proxy fence.
template <int Bc>
__device__ __forceinline__ int tiles_by_page(const HopperParams& p, const Tile& t) {
  const bool on_boundary = p.tma_rows > 0 && t.key_begin % p.tma_rows == 0;
  return on_boundary ? (t.chunk_end - t.key_begin) / Bc : 0;
}

template <int HEAD_DIM, int Bc>
__device__ __forceinline__ void copy_pages(unsigned char* tile, const HopperParams& p, const CUtensorMap* map,
                                           const PageBox& box, int kv_head, int plane, int planes, int lane,
                                           uint64_t* full) {
  namespace ptx = cuda::ptx;
  constexpr int kBlocks = HEAD_DIM / 64;
  if (box.page >= 0) {
    // the map's (64 columns, 8 rows, column blocks, 8-row groups, pages): NHD names the
    // head among the column blocks (kv_head * kBlocks), HND among the pages
    const int32_t plane_page = box.page * planes + plane;
    const int32_t coords[5] = {0, 0, p.hnd ? 0 : kv_head * kBlocks, box.slot / 8,
                               p.hnd ? plane_page * p.num_kv_heads + kv_head : plane_page};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global,
                              tile + TileLayout<true, Bc, kBlocks>::offset(lane * p.tma_rows / 8, 0), map, coords,
                              full);
  }
}

/// The block's shared memory: the Q tile, kStages K and V tiles, and the mbarriers that
/// hand each of them over (laid out as HopperTraits says, 1024-byte aligned: the 128-byte
/// swizzle repeats every 1024 bytes).
template <typename T, int HEAD_DIM, bool PAGED, int HEAD_DIM_VO = HEAD_DIM>
struct HopperSmem {
  using Tr = HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>;
  unsigned char* base;
  __device__ __forceinline__ T* q() const { return reinterpret_cast<T*>(base); }
  __device__ __forceinline__ T* k(int s) const {
    // s * (kKBytes + kVBytes), written so that equal widths compile to the instructions
    // they had before V got a width of its own
    return reinterpret_cast<T*>(base + Tr::kQBytes + 2 * s * Tr::kKBytes + s * (int(Tr::kVBytes) - int(Tr::kKBytes)));
  }
  __device__ __forceinline__ T* v(int s) const {
    return reinterpret_cast<T*>(base + Tr::kQBytes + (2 * s + 1) * Tr::kKBytes +
                                s * (int(Tr::kVBytes) - int(Tr::kKBytes)));
  }
  /// consumer c's 64 output rows (kStoreByTma): one 64 x 64 swizzled block per 64 columns
  __device__ __forceinline__ T* o_stage(int c) const {
    return reinterpret_cast<T*>(base + Tr::kOOffset + c * (Tr::kOBytes / Tr::kConsumers));
  }
  __device__ __forceinline__ uint64_t* q_full() const { return reinterpret_cast<uint64_t*>(base + Tr::kBarrierOffset); }
  /// [kStages] a K (V) tile has landed
  __device__ __forceinline__ uint64_t* k_full(int s) const { return q_full() + 1 + s; }
  __device__ __forceinline__ uint64_t* v_full(int s) const { return q_full() + 1 + Tr::kStages + s; }
  /// [kStages] every consumer warp is done with the K (V) tile
  __device__ __forceinline__ uint64_t* k_empty(int s) const { return q_full() + 1 + 2 * Tr::kStages + s; }
  __device__ __forceinline__ uint64_t* v_empty(int s) const { return q_full() + 1 + 3 * Tr::kStages + s; }
  /// every consumer warp is done with Q: the next unit's Q may come in
  __device__ __forceinline__ uint64_t* q_empty() const { return q_full() + 1 + 4 * Tr::kStages; }
  /// the unit whose Q the Q buffer holds (-1: no more units), stored before q_full's arrival
  __device__ __forceinline__ volatile int* unit() const {
    return reinterpret_cast<volatile int*>(base + Tr::kBarrierOffset + Tr::kBarrierBytes);
  }
  /// [2] the producer's next unit, by the parity of its unit count
  __device__ __forceinline__ volatile int* next_unit(int parity) const { return unit() + 1 + parity; }
  /// the Tile of unit(), stored with it: the consumers read it rather than load the work
  /// item's indices and offsets from global memory, a chain of two round trips, each unit
  __device__ __forceinline__ Tile* tile() const { return reinterpret_cast<Tile*>(base + Tr::kTileOffset); }

  /// One thread: each "full" barrier expects the copy engine's bytes (or, gathering, one
  /// arrival per producer thread), each "empty" one arrival per consumer warp.
  __device__ __forceinline__ void init_barriers() const {
    ptx::mbarrier_init(q_full(), 1);
    ptx::mbarrier_init(q_empty(), Tr::kConsumers * 4);
    for (int s = 0; s < Tr::kStages; ++s) {
      ptx::mbarrier_init(k_full(s), uint32_t{Tr::kKVFullArrivals});
      ptx::mbarrier_init(v_full(s), uint32_t{Tr::kKVFullArrivals});
      ptx::mbarrier_init(k_empty(s), Tr::kConsumers * 4);
      ptx::mbarrier_init(v_empty(s), Tr::kConsumers * 4);
    }
    // make the initialised barriers visible to the copy engine (the async proxy)
    ptx::fence_proxy_async(ptx::space_shared);
  }
};

/// The producer warp group, once it has given its registers away, for the block's n-th
/// unit u: Q once the consumers are done with the previous unit's, then K_j and V_j of
/// every tile into the ring's next buffers, each once the consumers freed it (the tile
/// kStages before it, of this unit or the previous one: K after its S, V after its P V,
/// one turn later). The ring (write) runs on across units, so the next unit's Q and first
/// tiles come in while the consumers write the previous unit's rows. One thread issues the
/// TMA copies; over pages all 128 gather the tiles the TMA cannot copy page by page.
template <typename T, int HEAD_DIM, bool PAGED, int HEAD_DIM_VO>
__device__ __forceinline__ void produce(const HopperParams& p, const Tile& t,
                                        const HopperSmem<T, HEAD_DIM, PAGED, HEAD_DIM_VO>& smem, int kv_head,
                                        PipelineState<HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>::kStages>& write,
                                        int n, int u) {
  using Tr = HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>;
  constexpr int Br = Tr::Br, Bc = Tr::Bc, kCols = Tr::kBlockCols;
  // Q: the tile's Br packed rows = Br / group tokens x group heads of this kv head, and the
  // unit's number beside it. Thread 0 copies them once every consumer warp has let go of
  // the previous unit's (unit 0 waits on the phase before the barrier's first, which counts
  // as complete).
  // (Copying Q after the unit's first K tile, so that K's copy could overlap the previous
  // unit's last P V, kept the producer's unit state live through the gather: ptxas spilled
  // it there, at 56 and 64 registers.)
  if (threadIdx.x == 0) {
    wait_barrier(smem.q_empty(), (n & 1) ^ 1);
    const int32_t token0 = t.qo_begin + t.row_begin / p.group_size;
    *smem.unit() = u;  // both released by the arrival: read once Q has landed
    *smem.tile() = t;
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, smem.q_full(),
                                   uint32_t{Tr::kQBytes});
    for (int c = 0; c < Tr::kColBlocks; ++c) {
      const int32_t coords[3] = {c * kCols, kv_head * p.group_size, token0};
      ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, smem.q() + c * Br * kCols, &p.q_map, coords,
                                smem.q_full());
    }
  }
  // A tile wholly inside the request, starting on a page boundary, in pages of a
  // multiple of 8 tokens, goes by the TMA, one copy per page (thread 0 announces the bytes
  // and arrives for all 128 threads). Otherwise (the request's last tile, whose keys past
  // kv_len must be zeros; pages of 1 or 3 tokens) every thread gathers, its copies
  // counting one arrival when they have landed.
  const int n_by_page = PAGED ? tiles_by_page<Bc>(p, t) : 0;
  PageBox next{-1, 0};  // the first warp's pages of the next tile copied by page
  if (PAGED && threadIdx.x < 32 && t.num_kv_tiles > 0 && n_by_page > 0)
    next = find_page_box<Bc>(p, t, t.key_begin, threadIdx.x);
  for (int j = 0; j < t.num_kv_tiles; ++j, write.advance()) {
    // the buffer held the tile kStages before this one: wait until it is free (in the ring's
    // first round, on the phase before the barrier's first, which counts as complete)
    const int s = write.index;
    if constexpr (PAGED) {
      const int key0 = t.key_begin + j * Bc;
      const bool this_by_page = j < n_by_page;
      const PageBox box = next;
      // the next tile's pages, loaded now and used one tile later
      if (threadIdx.x < 32 && j + 1 < t.num_kv_tiles && j + 1 < n_by_page)
        next = find_page_box<Bc>(p, t, key0 + Bc, threadIdx.x);
      for (int is_v = 0; is_v < 2; ++is_v) {
        uint64_t* full = is_v ? smem.v_full(s) : smem.k_full(s);
        unsigned char* tile = reinterpret_cast<unsigned char*>(is_v ? smem.v(s) : smem.k(s));
        wait_barrier(is_v ? smem.v_empty(s) : smem.k_empty(s), write.phase ^ 1u);
        // V of its own width: plane 0 of V's own pool (v_pool_map, v_kv), K plane 0 of its
        if (this_by_page) {
          if (threadIdx.x == 0) {
            ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                           is_v ? uint32_t{Tr::kVBytes} : uint32_t{Tr::kKBytes});
            // the other 127 arrivals in one, rather than one atomic on the barrier each
            ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full, Tr::kKVFullArrivals - 1);
          }
          if (threadIdx.x < 32) {
            __syncwarp();  // the bytes are announced before any copy can land
            if constexpr (HEAD_DIM_VO == HEAD_DIM)
              copy_pages<HEAD_DIM, Bc>(tile, p, &p.kv_map, box, kv_head, is_v, 2, threadIdx.x, full);
            else if (is_v) copy_pages<HEAD_DIM_VO, Bc>(tile, p, &p.v_pool_map, box, kv_head, 0, 1, threadIdx.x, full);
            else copy_pages<HEAD_DIM, Bc>(tile, p, &p.kv_map, box, kv_head, 0, 1, threadIdx.x, full);
          }
        } else {
          if constexpr (HEAD_DIM_VO == HEAD_DIM)
            gather_tile<HEAD_DIM, Bc>(tile, p.kv, t, key0, kv_head, is_v, threadIdx.x);
          else if (is_v) gather_tile<HEAD_DIM_VO, Bc>(tile, p.v_kv, t, key0, kv_head, false, threadIdx.x);
          else gather_tile<HEAD_DIM, Bc>(tile, p.kv, t, key0, kv_head, false, threadIdx.x);
          ptx::cp_async_mbarrier_arrive_noinc(full);
        }
      }
    } else {
      const int32_t key0 = t.kv_begin + t.key_begin + j * Bc;
      for (int is_v = 0; is_v < 2; ++is_v) {
        uint64_t* full = is_v ? smem.v_full(s) : smem.k_full(s);
        T* tile = is_v ? smem.v(s) : smem.k(s);
        wait_barrier(is_v ? smem.v_empty(s) : smem.k_empty(s), write.phase ^ 1u);
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, full,
                                       is_v ? uint32_t{Tr::kVBytes} : uint32_t{Tr::kKBytes});
        for (int c = 0; c < (is_v ? HEAD_DIM_VO : HEAD_DIM) / kCols; ++c) {
          const int32_t coords[3] = {c * kCols, kv_head, key0};
          ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, tile + c * Bc * kCols,
                                    is_v ? &p.v_map : &p.k_map, coords, full);
        }
      }
    }
  }
}

/// Consumer 1 of a solo tile (every row is consumer 0's: decode with a group of 32 rows or
/// fewer, a request's last tile) computes nothing; it hands each K/V buffer back once it
/// has landed (after the landing, so its arrivals keep the barriers' phases). (Measured on
/// an H100 against consumer 1 walking the turns idle: MQA decode b1 x 16384 446 -> 477 GB/s,
/// prefill unchanged.)
template <typename T, int HEAD_DIM, bool PAGED, int HEAD_DIM_VO>
__device__ __forceinline__ void release_tiles(
    const Tile& t, const HopperSmem<T, HEAD_DIM, PAGED, HEAD_DIM_VO>& smem, int lane,
    PipelineState<HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>::kStages>& read) {
  for (int j = 0; j < t.num_kv_tiles; ++j, read.advance()) {
    wait_barrier(smem.k_full(read.index), read.phase);
    if (lane == 0) ptx::mbarrier_arrive(smem.k_empty(read.index));
    wait_barrier(smem.v_full(read.index), read.phase);
    if (lane == 0) ptx::mbarrier_arrive(smem.v_empty(read.index));
  }
}

/// A K or V tile has landed. Gathered tiles were written by cp.async, through the generic
/// proxy, and wgmma reads shared memory through the async proxy: a proxy fence orders them.
/// Tiles the TMA copied came through the async proxy already and need none.
template <bool PAGED>
__device__ __forceinline__ void wait_tile(uint64_t* full, uint32_t phase, bool gathered) {
  wait_barrier(full, phase);
  if (PAGED && gathered) ptx::fence_proxy_async(ptx::space_shared);
}

/// The running state of one consumer thread's two rows: O (its accumulator fragment), the
/// running max m of the base-2 logits and the running sum l of exp2(logit - m) over this
/// thread's columns.
template <int HEAD_DIM>
struct RowState {
  float o[HEAD_DIM / 2];
  float m[2];
  float l[2];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }
};

/// The scores of tile j as P: the policy's logits (a policy that transforms them, such as
/// the soft cap, sees base-2 logits: the scale comes first), the masks where some (row,
/// key) of the tile is hidden (past the chunk, across the causal diagonal: keys after the
/// first row's position; below the window: keys before the last row's position -
/// window_left), then the online softmax, leaving O's rescale factors in alpha. Under the
/// identity the scale stays folded into the softmax's FFMA.
template <int Bc, int HEAD_DIM_VO, bool WINDOW, typename Policy, int kRows = 2>
__device__ __forceinline__ float softmax_tile(const HopperParams& p, const typename Policy::Params& pol, const Tile& t,
                                              int j, float (&sc)[Bc / 2], float (&m)[2], float (&l)[2],
                                              float (&alpha)[2], float (&m_use)[2], const int (&q_pos)[2], int lane) {
  const int key0 = t.key_begin + j * Bc;
  float scale = p.score_scale;
  if constexpr (Policy::kTransformsLogits) {
#pragma unroll
    for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i)  // c0, c1: row g; c2, c3: row g + 8; columns 2 (lane % 4) + i % 2
        sc[4 * n + i] = Policy::on_logit(pol, sc[4 * n + i] * p.score_scale, key0 + 8 * n + 2 * (lane % 4) + i % 2);
    scale = 1.f;
  }
  const bool window = WINDOW && p.window_left >= 0;
  if (key0 + Bc > t.chunk_end || (p.causal && key0 + Bc - 1 > t.first_pos) ||
      (window && key0 < t.last_pos - p.window_left))
    mask_scores<Bc, WINDOW>(sc, key0, t.chunk_end, p.causal, p.window_left, q_pos, lane);
  softmax_max<Bc>(sc, m, alpha, m_use, scale, kMaxSlack<HEAD_DIM_VO>);
  softmax_exp<Bc, 0>(sc, l, alpha, m_use, scale);
  if constexpr (kRows == 2) softmax_exp<Bc, 1>(sc, l, alpha, m_use, scale);
  return scale;
}

/// A consumer warp group's main loop over the tile's keys, for its 64 rows: one turn per
/// key tile j issues S_j = Q K_j^T and P_{j-1} V_{j-1} as two commit groups and lets the
/// other group issue; then, inside the warp group, the softmax of S_j starts as soon as S_j
/// lands (wgmma.wait_group 1) while P_{j-1} V_{j-1} still runs (and the other group's
/// GEMMs after it); O is rescaled and P_j packed only once that P V has landed (wait_group
/// 0), since both touch registers it still uses. Turn 0 has no P V yet, and a last turn
/// issues P_{n-1} V_{n-1} alone; both are peeled, so each turn's wgmma are one straight run
/// of instructions. Q is last read by S_{n-1}: the warp lets it go (q_empty) as soon as
/// that lands, so the next unit's Q is on its way during the last P V and the epilogue.
template <typename T, int HEAD_DIM, bool PAGED, bool WINDOW, typename Policy, int HEAD_DIM_VO>
__device__ __forceinline__ void consume(const HopperParams& p, const typename Policy::Params& pol, const Tile& t,
                                        const HopperSmem<T, HEAD_DIM, PAGED, HEAD_DIM_VO>& smem,
                                        const Turns<HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>::kConsumers>& turns,
                                        const int (&q_pos)[2], int lane, RowState<HEAD_DIM_VO>& st,
                                        PipelineState<HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>::kStages>& ring) {
  using Tr = HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>;
  constexpr int Br = Tr::Br, Bc = Tr::Bc, kCols = Tr::kBlockCols;
  const int n_tiles = t.num_kv_tiles;
  float sc[Bc / 2];        // S_j, then P_j
  uint32_t a[Bc / 16][4];  // P_j as wgmma A fragments, read by the next turn's P V
  float alpha[2], m_use[2];

  const T* q_rows = smem.q() + turns.consumer * 64 * kCols;  // this warp group's 64 rows in each column block

  PipelineState<Tr::kStages> k_read = ring, v_read = ring;  // K_j's buffer, and V_{j-1}'s one tile behind
  // whether tile j was gathered (and needs the proxy fence), as the producer chose
  const int n_by_page = PAGED ? tiles_by_page<Bc>(p, t) : 0;
  const auto gathered = [&](int j) { return PAGED && j >= n_by_page; };
  const auto free_q = [&] {
    if (lane == 0) ptx::mbarrier_arrive(smem.q_empty());
  };
  if (n_tiles == 0) free_q();
  if (n_tiles > 0) {
    wait_tile<PAGED>(smem.k_full(k_read.index), k_read.phase, gathered(0));
    turns.wait();
    wgmma_fence();
    issue_scores<T, HEAD_DIM, Br, Bc, Tr::kAtomsOuter>(sc, q_rows, smem.k(k_read.index));
    wgmma_commit();
    turns.pass();
    wgmma_wait<0>();
    wgmma_fence_operands(sc);
    if (lane == 0) ptx::mbarrier_arrive(smem.k_empty(k_read.index));  // this warp is done reading K_0
    if (n_tiles == 1) free_q();
    softmax_tile<Bc, HEAD_DIM_VO, WINDOW, Policy>(p, pol, t, 0, sc, st.m, st.l, alpha, m_use, q_pos,
                                                  lane);  // O is still zero
    pack_p<T, Bc>(sc, a);
    k_read.advance();
  }
  for (int j = 1; j < n_tiles; ++j, k_read.advance(), v_read.advance()) {
    wait_tile<PAGED>(smem.k_full(k_read.index), k_read.phase, gathered(j));
    wait_tile<PAGED>(smem.v_full(v_read.index), v_read.phase, gathered(j - 1));
    turns.wait();
    wgmma_fence();
    issue_scores<T, HEAD_DIM, Br, Bc, Tr::kAtomsOuter>(sc, q_rows, smem.k(k_read.index));
    wgmma_commit();
    issue_pv<T, HEAD_DIM_VO, Bc, Tr::kAtomsOuter>(st.o, a, smem.v(v_read.index));
    wgmma_commit();
    turns.pass();
    wgmma_wait<1>();  // S_j has landed; P_{j-1} V_{j-1} may still run
    wgmma_fence_operands(sc);
    if (lane == 0) ptx::mbarrier_arrive(smem.k_empty(k_read.index));  // this warp is done reading K_j
    if (j == n_tiles - 1) free_q();
    const float scale = softmax_tile<Bc, HEAD_DIM_VO, WINDOW, Policy, 1>(p, pol, t, j, sc, st.m, st.l, alpha, m_use,
                                                                         q_pos, lane);
    split_softmax_at_wait(st.l, m_use);
    wgmma_wait<0>();  // P_{j-1} V_{j-1} has landed: O and the A fragments are free
    softmax_exp<Bc, 1>(sc, st.l, alpha, m_use, scale);
    wgmma_fence_operands(st.o);
    if (lane == 0) ptx::mbarrier_arrive(smem.v_empty(v_read.index));  // ... and done reading V_{j-1}
    // most tiles move no row's max (kMaxSlack): the warp skips HEAD_DIM_VO / 2 multiplies a thread
    if (kMaxSlack<HEAD_DIM_VO> == 0.f || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
      rescale_output<HEAD_DIM_VO>(st.o, alpha);
    pack_p<T, Bc>(sc, a);
  }
  if (n_tiles > 0) {
    wait_tile<PAGED>(smem.v_full(v_read.index), v_read.phase, gathered(n_tiles - 1));
    turns.wait();
    wgmma_fence();
    issue_pv<T, HEAD_DIM_VO, Bc, Tr::kAtomsOuter>(st.o, a, smem.v(v_read.index));
    wgmma_commit();
    turns.pass();
    wgmma_wait<0>();
    wgmma_fence_operands(st.o);
    // the next unit's tiles go into this buffer
    if (lane == 0) ptx::mbarrier_arrive(smem.v_empty(v_read.index));
  }
  ring = k_read;  // n_tiles further on: where the next unit's tiles start
}

/// A finished row of the tile: its token and query head, what its O is multiplied by (the
/// policy's factor / l) and its lse = (m + log2 l) ln 2 (a row that saw no key: 0 and
/// -inf, which a merge weighs as nothing).
struct RowEnd {
  int token, head;
  float inv, lse;
};

/// Packed row `packed` of the tile, whose running max is m and whose sum over its four
/// threads' columns is l, finished: (m, l) pass through Policy::on_state first (a sink's
/// term, added by the chunk that starts at key 0 only), which returns the factor for O.
/// Both epilogues finish their rows here.
template <typename Policy>
__device__ __forceinline__ RowEnd finish_row(const HopperParams& p, const typename Policy::Params& pol, const Tile& t,
                                             int kv_head, int packed, float m, float l) {
  RowEnd e;
  e.token = t.qo_begin + packed / p.group_size;
  e.head = kv_head * p.group_size + packed % p.group_size;
  float m2 = l > 0.f ? m : -INFINITY;  // base 2, as the scores
  const float factor = Policy::on_state(pol, m2, l, e.head, p.kv_chunk_size * t.chunk);
  e.inv = l > 0.f ? factor / l : 0.f;
  e.lse = l > 0.f ? (m2 + log2f(l)) * 0.69314718055994531f : -INFINITY;
  return e;
}

/// Row h's l: the sum of the four threads' partial sums that hold its columns.
template <int HEAD_DIM_VO>
__device__ __forceinline__ float row_sum(const RowState<HEAD_DIM_VO>& st, int h) {
  float sum = st.l[h];
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  return sum;
}

/// The epilogue: O / l and the lse for every row the tile owns, to o and lse, or after a
/// split to this chunk's fp32 partial row. Written from the accumulator fragments. o's
/// rows are HEAD_DIM_VO wide (v's width).
template <typename T, int HEAD_DIM_VO, typename Policy>
__device__ __forceinline__ void store_tile(const HopperParams& p, const typename Policy::Params& pol, const Tile& t,
                                           int kv_head, const int (&row)[2], int lane,
                                           const RowState<HEAD_DIM_VO>& st) {
  T* out = static_cast<T*>(p.o);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = row_sum(st, h);
    const int packed = t.row_begin + row[h];
    if (packed >= t.qo_len * p.group_size) continue;
    const RowEnd e = finish_row<Policy>(p, pol, t, kv_head, packed, st.m[h], sum);
    if (p.kv_chunk_size == 0) {
      T* o_row = out + (int64_t(e.token) * p.num_qo_heads + e.head) * HEAD_DIM_VO;
#pragma unroll
      for (int n = 0; n < HEAD_DIM_VO / 8; ++n) {
        const int col = 8 * n + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(o_row + col) = kernels::pack2<T>(st.o[4 * n + 2 * h] * e.inv,
                                                                      st.o[4 * n + 2 * h + 1] * e.inv);
      }
      if (lane % 4 == 0) p.lse[int64_t(e.token) * p.num_qo_heads + e.head] = e.lse;
    } else {
      const int64_t prow = int64_t(p.partial_indptr[e.token] + t.chunk) * p.num_qo_heads + e.head;
      float* o_row = p.partial_o + prow * HEAD_DIM_VO;
#pragma unroll
      for (int n = 0; n < HEAD_DIM_VO / 8; ++n)
        *reinterpret_cast<float2*>(o_row + 8 * n + 2 * (lane % 4)) = make_float2(st.o[4 * n + 2 * h] * e.inv,
                                                                                 st.o[4 * n + 2 * h + 1] * e.inv);
      if (lane % 4 == 0) p.partial_lse[prow] = e.lse;
    }
  }
}

/// The epilogue of a warp group whose 64 rows all exist, without a split (HopperTraits::
/// kStoreByTma, p.o_by_tma): O / l goes into the group's output stage in shared memory, in
/// the 128-byte swizzled layout the tensor map names (chunk c of row r at chunk c ^ (r % 8),
/// so the eight rows a warp writes at once fall in different banks), then one thread
/// stores it with the TMA, one copy per 64 columns. The stores run on while the warp
/// group starts its next unit; before it writes the stage again, the thread that issued
/// them waits until they have read it (cp.async.bulk.wait_group.read). The lse leaves as
/// store_tile's does.
template <typename T, int HEAD_DIM_VO, typename Policy>
__device__ __forceinline__ void store_tile_tma(const HopperParams& p, const typename Policy::Params& pol, const Tile& t,
                                               int kv_head, const int (&row)[2], int consumer, int warp, int lane,
                                               const RowState<HEAD_DIM_VO>& st, T* stage) {
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const RowEnd e = finish_row<Policy>(p, pol, t, kv_head, t.row_begin + row[h], st.m[h], row_sum(st, h));
    inv[h] = e.inv;
    if (lane % 4 == 0) p.lse[int64_t(e.token) * p.num_qo_heads + e.head] = e.lse;
  }
  const bool leader = warp == 0 && lane == 0;
  const uint32_t bar = uint32_t(NamedBarrier::kConsumer0Store) + uint32_t(consumer);
  if (leader) ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});  // the previous unit's store has read the stage
  asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");        // no C++ API for a named barrier
  unsigned char* bytes = reinterpret_cast<unsigned char*>(stage);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + lane / 4 + 8 * h;  // the row within the group's 64
#pragma unroll
    for (int n = 0; n < HEAD_DIM_VO / 8; ++n) {
      const int block = n / 8, chunk = n % 8;  // 64-column block, 16-byte chunk of the row
      *reinterpret_cast<uint32_t*>(bytes + block * 64 * 128 + r * 128 + ((chunk ^ (r % 8)) * 16) + (lane % 4) * 4) =
          kernels::pack2<T>(st.o[4 * n + 2 * h] * inv[h], st.o[4 * n + 2 * h + 1] * inv[h]);
    }
  }
  ptx::fence_proxy_async(ptx::space_shared);  // the stage's bytes, written by this thread, for the copy engine
  asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory");
  if (leader) {
    const int32_t token0 = t.qo_begin + (t.row_begin + 64 * consumer) / p.group_size;
#pragma unroll
    for (int c = 0; c < HEAD_DIM_VO / 64; ++c) {
      const int32_t coords[3] = {c * 64, kv_head * p.group_size, token0};
      ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, &p.o_map, coords, stage + c * 64 * 64);
    }
    ptx::cp_async_bulk_commit_group();
  }
}

}  // namespace detail

/// WINDOW: the batch has a sliding window. A separate instantiation, so that the common
/// kernel carries no code for it: run-time branches around the window and the soft cap
/// cost the causal kernel 1-7% on an H100 (the compiler duplicated the loop for the cap,
/// which is now soft_cap/'s policy).
///
/// The block: warp group 0 produces (detail::produce), warp groups 1 and 2 (and 3 at
/// head_dim 64) consume (detail::consume: rows 0..63, 64..127, ... of the tile) and write their rows
/// (detail::store_tile), through Policy's on_logit and on_state (pol: its parameters).
/// HEAD_DIM_VO: v's and o's width, HEAD_DIM (q's and k's) but for MLA's prefill (192 / 128).
template <typename T, int HEAD_DIM, bool PAGED, bool WINDOW, typename Policy = kernels::IdentityPolicy,
          int HEAD_DIM_VO = HEAD_DIM>
__global__ void __launch_bounds__(HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>::kThreads, 1)
    hopper_attention_kernel(const __grid_constant__ HopperParams p, const typename Policy::Params pol) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>;
  extern __shared__ unsigned char smem_raw[];
  const detail::HopperSmem<T, HEAD_DIM, PAGED, HEAD_DIM_VO> smem{
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023))};

  const int num_units = p.num_items * p.num_kv_heads;
  const int warp_group = threadIdx.x / 128;
  if (threadIdx.x == 0) smem.init_barriers();
  __syncthreads();

  if (warp_group == 0) {
    // the producer hands its registers to the consumers (no C++ API for setmaxnreg)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::kProducerRegisters));
    if (!PAGED && threadIdx.x != 0) return;  // over ragged K/V one thread issues every copy
    detail::PipelineState<Tr::kStages> write;
    int u = blockIdx.x, n = 0;
    for (; u < num_units; ++n) {
      // the next unit claimed now, its round trip under this unit's copies; over pages the
      // producer's 128 threads learn it through shared memory and one barrier a unit
      int next = 0;
      if (threadIdx.x == 0) next = detail::claim_unit(p, u, num_units);
      if (PAGED && threadIdx.x == 0) *smem.next_unit(n & 1) = next;
      const detail::Unit w = detail::unit_of(p, u);
      const detail::Tile t = detail::make_tile<Tr::Br, Tr::Bc, PAGED>(p, w.item);
      detail::produce<T, HEAD_DIM, PAGED, HEAD_DIM_VO>(p, t, smem, w.kv_head, write, n, u);
      if constexpr (PAGED) {
        asm volatile("bar.sync %0, 128;\n" ::"n"(uint32_t(detail::NamedBarrier::kProducer)) : "memory");
        next = *smem.next_unit(n & 1);
      }
      u = next;
    }
    if (threadIdx.x == 0) {
      // no more units: once the consumers are done with the last Q, a unit of -1 ends them
      namespace ptx = cuda::ptx;
      wait_barrier(smem.q_empty(), (n & 1) ^ 1);
      *smem.unit() = -1;
      ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, smem.q_full());
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::kConsumerRegisters));  // no C++ API for setmaxnreg
  const int consumer = warp_group - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  // The turns run on across units: consumer 0 takes the first, the last consumer the last,
  // whose pass consumer 0 takes up after its last unit. A solo unit takes none.
  using Turns = detail::Turns<Tr::kConsumers>;
  if (consumer == Tr::kConsumers - 1) Turns{consumer, false}.pass();
  detail::PipelineState<Tr::kStages> read;  // the ring, as the producer's
  for (int n = 0;; ++n) {
    // The block's n-th unit comes with its Q, the producer storing its number and Tile
    // before the copy. Lane 0 reads them and hands them to its warp: the same lane later
    // frees Q (q_empty), so the reads are ordered before the producer's next stores by
    // its own program.
    wait_barrier(smem.q_full(), n & 1);
    int u = 0;
    if (lane == 0) u = *smem.unit();
    u = __shfl_sync(0xffffffffu, u, 0);
    if (u < 0) break;
    const detail::Unit w = detail::unit_of(p, u);
    const detail::Tile t = detail::lane0_tile(smem.tile(), lane);
    // Solo: every row of the tile falls in consumer 0's 64; the others only hand the
    // buffers back (Q at once: they read none), and consumer 0 takes no turns, having the
    // tensor cores alone. Otherwise every consumer computes its 64 rows and takes its
    // turns, a third group whose rows are all past the tile's end too (store_tile writes
    // none of them): rows 65-128 of three groups' 192 are the only such case.
    const bool solo = t.row_begin + 64 >= t.qo_len * p.group_size;
    if (solo && consumer > 0) {
      if (lane == 0) cuda::ptx::mbarrier_arrive(smem.q_empty());
      detail::release_tiles<T, HEAD_DIM, PAGED, HEAD_DIM_VO>(t, smem, lane, read);
      continue;
    }
    // this thread's two accumulator rows (h = 0, 1) within the tile, and their tokens'
    // positions among the keys (for the causal mask)
    int row[2], q_pos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row[h] = consumer * 64 + warp * 16 + lane / 4 + 8 * h;
      q_pos[h] = (t.row_begin + row[h]) / p.group_size + t.kv_len - t.qo_len;
    }
    detail::RowState<HEAD_DIM_VO> st;
    st.init();
    detail::consume<T, HEAD_DIM, PAGED, WINDOW, Policy, HEAD_DIM_VO>(p, pol, t, smem, Turns{consumer, solo}, q_pos,
                                                                     lane, st, read);
    // consume() freed Q after its last S: the next unit's Q lands while these rows are written
    if (Tr::kStoreByTma && p.o_by_tma && t.row_begin + 64 * (consumer + 1) <= t.qo_len * p.group_size)
      detail::store_tile_tma<T, HEAD_DIM_VO, Policy>(p, pol, t, w.kv_head, row, consumer, warp, lane, st,
                                                     smem.o_stage(consumer));
    else detail::store_tile<T, HEAD_DIM_VO, Policy>(p, pol, t, w.kv_head, row, lane, st);
  }
  if (consumer == 0) Turns{0, false}.wait();  // the last consumer's last pass
  // the shared memory a TMA store reads must outlive it
  if (Tr::kStoreByTma && warp == 0 && lane == 0) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
#endif
}

}  // namespace flashstep::stages::hopper
