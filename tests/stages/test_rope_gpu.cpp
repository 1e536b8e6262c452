// The RoPE kernel that stage 09's engine and capi/ share (kernels/flashstep/kernels/rope.cuh,
// launched by stages/rope/) against the reference (flashstep/reference/rope.hpp): both
// layouts, partial rotary_dim, plain and Llama 3.1 frequencies, positions given per row or
// from a ragged batch's offsets (empty requests included), positions past 100000, in
// place and not, fp32/fp16/bf16. The inputs are rounded to the dtype before the reference
// sees them; the bound on each element is derived below, not tuned.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/rope.hpp"
#include "harness/device.hpp"
#include "harness/dtype_convert.hpp"
#include "rope/rope_gpu.hpp"
#include "support/random.hpp"

using namespace flashstep;
using stages::DType;
using stages::RopeLaunch;
namespace harness = stages::harness;

namespace {

/// Significand bits (with the implicit one) and half the smallest subnormal of a dtype.
int precision_bits(DType d) { return d == DType::f32 ? 24 : d == DType::f16 ? 11 : 8; }
double subnormal_floor(DType d) { return d == DType::f32 ? 0x1p-150 : d == DType::f16 ? 0x1p-25 : 0x1p-134; }

struct RopeCase {
  DType dtype;
  int nnz, num_q_heads, num_k_heads, head_dim, rotary_dim;
  bool interleave, llama31, by_offsets, in_place;
  /// q and k as the engine holds them: rows of one buffer, Q | K | V (V a sentinel that
  /// must stay), read with row strides; q rotated into a contiguous q_out, k in place
  bool fused_rows = false;
  std::string describe() const {
    return std::string(stages::to_string(dtype)) + " nnz " + std::to_string(nnz) + " heads " +
           std::to_string(num_q_heads) + "/" + std::to_string(num_k_heads) + " d " + std::to_string(head_dim) +
           " rotary " + std::to_string(rotary_dim) + (interleave ? " interleave" : " half") +
           (llama31 ? " llama31" : "") + (by_offsets ? " offsets" : " pos_ids") + (in_place ? " in-place" : "") +
           (fused_rows ? " fused rows" : "");
  }
};

/// Runs one case; returns the number of elements outside the bound (0 expected).
int64_t check_case(const RopeCase& c, std::mt19937_64& rng) {
  // a ragged batch: requests of 0..2 x mean rows, one empty, offsets up to 120000
  std::vector<int32_t> indptr{0}, offsets, pos_ids;
  if (c.by_offsets) {
    while (indptr.back() < c.nnz) {
      const int len = indptr.size() == 2 ? 0 : static_cast<int>(test::random_int(rng, 1, std::max(1, c.nnz / 3)));
      indptr.push_back(std::min(c.nnz, indptr.back() + len));
      offsets.push_back(static_cast<int32_t>(test::random_int(rng, 0, 120000)));
    }
  } else {
    for (int t = 0; t < c.nnz; ++t) pos_ids.push_back(static_cast<int32_t>(test::random_int(rng, 0, 131071)));
  }
  ref::Tensor q = test::random_tensor(rng, {c.nnz, c.num_q_heads, c.head_dim}, -2.0, 2.0);
  ref::Tensor k = test::random_tensor(rng, {c.nnz, c.num_k_heads, c.head_dim}, -2.0, 2.0);
  harness::round_all(c.dtype, q.data);
  harness::round_all(c.dtype, k.data);

  std::vector<double> freqs;
  ref::RopeResult want;
  if (c.llama31) {
    ref::Llama31RopeOptions o;
    o.rotary_dim = c.rotary_dim;
    o.interleave = c.interleave;
    freqs = ref::llama31_rope_frequencies(c.rotary_dim, o);
    want = c.by_offsets ? ref::apply_llama31_rope(q, k, indptr, offsets, o)
                        : ref::apply_llama31_rope_pos_ids(q, k, pos_ids, o);
  } else {
    ref::RopeOptions o;
    o.rotary_dim = c.rotary_dim;
    o.interleave = c.interleave;
    freqs = ref::rope_frequencies(c.rotary_dim, o.rope_scale, o.rope_theta);
    want = c.by_offsets ? ref::apply_rope(q, k, indptr, offsets, o) : ref::apply_rope_pos_ids(q, k, pos_ids, o);
  }

  const auto qb = harness::encode(c.dtype, q.data), kb = harness::encode(c.dtype, k.data);
  harness::DeviceBuffer dq(qb.data(), qb.size()), dk(kb.data(), kb.size());
  // outputs poisoned with NaN, so an element the kernel skips cannot pass
  const auto poison_q = harness::encode(c.dtype, std::vector<double>(q.data.size(), NAN));
  const auto poison_k = harness::encode(c.dtype, std::vector<double>(k.data.size(), NAN));
  harness::DeviceBuffer oq(poison_q.data(), poison_q.size()), ok(poison_k.data(), poison_k.size());
  harness::DeviceBuffer dpos = harness::upload(pos_ids), dind = harness::upload(indptr),
                        doff = harness::upload(offsets);
  RopeLaunch l;
  l.dtype = c.dtype;
  l.q = dq.get();
  l.k = dk.get();
  l.q_out = c.in_place ? dq.get() : oq.get();
  l.k_out = c.in_place ? dk.get() : ok.get();
  l.nnz = c.nnz;
  l.num_q_heads = c.num_q_heads;
  l.num_k_heads = c.num_k_heads;
  l.head_dim = c.head_dim;
  l.rotary_dim = c.rotary_dim;
  l.interleave = c.interleave;
  if (c.by_offsets) {
    l.indptr = dind.as<int32_t>();
    l.offsets = doff.as<int32_t>();
    l.batch_size = static_cast<int>(offsets.size());
  } else {
    l.pos_ids = dpos.as<int32_t>();
  }
  // fused rows: row t = q_t | k_t | v_t, v a sentinel
  const int64_t qw = int64_t{c.num_q_heads} * c.head_dim, kw = int64_t{c.num_k_heads} * c.head_dim;
  const int64_t width = qw + 2 * kw;
  constexpr double kSentinel = 7.0;
  std::vector<double> rows;
  if (c.fused_rows) {
    rows.assign(static_cast<size_t>(c.nnz * width), kSentinel);
    for (int64_t t = 0; t < c.nnz; ++t) {
      for (int64_t j = 0; j < qw; ++j)
        rows[static_cast<size_t>(t * width + j)] = q.data[static_cast<size_t>(t * qw + j)];
      for (int64_t j = 0; j < kw; ++j)
        rows[static_cast<size_t>(t * width + qw + j)] = k.data[static_cast<size_t>(t * kw + j)];
    }
  }
  const auto rows_bytes = harness::encode(c.dtype, rows);
  harness::DeviceBuffer drows(rows_bytes.data(), rows_bytes.size());
  const size_t elem = stages::dtype_bytes(c.dtype);
  if (c.fused_rows) {
    l.q = drows.get();
    l.q_out = oq.get();
    l.k = l.k_out = static_cast<uint8_t*>(drows.get()) + static_cast<size_t>(qw) * elem;
    l.q_stride = l.k_stride = l.k_out_stride = width;
  }
  stages::launch_rope(l, freqs, nullptr);
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> gq(qb.size()), gk(kb.size());
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(gq.data(), l.q_out, gq.size(), cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  if (c.fused_rows) {  // k out of the rows; the sentinels (v) must be where they were
    std::vector<uint8_t> got_rows(rows_bytes.size());
    FLASHSTEP_CUDA_CHECK(cudaMemcpy(got_rows.data(), drows.get(), got_rows.size(), cudaMemcpyDeviceToHost));
    for (int64_t t = 0; t < c.nnz; ++t)
      std::memcpy(gk.data() + static_cast<size_t>(t * kw) * elem,
                  got_rows.data() + static_cast<size_t>(t * width + qw) * elem, static_cast<size_t>(kw) * elem);
    const std::vector<double> all = harness::decode(c.dtype, got_rows, rows.size());
    for (int64_t t = 0; t < c.nnz; ++t)
      for (int64_t j = qw + kw; j < width; ++j)
        if (all[static_cast<size_t>(t * width + j)] != kSentinel) {
          if (bad < 5) MESSAGE("v row " << t << " element " << j - qw - kw << " was overwritten");
          ++bad;
        }
  } else {
    FLASHSTEP_CUDA_CHECK(cudaMemcpy(gk.data(), l.k_out, gk.size(), cudaMemcpyDeviceToHost));
  }

  // The bound, per element: the kernel rounds cos and sin to fp32 (2^-24 relative each),
  // and its two fp32 operations (a product, then a fused multiply-add) add at most
  // 2^-24 (|a| + |b|) each: 4 * 2^-24 * (|a| + |b|) in all; then it rounds the result to
  // the dtype (half an ulp, at most 2^-p |result| with p significand bits, or half the
  // smallest subnormal). The angles are double on both sides.
  const int half = c.rotary_dim / 2;
  auto compare = [&](const ref::Tensor& in, const ref::Tensor& ref_out, const std::vector<uint8_t>& got_bytes,
                     const char* which) {
    const std::vector<double> got = harness::decode(c.dtype, got_bytes, in.data.size());
    const int64_t heads = in.dim(1);
    for (int64_t t = 0; t < c.nnz; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int d = 0; d < c.head_dim; ++d) {
          double partner = 0;  // |a| + |b| of the pair this element belongs to
          if (d < c.rotary_dim) {
            const int i = c.interleave ? d / 2 : d % half;
            const int ia = c.interleave ? 2 * i : i, ib = c.interleave ? 2 * i + 1 : i + half;
            partner = std::abs(in({t, h, ia})) + std::abs(in({t, h, ib}));
          }
          const double r = ref_out({t, h, d}), g = got[static_cast<size_t>((t * heads + h) * c.head_dim + d)];
          const double bound = std::ldexp(std::abs(r), -precision_bits(c.dtype)) + 4 * 0x1p-24 * partner +
                               subnormal_floor(c.dtype);
          if (!(std::abs(g - r) <= bound)) {
            if (bad < 5)
              MESSAGE(which << " row " << t << " head " << h << " dim " << d << ": got " << g << ", reference " << r
                            << ", bound " << bound);
            ++bad;
          }
        }
  };
  compare(q, want.q_rope, gq, "q");
  compare(k, want.k_rope, gk, "k");
  return bad;
}

}  // namespace

TEST_CASE(
    "09_engine: the RoPE kernel equals the reference, both layouts, partial rotary_dim, Llama 3.1, offsets and pos_ids, in place") {
  std::mt19937_64 rng = test::case_rng("rope");
  const DType dtypes[] = {DType::bf16, DType::f16, DType::f32};
  const int dims[] = {64, 128, 256};
  const int heads[][2] = {{32, 8}, {8, 8}, {4, 1}};
  int n = 0, ran = 0;
  for (int flags = 0; flags < 16; ++flags)
    for (int d = 0; d < 3; ++d) {
      RopeCase c;
      c.dtype = dtypes[n % 3];
      c.head_dim = dims[d];
      c.rotary_dim = (n / 3) % 3 == 2 ? c.head_dim / 2 : c.head_dim;  // a third partial
      c.num_q_heads = heads[n % 3][0];
      c.num_k_heads = heads[n % 3][1];
      c.nnz = n % 4 == 0 ? 1 : static_cast<int>(test::random_int(rng, 2, 97));
      c.interleave = flags & 1;
      c.llama31 = flags & 2;
      c.by_offsets = flags & 4;
      c.in_place = flags & 8;
      ++n;
      CAPTURE(c.describe());
      const int64_t bad = check_case(c, rng);
      CHECK_MESSAGE(bad == 0, c.describe() << ": " << bad << " elements outside the bound");
      ++ran;
    }
  CHECK(ran == 48);
}

TEST_CASE("09_engine: the RoPE kernel on fused Q | K | V rows (row strides), as the engine runs it") {
  std::mt19937_64 rng = test::case_rng("rope fused rows");
  const DType dtypes[] = {DType::f16, DType::bf16, DType::f32};
  const int heads[][2] = {{8, 2}, {4, 1}, {8, 8}};
  int ran = 0;
  for (int i = 0; i < 6; ++i) {
    RopeCase c;
    c.dtype = dtypes[i % 3];
    c.head_dim = i < 3 ? 128 : 64;
    c.rotary_dim = i == 5 ? c.head_dim / 2 : c.head_dim;  // a partial one: q's rest is copied out
    c.num_q_heads = heads[i % 3][0];
    c.num_k_heads = heads[i % 3][1];
    c.nnz = i == 0 ? 1 : static_cast<int>(test::random_int(rng, 2, 97));
    c.interleave = i % 2 == 1;
    c.llama31 = i == 4;
    c.by_offsets = i == 2;
    c.in_place = false;
    c.fused_rows = true;
    CAPTURE(c.describe());
    const int64_t bad = check_case(c, rng);
    CHECK_MESSAGE(bad == 0, c.describe() << ": " << bad << " elements outside the bound");
    ++ran;
  }
  CHECK(ran == 6);
}

TEST_SUITE("host") {
TEST_CASE("09_engine: launch_rope refuses bad arguments, naming them") {
  RopeLaunch l;
  l.nnz = 4;
  l.num_q_heads = 2;
  l.num_k_heads = 1;
  l.head_dim = 64;
  l.rotary_dim = 63;
  std::vector<double> f(31, 0.1);
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("rotary_dim"), ref::InvalidArgument);
  l.rotary_dim = 128;
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("rotary_dim"), ref::InvalidArgument);
  l.rotary_dim = 64;
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("frequencies"), ref::InvalidArgument);
  f.resize(32);
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("positions"), ref::InvalidArgument);
  l.head_dim = 1024;
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("head_dim"), ref::InvalidArgument);
  l.head_dim = 64;
  l.nnz = -1;
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("nnz"), ref::InvalidArgument);
  // a row stride shorter than a row (2 q heads of 64: 128 elements), or negative
  l.nnz = 4;
  int32_t position = 0;
  l.pos_ids = &position;  // refused before any launch
  l.q_stride = 64;
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("q_stride"), ref::InvalidArgument);
  l.q_stride = 0;
  l.k_out_stride = -1;
  CHECK_THROWS_WITH_AS(stages::launch_rope(l, f, nullptr), doctest::Contains("k_out_stride"), ref::InvalidArgument);
}
}  // TEST_SUITE("host")
