// Stage 08 (context parallel): the sharding functions, the cost model's decision, and the
// step on 1 and 2 GPUs against the CPU reference over the unsharded requests.
//
// The cases here are too large for the harness's build_case (a batch of 16 x 64k tokens,
// or one request of 1,048,576, is 16 GB of K/V in double), so CpCase builds them the
// same way piece by piece: the harness's layout (lengths, shuffled page ids, spare pages),
// q in [-3, 3] and K/V in [-1, 1] rounded to the dtype, every slot no request owns NaN.
// K/V are drawn per block of at most 65536 tokens, each block from its own seed, and the
// reference (in double) runs on each block as soon as it is drawn:
//   a request of up to 65536 keys: ref::batch_prefill_with_ragged_kv_cache over all of
//     them at once, exactly the unsharded reference;
//   the 1M request: the same over each block of 65536 keys, the 16 block states folded
//     with the reference's exact merge (ref::merge_state; the CPU suite checks it equals
//     attention over the union).
// Each rank's own fp32 state (the intermediate the exchange moves) is checked too,
// against the reference over exactly that rank's keys.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "08_context_parallel/context_parallel.hpp"
#include "08_context_parallel/merge_gathered.hpp"
#include "08_context_parallel/sharding.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/merge.hpp"
#include "harness/case.hpp"
#include "harness/compare.hpp"
#include "harness/device.hpp"
#include "harness/dtype_convert.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::harness;
using namespace flashstep::stages::context_parallel;

namespace {

constexpr int64_t kBlockTokens = 65536;  // K/V drawn and referenced per block of this many keys

/// How a case's pages are cut over the ranks.
enum class Split {
  even,    ///< shard_page_table(table, W): the balanced split
  uneven,  ///< a random cut per request; request 0 all on the last rank, request 1 all on rank 0
  one,     ///< every page on rank 0 (the single_gpu path)
};

const char* to_string(Split s) { return s == Split::even ? "even" : s == Split::uneven ? "uneven" : "all on rank 0"; }

/// A reference state (o (1, Hq, D), lse (1, Hq)) of one request over some of its keys.
struct State {
  ref::Tensor o, lse;
};

State empty_state(int64_t Hq, int64_t D) {
  return {ref::Tensor({1, Hq, D}, 0.0), ref::Tensor({1, Hq}, -std::numeric_limits<double>::infinity())};
}

State merged(const State& a, const State& b) {
  ref::MergedState m = ref::merge_state(a.o, a.lse, b.o, b.lse);
  return {std::move(m.v), std::move(m.s)};
}

/// A case: the batch, its inputs (pool encoded in the dtype), its shards, and the reference
/// answers for the whole batch and for each rank's keys.
struct CpCase {
  CaseSpec spec;
  uint64_t seed = 0;
  Split split = Split::even;
  BatchShape shape;                                  ///< with the host page table (kv_indices)
  std::vector<PageTable> shards;                     ///< one per rank
  ref::Tensor q;                                     ///< (B, Hq, D), rounded to dtype
  std::vector<uint8_t> pool;                         ///< (num_pages, 2, ...) in dtype; 0xff (NaN) where no request owns
  ref::AttentionResult expected;                     ///< (B, Hq, D), (B, Hq)
  std::vector<ref::AttentionResult> expected_shard;  ///< per rank: the state over its keys

  std::string describe() const {
    return spec.describe() + " split=" + to_string(split) + " world_size=" + std::to_string(shards.size()) +
           " (case seed " + std::to_string(seed) + ")";
  }
};

/// Page splits for `split` over `world_size` ranks.
std::vector<std::vector<int32_t>> make_splits(const PageTable& t, int world_size, Split split, std::mt19937_64& rng) {
  std::vector<std::vector<int32_t>> s = even_page_splits(t, world_size);
  for (int r = 0; r < t.batch_size(); ++r) {
    const int32_t pages = t.kv_indptr[r + 1] - t.kv_indptr[r];
    std::vector<int32_t>& b = s[size_t(r)];
    if (split == Split::one) {
      std::fill(b.begin() + 1, b.end(), pages);
    } else if (split == Split::uneven) {
      if (r == 0) std::fill(b.begin(), b.end() - 1, 0);           // every page on the last rank
      else if (r == 1) std::fill(b.begin() + 1, b.end(), pages);  // every page on rank 0
      else {
        std::uniform_int_distribution<int32_t> cut(0, pages);
        for (int k = 1; k < world_size; ++k) b[size_t(k)] = cut(rng);
        std::sort(b.begin() + 1, b.end() - 1);
      }
    }
  }
  return s;
}

/// Writes one token's K (kv = 0) or V row, all heads, into the encoded pool.
void put_token(std::vector<uint8_t>& pool, const BatchShape& s, int64_t page, int64_t slot, int kv,
               const uint8_t* row /* (H, D) encoded */) {
  const int64_t H = s.num_kv_heads, D = s.head_dim, P = s.page_size;
  const size_t elt = dtype_bytes(s.dtype);
  if (s.kv_layout == KVLayout::NHD) {
    std::memcpy(pool.data() + (((page * 2 + kv) * P + slot) * H) * D * elt, row, size_t(H * D) * elt);
    return;
  }
  for (int64_t h = 0; h < H; ++h)
    std::memcpy(pool.data() + (((page * 2 + kv) * H + h) * P + slot) * D * elt, row + h * D * elt, size_t(D) * elt);
}

/// Runs fn(i) for i in [0, n) on the machine's cores.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w)
    threads.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) fn(i);
    });
  for (std::thread& t : threads) t.join();
}

CpCase build_cp_case(const CaseSpec& spec, int world_size, Split split, uint64_t seed,
                     int64_t block_tokens = kBlockTokens) {
  CpCase c;
  c.spec = spec;
  c.seed = seed;
  c.split = split;
  std::mt19937_64 rng(seed);
  c.shape = make_layout(spec, KVStorage::paged, rng).shape;
  const BatchShape& s = c.shape;
  const PageTable table = page_table_of(s);
  c.shards = shard_page_table(table, s.page_size, make_splits(table, world_size, split, rng));
  const int64_t B = s.batch_size, Hq = s.num_qo_heads, H = s.num_kv_heads, D = s.head_dim, P = s.page_size;
  c.q = ref::Tensor({B, Hq, D});
  std::uniform_real_distribution<double> q_dist(-3.0, 3.0);
  for (double& x : c.q.data) x = round_to(s.dtype, q_dist(rng));
  const size_t page_bytes = size_t(2 * P * H * D) * dtype_bytes(s.dtype);
  c.pool.assign(size_t(s.num_pages) * page_bytes, 0xff);

  // The blocks: (request, first key), each at most kBlockTokens keys (a multiple of every page size).
  struct Block {
    int r;
    int64_t begin, end;
  };
  std::vector<Block> blocks;
  for (int r = 0; r < B; ++r)
    for (int64_t t = 0; t < s.kv_len(r); t += block_tokens)
      blocks.push_back({r, t, std::min(s.kv_len(r), t + block_tokens)});
  // Each rank's key range [first, last) of request r.
  auto rank_range = [&](int k, int r) {
    const PageTable& t = c.shards[size_t(k)];
    int64_t first = 0;
    for (int j = 0; j < k; ++j) first += c.shards[size_t(j)].kv_len(r, int(P));
    return std::make_pair(first, first + t.kv_len(r, int(P)));
  };
  // Per block: its state, and the state of its keys on each rank.
  std::vector<State> block_state(blocks.size());
  std::vector<std::vector<State>> piece_state(blocks.size(), std::vector<State>(size_t(world_size)));
  ref::AttentionOptions opt;
  opt.kv_layout = KVLayout::NHD;
  parallel_for(int64_t(blocks.size()), [&](int64_t i) {
    const Block& blk = blocks[size_t(i)];
    const int64_t n = blk.end - blk.begin;
    std::mt19937_64 block_rng(case_seed(seed, "kv block " + std::to_string(blk.r) + " " + std::to_string(blk.begin)));
    std::uniform_real_distribution<double> kv_dist(-1.0, 1.0);
    ref::Tensor k({n, H, D}), v({n, H, D});
    for (double& x : k.data) x = round_to(s.dtype, kv_dist(block_rng));
    for (double& x : v.data) x = round_to(s.dtype, kv_dist(block_rng));
    const std::vector<uint8_t> k_bytes = encode(s.dtype, k.data), v_bytes = encode(s.dtype, v.data);
    const size_t row_bytes = size_t(H * D) * dtype_bytes(s.dtype);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t token = blk.begin + t;
      const int64_t page = s.kv_indices[size_t(s.kv_indptr[blk.r] + token / P)];
      put_token(c.pool, s, page, token % P, 0, k_bytes.data() + t * row_bytes);
      put_token(c.pool, s, page, token % P, 1, v_bytes.data() + t * row_bytes);
    }
    const ref::Tensor q1(
        {1, Hq, D}, std::vector<double>(c.q.data.begin() + blk.r * Hq * D, c.q.data.begin() + (blk.r + 1) * Hq * D));
    auto attend = [&](int64_t a, int64_t b) {  // keys [a, b) of the block
      if (a == 0 && b == n) {
        ref::AttentionResult res = ref::batch_prefill_with_ragged_kv_cache(q1, {0, 1}, k, v,
                                                                           {0, static_cast<int32_t>(n)}, opt);
        return State{std::move(res.o), std::move(res.lse)};
      }
      ref::Tensor ks({b - a, H, D}, std::vector<double>(k.data.begin() + a * H * D, k.data.begin() + b * H * D));
      ref::Tensor vs({b - a, H, D}, std::vector<double>(v.data.begin() + a * H * D, v.data.begin() + b * H * D));
      ref::AttentionResult res = ref::batch_prefill_with_ragged_kv_cache(q1, {0, 1}, ks, vs,
                                                                         {0, static_cast<int32_t>(b - a)}, opt);
      return State{std::move(res.o), std::move(res.lse)};
    };
    block_state[size_t(i)] = attend(0, n);
    for (int w = 0; w < world_size; ++w) {
      const auto [first, last] = rank_range(w, blk.r);
      const int64_t a = std::max(first, blk.begin), b = std::min(last, blk.end);
      if (a >= b) piece_state[size_t(i)][size_t(w)] = empty_state(Hq, D);
      else if (a == blk.begin && b == blk.end) piece_state[size_t(i)][size_t(w)] = block_state[size_t(i)];
      else piece_state[size_t(i)][size_t(w)] = attend(a - blk.begin, b - blk.begin);
    }
  });
  // Fold the blocks of each request (one block up to 65536 keys: nothing to fold).
  auto put = [&](ref::AttentionResult& dst, int r, const State& st) {
    std::copy(st.o.data.begin(), st.o.data.end(), dst.o.data.begin() + r * Hq * D);
    std::copy(st.lse.data.begin(), st.lse.data.end(), dst.lse.data.begin() + r * Hq);
  };
  c.expected = {ref::Tensor({B, Hq, D}), ref::Tensor({B, Hq})};
  c.expected_shard.assign(size_t(world_size), ref::AttentionResult{ref::Tensor({B, Hq, D}), ref::Tensor({B, Hq})});
  for (int r = 0; r < B; ++r) {
    State whole = empty_state(Hq, D);
    std::vector<State> ranks(size_t(world_size), empty_state(Hq, D));
    bool first = true;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].r != r) continue;
      whole = first ? block_state[i] : merged(whole, block_state[i]);
      for (int w = 0; w < world_size; ++w)
        ranks[size_t(w)] = first ? piece_state[i][size_t(w)] : merged(ranks[size_t(w)], piece_state[i][size_t(w)]);
      first = false;
    }
    put(c.expected, r, whole);
    for (int w = 0; w < world_size; ++w) put(c.expected_shard[size_t(w)], r, ranks[size_t(w)]);
  }
  return c;
}

/// What one rank brings back from a run.
struct RankOutput {
  Path path = Path::context_parallel;
  std::vector<double> o, lse, state_o, state_lse;
};

/// Uploads this rank's inputs: q, its shard's page table, and the pool with every page
/// that is not this rank's overwritten with NaN (a rank that reads another's page fails).
struct RankBuffers {
  DeviceBuffer q, kv_indptr, kv_indices, kv_last_page_len, pool, o, lse;
  DeviceBatch batch;
  RankBuffers(const CpCase& c, int rank, cudaStream_t stream) {
    const BatchShape& s = c.shape;
    const PageTable& t = c.shards[size_t(rank)];
    const std::vector<uint8_t> qb = encode(s.dtype, c.q.data);
    q = DeviceBuffer(qb.data(), qb.size());
    kv_indptr = upload(t.kv_indptr);
    kv_indices = upload(t.kv_indices);
    kv_last_page_len = upload(t.kv_last_page_len);
    pool = DeviceBuffer(c.pool.data(), c.pool.size());
    // A copy from pageable memory may return before its DMA lands; the NaN below must come after it.
    FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
    const size_t page_bytes = c.pool.size() / size_t(s.num_pages);
    std::vector<uint8_t> mine(size_t(s.num_pages), 0);
    for (int32_t p : t.kv_indices) mine[size_t(p)] = 1;
    for (int64_t p = 0; p < s.num_pages;) {  // runs of pages that are not this rank's
      if (mine[size_t(p)]) {
        ++p;
        continue;
      }
      int64_t e = p;
      while (e < s.num_pages && !mine[size_t(e)]) ++e;
      FLASHSTEP_CUDA_CHECK(
          cudaMemsetAsync(pool.as<uint8_t>() + p * page_bytes, 0xff, size_t(e - p) * page_bytes, stream));
      p = e;
    }
    const size_t rows = size_t(s.batch_size) * s.num_qo_heads;
    o = DeviceBuffer(rows * s.head_dim * dtype_bytes(s.dtype));
    lse = DeviceBuffer(rows * sizeof(float));
    batch = {q.get(),
             nullptr,
             kv_indptr.as<int32_t>(),
             pool.get(),
             kv_indices.as<int32_t>(),
             kv_last_page_len.as<int32_t>(),
             nullptr,
             nullptr,
             o.get(),
             lse.as<float>()};
  }
  void poison(cudaStream_t stream) const {
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(o.get(), 0xff, o.bytes(), stream));
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xff, lse.bytes(), stream));
  }
};

std::vector<double> download_f32(const float* p, size_t n) {
  std::vector<float> f(n);
  if (n) FLASHSTEP_CUDA_CHECK(cudaMemcpy(f.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return std::vector<double>(f.begin(), f.end());
}

/// Plans and runs `c` on its world_size ranks (as a captured graph, replayed twice, when
/// `graph`); returns what every rank computed.
std::vector<RankOutput> run_case(const CpCase& c, ContextParallelOptions options, bool graph) {
  const int W = static_cast<int>(c.shards.size());
  options.enable_cuda_graph = graph;
  std::vector<RankOutput> out(static_cast<size_t>(W));
  const ncclUniqueId id = Communicator::make_id();
  run_on_ranks(W, [&](int rank) {
    Communicator comm(id, rank, W);
    cudaStream_t stream;
    FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      RankBuffers buf(c, rank, stream);
      ContextParallelRank cp(comm, options);
      DeviceBuffer workspace(cp.workspace_bytes(c.shape));
      FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(workspace.get(), 0xff, workspace.bytes(), stream));  // NaN states
      cp.plan(c.shape, c.shards, workspace.get(), workspace.bytes(), stream);
      buf.poison(stream);
      if (graph) {
        // One eager step first: NCCL sets up its connections on a communicator's first
        // collective and send/recv, which must not happen inside a capture.
        cp.run(buf.batch, stream);
        FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        buf.poison(stream);
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        cp.run(buf.batch, stream);
        FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
        FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
        FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        buf.poison(stream);  // the second replay must write everything again
        FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
        FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(g));
      } else {
        cp.run(buf.batch, stream);
      }
      FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
      RankOutput& r = out[size_t(rank)];
      const size_t rows = size_t(c.shape.batch_size) * c.shape.num_qo_heads;
      r.path = cp.path();
      r.o = decode(c.shape.dtype, buf.o.download(), rows * c.shape.head_dim);
      r.lse = download_f32(buf.lse.as<float>(), rows);
      if (cp.path() == Path::context_parallel) {
        r.state_o = download_f32(cp.local_state_o(), rows * c.shape.head_dim);
        r.state_lse = download_f32(cp.local_state_lse(), rows);
      }
    }
    FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  return out;
}

/// Every rank's o and lse against the unsharded reference; on the context-parallel path
/// each rank's own fp32 state against the reference over its keys.
void check_outputs(const CpCase& c, const std::vector<RankOutput>& out, const std::string& what) {
  const BatchShape& s = c.shape;
  const DTypeTolerance& tol = tolerance_for(s.dtype);
  const DTypeTolerance& f32 = tolerance_for(DType::f32);
  const ElementLabel o_label = output_label(s.qo_indptr, s.num_qo_heads, s.head_dim);
  const ElementLabel lse_label_ = lse_label(s.qo_indptr, s.num_qo_heads);
  for (size_t k = 0; k < out.size(); ++k) {
    const RankOutput& r = out[k];
    const Comparison o = compare("o", r.o, c.expected.o.data, tol.o, o_label);
    const Comparison lse = compare("lse", r.lse, c.expected.lse.data, tol.lse, lse_label_);
    std::string msg = what + " on " + c.describe() + ", rank " + std::to_string(k) + " (path " + to_string(r.path) +
                      ")\n  " + o.summary() + "\n  " + lse.summary();
    bool passed = o.passed && lse.passed;
    if (r.path == Path::context_parallel) {
      const Comparison so = compare("rank state o (fp32)", r.state_o, c.expected_shard[k].o.data, f32.o, o_label);
      const Comparison sl = compare("rank state lse", r.state_lse, c.expected_shard[k].lse.data, f32.lse, lse_label_);
      msg += "\n  " + so.summary() + "\n  " + sl.summary();
      passed = passed && so.passed && sl.passed;
    }
    CHECK_MESSAGE(passed, msg);
    if (passed) std::printf("  PASS %s rank %zu: %s\n", what.c_str(), k, c.describe().c_str());
  }
}

CaseSpec spec_of(int batch, int kv_len, LengthPolicy lengths, DType dtype, int qo_heads, int kv_heads,
                 int page_size = 16, KVLayout layout = KVLayout::NHD) {
  CaseSpec c;
  c.batch_size = batch;
  c.kv_len = kv_len;
  c.lengths = lengths;
  c.dtype = dtype;
  c.num_qo_heads = qo_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 128;
  c.page_size = page_size;
  c.kv_layout = layout;
  return c;
}

/// Builds and checks `spec` on world_size ranks, through both exchanges.
void check_spec(const CaseSpec& spec, int world_size, Split split, bool graph = false) {
  const uint64_t seed = case_seed(test::run_seed(), "context_parallel " + spec.describe() + " " + to_string(split) +
                                                        " " + std::to_string(world_size));
  const CpCase c = build_cp_case(spec, world_size, split, seed);
  for (Exchange e : {Exchange::all_gather, Exchange::all_to_all}) {
    if (e == Exchange::all_to_all && spec.num_qo_heads % world_size) continue;
    ContextParallelOptions options;
    options.exchange = e;
    const std::vector<RankOutput> out = run_case(c, options, graph);
    check_outputs(c, out, std::string(to_string(e)) + (graph ? " (CUDA graph, replayed twice)" : ""));
    int holders = 0;
    for (const PageTable& t : c.shards) holders += !t.kv_indices.empty();
    if (split == Split::one || world_size == 1) CHECK(holders <= 1);
    for (const RankOutput& r : out) CHECK(r.path == (holders <= 1 ? Path::single_gpu : Path::context_parallel));
  }
}

PageTable small_table() {
  // request 0: 5 pages, last 3 of 16; request 1: none; request 2: 1 page of 16; request 3: 2 pages, last 1
  return PageTable{{0, 5, 5, 6, 8}, {40, 41, 42, 43, 44, 7, 9, 8}, {3, 0, 16, 1}};
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("context_parallel sharding: the balanced split by sequence position") {
  const PageTable t = small_table();
  const std::vector<PageTable> s = shard_page_table(t, 16, 2);
  REQUIRE(s.size() == 2);
  // rank 0: pages [0, 2) of request 0, none of 1, [0, 0) of 2, [0, 1) of 3
  CHECK(s[0].kv_indptr == std::vector<int32_t>{0, 2, 2, 2, 3});
  CHECK(s[0].kv_indices == std::vector<int32_t>{40, 41, 9});
  CHECK(s[0].kv_last_page_len == std::vector<int32_t>{16, 0, 0, 16});
  // rank 1: the rest, and every request's last page with its length
  CHECK(s[1].kv_indptr == std::vector<int32_t>{0, 3, 3, 4, 5});
  CHECK(s[1].kv_indices == std::vector<int32_t>{42, 43, 44, 7, 8});
  CHECK(s[1].kv_last_page_len == std::vector<int32_t>{3, 0, 16, 1});
  CHECK(s[0].kv_len(0, 16) + s[1].kv_len(0, 16) == t.kv_len(0, 16));
  CHECK_NOTHROW(check_shards(t, 16, s, "test"));
  // more ranks than pages: some ranks hold nothing of a request
  const std::vector<PageTable> s4 = shard_page_table(t, 16, 4);
  CHECK(s4[0].kv_indptr[3] - s4[0].kv_indptr[2] == 0);
  CHECK(s4[3].kv_last_page_len == std::vector<int32_t>{3, 0, 16, 1});
  CHECK_NOTHROW(check_shards(t, 16, s4, "test"));
}

TEST_CASE("context_parallel sharding: explicit uneven and empty splits keep the last page last") {
  const PageTable t = small_table();
  // request 0: everything on rank 2; request 3: its full first page on rank 0, its partial last page on rank 1
  const std::vector<PageTable> s = shard_page_table(t, 16, {{0, 0, 0, 5}, {0, 0, 0, 0}, {0, 1, 1, 1}, {0, 1, 2, 2}});
  CHECK(s[0].kv_indices == std::vector<int32_t>{7, 9});
  CHECK(s[0].kv_last_page_len == std::vector<int32_t>{0, 0, 16, 16});
  CHECK(s[1].kv_indices == std::vector<int32_t>{8});
  CHECK(s[1].kv_last_page_len == std::vector<int32_t>{0, 0, 0, 1});
  CHECK(s[2].kv_indices == std::vector<int32_t>{40, 41, 42, 43, 44});
  CHECK(s[2].kv_last_page_len == std::vector<int32_t>{3, 0, 0, 0});
  CHECK_NOTHROW(check_shards(t, 16, s, "test"));
  // Random tables and cuts: the shards always cover every request exactly.
  auto rng = test::case_rng("context_parallel random shards");
  for (int trial = 0; trial < 200; ++trial) {
    PageTable r;
    r.kv_indptr = {0};
    const int batch = int(test::random_int(rng, 1, 6)), P = int(test::random_int(rng, 1, 32));
    for (int b = 0; b < batch; ++b) {
      const int pages = int(test::random_int(rng, 0, 40));
      r.kv_indptr.push_back(r.kv_indptr.back() + pages);
      r.kv_last_page_len.push_back(pages ? int32_t(test::random_int(rng, 1, P)) : 0);
    }
    for (int i = 0; i < r.kv_indptr.back(); ++i) r.kv_indices.push_back(1000 - i);
    const int W = int(test::random_int(rng, 1, 8));
    std::vector<std::vector<int32_t>> splits = even_page_splits(r, W);
    for (auto& sp : splits) {
      for (int k = 1; k < W; ++k) sp[size_t(k)] = int32_t(test::random_int(rng, 0, sp.back()));
      std::sort(sp.begin() + 1, sp.end() - 1);
    }
    CAPTURE(trial);
    const std::vector<PageTable> shards = shard_page_table(r, P, splits);
    CHECK_NOTHROW(check_shards(r, P, shards, "test"));
    for (int b = 0; b < batch; ++b) {
      int64_t sum = 0;
      for (const PageTable& x : shards) sum += x.kv_len(b, P);
      CHECK(sum == r.kv_len(b, P));
    }
  }
}

TEST_CASE("context_parallel sharding: bad input names the argument") {
  const PageTable t = small_table();
  CHECK_THROWS_WITH_AS(shard_page_table(t, 16, 0), doctest::Contains("world_size must be >= 1"), ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(shard_page_table(t, 16, {{0, 5}, {0, 0}, {0, 1}}), doctest::Contains("page_splits"),
                       ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(shard_page_table(t, 16, {{0, 4}, {0, 0}, {0, 1}, {0, 2}}),
                       doctest::Contains("page_splits[0] must start at page 0 and end at the request's page count 5"),
                       ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(shard_page_table(t, 16, {{0, 3, 2, 5}, {0, 0, 0, 0}, {0, 1, 1, 1}, {0, 1, 2, 2}}),
                       doctest::Contains("page_splits[0] must not decrease"), ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(shard_page_table(t, 16, {{0, 2, 5}, {0, 0}, {0, 1}, {0, 2}}),
                       doctest::Contains("page_splits[1] has 2 entries"), ref::InvalidArgument);
  PageTable bad = t;
  bad.kv_last_page_len[0] = 17;
  CHECK_THROWS_WITH_AS(shard_page_table(bad, 16, 2), doctest::Contains("table.kv_last_page_len[0]"),
                       ref::InvalidArgument);
  std::vector<PageTable> s = shard_page_table(t, 16, 2);
  std::vector<PageTable> missing = s;
  missing[1].kv_indices.pop_back();
  missing[1].kv_indptr.back() -= 1;
  missing[1].kv_last_page_len.back() = 16;
  CHECK_THROWS_WITH_AS(check_shards(t, 16, missing, "plan"), doctest::Contains("shards do not cover request 3"),
                       ref::InvalidArgument);
  std::vector<PageTable> partial = s;
  partial[0].kv_last_page_len[0] = 3;  // a partial page in the middle of request 0
  CHECK_THROWS_WITH_AS(check_shards(t, 16, partial, "plan"), doctest::Contains("shards[0].kv_last_page_len[0]"),
                       ref::InvalidArgument);
  std::vector<PageTable> short_batch = s;
  short_batch[1] = PageTable{{0, 3}, {42, 43, 44}, {3}};
  CHECK_THROWS_WITH_AS(check_shards(t, 16, short_batch, "plan"), doctest::Contains("shards[1] has 1 requests"),
                       ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_exchange("ring"), doctest::Contains("exchange must be"), ref::InvalidArgument);
}

TEST_CASE("context_parallel cost model: short batches stay on one GPU, a 1M-token request spreads") {
  BatchShape s;
  s.dtype = DType::bf16;
  s.batch_size = 1;
  s.num_qo_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.page_size = 16;
  auto with_tokens = [&](int64_t tokens) {
    BatchShape b = s;
    const int32_t pages = int32_t((tokens + 15) / 16);
    b.qo_indptr = {0, 1};
    b.kv_indptr = {0, pages};
    b.kv_last_page_len = {int32_t(tokens - int64_t(pages - 1) * 16)};
    b.kv_indices.resize(size_t(pages));
    for (int32_t i = 0; i < pages; ++i) b.kv_indices[size_t(i)] = i;
    b.num_pages = pages;
    return b;
  };
  const CostModel cost;
  // one GPU of the model's round figures for an H200: stage 03 streams 4 TB/s
  DeviceModel h200 = kernels::kFallbackDeviceModel;
  h200.read_bytes_per_second = 4.0e12;
  const ShardPlan small = plan_shards(with_tokens(2048), 8, Exchange::all_gather, h200, cost);
  CHECK(small.ranks_used == 1);
  CHECK(small.shards.size() == 8);
  for (size_t k = 1; k < 8; ++k) CHECK(small.shards[k].kv_indices.empty());
  const ShardPlan big = plan_shards(with_tokens(1 << 20), 2, Exchange::all_gather, h200, cost);
  CHECK(big.ranks_used == 2);
  REQUIRE(big.estimates.size() == 2);
  // 1M tokens x 8 heads x 128 x 2 (K, V) x 2 bytes at 4 TB/s: 1.07 ms on one GPU, half on each of two
  CHECK(big.estimates[0].read_seconds == doctest::Approx(4294967296.0 / 4.0e12));
  CHECK(big.estimates[1].read_seconds == doctest::Approx(big.estimates[0].read_seconds / 2));
  CHECK(big.estimates[1].exchange_seconds >= cost.collective_seconds);
  CHECK(big.estimates[0].exchange_seconds == 0);
  // the all-to-all pays two collective latencies
  const ShardPlan a2a = plan_shards(with_tokens(1 << 20), 2, Exchange::all_to_all, h200, cost);
  CHECK(a2a.estimates[1].exchange_seconds > big.estimates[1].exchange_seconds);
}

TEST_CASE(
    "context_parallel test cases: the pool, the blocks and the shards' references agree with the paged reference") {
  // The case builder itself, on the CPU: the reference's own paged decode over the decoded
  // pool (whole page table, and each shard's) must give the block-wise answers, here with
  // blocks of 64 keys so that the fold of block states is exercised too.
  for (Split split : {Split::even, Split::uneven}) {
    const CaseSpec spec = spec_of(4, 300, LengthPolicy::ragged_with_empty, DType::bf16, 8, 2, 16, KVLayout::HND);
    const uint64_t seed = case_seed(test::run_seed(), std::string("context_parallel builder ") + to_string(split));
    CAPTURE(seed);
    const CpCase c = build_cp_case(spec, 3, split, seed, 64);
    const BatchShape& s = c.shape;
    ref::PagedKVCache cache;
    cache.layout = s.kv_layout;
    cache.pages = ref::Tensor({s.num_pages, 2, s.num_kv_heads, s.page_size, s.head_dim},
                              decode(s.dtype, c.pool, c.pool.size() / dtype_bytes(s.dtype)));
    ref::AttentionOptions opt;
    auto check_close = [](const std::vector<double>& a, const std::vector<double>& b) {
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isinf(b[i])) CHECK(a[i] == b[i]);
        else CHECK(std::abs(a[i] - b[i]) <= 1e-9 * (1 + std::abs(b[i])));
      }
    };
    for (int k = -1; k < 3; ++k) {  // -1: the whole page table
      const PageTable t = k < 0 ? page_table_of(s) : c.shards[size_t(k)];
      cache.kv_indptr = t.kv_indptr;
      cache.kv_indices = t.kv_indices;
      cache.kv_last_page_len = t.kv_last_page_len;
      const ref::AttentionResult got = ref::batch_decode_with_paged_kv_cache(c.q, cache, opt);
      const ref::AttentionResult& want = k < 0 ? c.expected : c.expected_shard[size_t(k)];
      CAPTURE(k);
      for (int r = 0; r < s.batch_size; ++r) {
        if (t.kv_indptr[r + 1] > t.kv_indptr[r]) continue;
        // a request with no keys here: the empty state (the reference's own answer is not defined)
        for (int64_t h = 0; h < s.num_qo_heads; ++h) CHECK(std::isinf(want.lse.data[size_t(r * s.num_qo_heads + h)]));
      }
      std::vector<double> got_o = got.o.data, got_lse = got.lse.data;
      for (int r = 0; r < s.batch_size; ++r)
        if (t.kv_indptr[r + 1] == t.kv_indptr[r]) {
          std::fill_n(got_o.begin() + int64_t(r) * s.num_qo_heads * s.head_dim, s.num_qo_heads * s.head_dim, 0.0);
          std::fill_n(got_lse.begin() + int64_t(r) * s.num_qo_heads, s.num_qo_heads,
                      -std::numeric_limits<double>::infinity());
        }
      check_close(got_o, want.o.data);
      check_close(got_lse, want.lse.data);
    }
  }
}

}  // TEST_SUITE("host")

TEST_SUITE("one_gpu") {

TEST_CASE("context_parallel world_size 1: stage 03 on one GPU, no exchange") {
  check_spec(spec_of(3, 300, LengthPolicy::ragged_with_empty, DType::bf16, 32, 8), 1, Split::even);
  check_spec(spec_of(16, 4096, LengthPolicy::ragged, DType::f16, 32, 4, 16, KVLayout::HND), 1, Split::even);
  check_spec(spec_of(2, 1000, LengthPolicy::uniform, DType::bf16, 8, 8, 1), 1, Split::even, true);
}

TEST_CASE("context_parallel: bad world_size and shards are refused, naming the argument") {
  CHECK_THROWS_WITH_AS(run_on_ranks(device_count() + 1, [](int) {}), doctest::Contains("world_size must be 1.."),
                       ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(run_on_ranks(0, [](int) {}), doctest::Contains("world_size"), ref::InvalidArgument);
  const CaseSpec spec = spec_of(2, 100, LengthPolicy::ragged, DType::bf16, 32, 8);
  const CpCase c = build_cp_case(spec, 1, Split::even, case_seed(test::run_seed(), "context_parallel refusals"));
  const ncclUniqueId id = Communicator::make_id();
  run_on_ranks(1, [&](int rank) {
    CHECK_THROWS_WITH_AS(Communicator(id, 1, 1), doctest::Contains("rank must be 0..world_size-1"),
                         ref::InvalidArgument);
    Communicator comm(id, rank, 1);
    ContextParallelRank cp(comm);
    DeviceBuffer workspace(cp.workspace_bytes(c.shape));
    std::vector<PageTable> two = shard_page_table(page_table_of(c.shape), c.shape.page_size, 2);
    CHECK_THROWS_WITH_AS(cp.plan(c.shape, two, workspace.get(), workspace.bytes(), nullptr),
                         doctest::Contains("shards must have one page table per rank (world_size 1)"),
                         ref::InvalidArgument);
    std::vector<PageTable> wrong = c.shards;
    std::swap(wrong[0].kv_indices[0], wrong[0].kv_indices[1]);
    CHECK_THROWS_WITH_AS(cp.plan(c.shape, wrong, workspace.get(), workspace.bytes(), nullptr),
                         doctest::Contains("shards do not cover request 0"), ref::InvalidArgument);
    CHECK_THROWS_WITH_AS(cp.plan(c.shape, c.shards, workspace.get(), workspace.bytes() - 1, nullptr),
                         doctest::Contains("workspace_size"), ref::InvalidArgument);
    BatchShape prefill = c.shape;
    prefill.mode = Mode::prefill;
    CHECK_THROWS_WITH_AS(cp.workspace_bytes(prefill), doctest::Contains("paged decode only"), ref::InvalidArgument);
  });
}

TEST_CASE("context_parallel: merge_gathered_states folds W gathered states exactly, empty ones included") {
  // Random normalized states in the all-gather layout (state j of request r at row
  // j * B + r), some empty (lse = -inf) and request 1 with no state at all, merged on the
  // GPU and by the reference's merge_states.
  std::mt19937_64 rng(case_seed(test::run_seed(), "context_parallel merge_gathered_states"));
  std::uniform_real_distribution<double> value(-1.0, 1.0), score(-20.0, 20.0);
  for (int D : {64, 128, 256}) {
    const int W = D == 128 ? 1 : 3, B = 5, Hq = 4;
    std::vector<float> states_o(size_t(W) * B * Hq * D), states_lse(size_t(W) * B * Hq);
    ref::Tensor v({B, W, Hq, D}), lse({B, W, Hq});
    for (int j = 0; j < W; ++j)
      for (int r = 0; r < B; ++r)
        for (int h = 0; h < Hq; ++h) {
          const size_t row = (size_t(j) * B + r) * Hq + h;
          const bool empty = r == 1 || (j == 0 && h == 2);
          const float s = empty ? -std::numeric_limits<float>::infinity() : static_cast<float>(score(rng));
          states_lse[row] = s;
          lse({r, j, h}) = s;
          for (int d = 0; d < D; ++d) {
            const float x = empty ? 0.f : static_cast<float>(value(rng));
            states_o[row * D + d] = x;
            v({r, j, h, d}) = x;
          }
        }
    const ref::MergedState want = ref::merge_states(v, lse);
    DeviceBuffer o_dev(states_o.data(), states_o.size() * sizeof(float));
    DeviceBuffer lse_dev(states_lse.data(), states_lse.size() * sizeof(float));
    DeviceBuffer out(size_t(B) * Hq * D * sizeof(float)), out_lse(size_t(B) * Hq * sizeof(float));
    merge_gathered_states(o_dev.as<float>(), lse_dev.as<float>(), W, B, Hq, D, DType::f32, out.get(),
                          out_lse.as<float>(), nullptr);
    FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
    const DTypeTolerance& f32 = tolerance_for(DType::f32);
    std::vector<int32_t> one_each(size_t(B) + 1);  // one query row per request
    std::iota(one_each.begin(), one_each.end(), 0);
    const Comparison co = compare("o", download_f32(out.as<float>(), size_t(B) * Hq * D), want.v.data, f32.o,
                                  output_label(one_each, Hq, D));
    const Comparison cl = compare("lse", download_f32(out_lse.as<float>(), size_t(B) * Hq), want.s.data, f32.lse,
                                  lse_label(one_each, Hq));
    CHECK_MESSAGE((co.passed && cl.passed),
                  "W " << W << ", head_dim " << D << "\n  " << co.summary() << "\n  " << cl.summary());
  }
  CHECK_THROWS_WITH_AS(merge_gathered_states(nullptr, nullptr, 0, 1, 32, 128, DType::bf16, nullptr, nullptr, nullptr),
                       doctest::Contains("states_per_request must be >= 1"), ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(merge_gathered_states(nullptr, nullptr, 2, 1, 32, 96, DType::bf16, nullptr, nullptr, nullptr),
                       doctest::Contains("head_dim must be 64, 128 or 256"), ref::InvalidArgument);
}

}  // TEST_SUITE("one_gpu")

TEST_SUITE("two_gpus") {

TEST_CASE("context_parallel 2 GPUs: one request of 1,048,576 keys against the double reference") {
  // bf16, 32/8 heads, head_dim 128, page 16: 4 GB of K/V, 2 GB per GPU.
  check_spec(spec_of(1, 1 << 20, LengthPolicy::uniform, DType::bf16, 32, 8), 2, Split::even);
}

TEST_CASE("context_parallel 2 GPUs: batch 16 x 64k keys, even split, CUDA graph") {
  check_spec(spec_of(16, 65536, LengthPolicy::uniform, DType::bf16, 32, 8), 2, Split::even, true);
}

TEST_CASE("context_parallel 2 GPUs: uneven and empty shards, GQA 1/4/8, fp16/bf16, NHD/HND") {
  check_spec(spec_of(8, 65536, LengthPolicy::ragged_with_empty, DType::f16, 32, 8), 2, Split::uneven);
  check_spec(spec_of(4, 20000, LengthPolicy::ragged_with_empty, DType::bf16, 8, 8, 16, KVLayout::HND), 2,
             Split::uneven);
  check_spec(spec_of(6, 3000, LengthPolicy::ragged, DType::f16, 32, 4, 1), 2, Split::uneven);
  check_spec(spec_of(3, 33, LengthPolicy::ragged_with_empty, DType::bf16, 32, 8), 2, Split::uneven);
  check_spec(spec_of(1, 1, LengthPolicy::uniform, DType::f16, 32, 8), 2, Split::even);  // one key: rank 0 empty
  check_spec(spec_of(16, 5000, LengthPolicy::ragged, DType::bf16, 64, 8, 64, KVLayout::HND), 2, Split::uneven, true);
}

TEST_CASE("context_parallel 2 GPUs: a batch held by one rank runs stage 03 there and broadcasts") {
  check_spec(spec_of(4, 2000, LengthPolicy::ragged, DType::bf16, 32, 8), 2, Split::one);
  check_spec(spec_of(4, 2000, LengthPolicy::ragged, DType::f16, 32, 4), 2, Split::one, true);
}

}  // TEST_SUITE("two_gpus")
