// The kernels/ building blocks on the device, each against an independent host
// computation: FastDivmod against / and %, Vec16 against CUDA's host conversions,
// cp.async zero-fill, and the online-softmax state (chunked updates, merges in any
// order) against a two-pass softmax in double.
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/state.cuh"
#include "flashstep/kernels/vec.cuh"
#include "harness/compare.hpp"
#include "harness/device.hpp"
#include "support/random.hpp"

using namespace flashstep;
using stages::harness::DeviceBuffer;
using stages::harness::download;
using stages::harness::upload;

namespace {

__global__ void divmod_kernel(const uint32_t* n, int count, kernels::FastDivmod fd, uint32_t* q, uint32_t* r) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) fd.divmod(n[i], q[i], r[i]);
}

template <typename T>
__global__ void vec_roundtrip_kernel(const T* in, float* widened, T* narrowed, int vectors) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= vectors) return;
  constexpr int N = kernels::Vec16<T>::kSize;
  kernels::Vec16<T> v;
  v.load(in + i * N);
  float f[N];
  v.to_float(f);
  for (int e = 0; e < N; ++e) widened[i * N + e] = f[e];
  kernels::Vec16<T> w;
  w.from_float(f);
  w.store(narrowed + i * N);
}

/// 64 threads copy 64 x 16 bytes to shared memory, odd chunks marked invalid, and write
/// the shared-memory contents back out.
__global__ void cp_async_kernel(const uint4* src, uint4* dst) {
  __shared__ uint4 buf[64];
  const int t = threadIdx.x;
  kernels::cp_async_16(&buf[t], &src[t], t % 2 == 0);
  kernels::cp_async_commit_group();
  kernels::cp_async_wait_group<0>();
  __syncthreads();
  dst[t] = buf[(t + 1) % 64];  // read a neighbour's chunk: the barrier made it visible
}

/// One thread per row: keys [0, n) in chunks of `chunk`, each chunk folded into its own
/// state and the chunk states merged in reverse order; writes o (4 dims) and lse.
__global__ void softmax_state_kernel(const float* s, const float* v, int rows, int n, int chunk, float* o, float* lse) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  kernels::SoftmaxState<4> total;
  total.init();
  for (int end = n; end > 0; end -= chunk) {  // chunks from the last one back: order must not matter
    const int begin = end - chunk > 0 ? end - chunk : 0;
    kernels::SoftmaxState<4> part;
    part.init();
    for (int j = begin; j < end; ++j) {
      const float s2 = s[row * n + j] * kernels::kLog2e;
      part.rescale_to(fmaxf(part.m, s2));
      part.add(s2, v + (row * n + j) * 4);
    }
    total.merge(part.m, part.d, part.o);
  }
  total.output(o + row * 4);
  lse[row] = total.lse();
}

/// Two normalized states per pair (v_a = 1, lse_a) and (v_b = 3, lse_b), merged twice: by
/// merge_normalized, and by init(max) + absorb (the form of the multi-state merges).
/// out[4 i ..]: o and lse of the first, o and lse of the second.
__global__ void merge_pairs_kernel(const float* lse_a, const float* lse_b, int count, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float v_a = 1.f, v_b = 3.f;
  kernels::SoftmaxState<1> pairwise;
  pairwise.init();
  pairwise.merge_normalized(lse_a[i], &v_a);
  pairwise.merge_normalized(lse_b[i], &v_b);
  const float m_a = lse_a[i] * kernels::kLog2e, m_b = lse_b[i] * kernels::kLog2e;
  kernels::SoftmaxState<1> summed;
  summed.init(fmaxf(m_a, m_b));
  summed.absorb(m_a, lse_a[i] == -INFINITY ? 0.f : 1.f, &v_a);
  summed.absorb(m_b, lse_b[i] == -INFINITY ? 0.f : 1.f, &v_b);
  pairwise.output(&out[4 * i]);
  out[4 * i + 1] = pairwise.lse();
  summed.output(&out[4 * i + 2]);
  out[4 * i + 3] = summed.lse();
}

}  // namespace

TEST_CASE("kernels: FastDivmod on the device equals / and % for page sizes 1..64 and more") {
  auto rng = test::case_rng("FastDivmod device");
  std::vector<uint32_t> n(4096);
  for (size_t i = 0; i < n.size(); ++i) n[i] = i < 2048 ? static_cast<uint32_t>(i) : static_cast<uint32_t>(rng());
  const DeviceBuffer n_dev = upload(n);
  DeviceBuffer q_dev(n.size() * 4), r_dev(n.size() * 4);
  for (uint32_t d : {1u, 2u, 3u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 63u, 64u, 100u, 1000u, 65537u}) {
    CAPTURE(d);
    divmod_kernel<<<(n.size() + 255) / 256, 256>>>(n_dev.as<uint32_t>(), static_cast<int>(n.size()),
                                                   kernels::FastDivmod(d), q_dev.as<uint32_t>(), r_dev.as<uint32_t>());
    kernels::check_launch("divmod_kernel");
    const auto q = download<uint32_t>(q_dev), r = download<uint32_t>(r_dev);
    int wrong = 0;
    for (size_t i = 0; i < n.size(); ++i) wrong += q[i] != n[i] / d || r[i] != n[i] % d;
    CHECK(wrong == 0);
  }
}

TEST_CASE_TEMPLATE("kernels: Vec16 widens exactly and narrows like the host", T, float, __half, __nv_bfloat16) {
  auto rng = test::case_rng("Vec16");
  const std::vector<double> values = test::random_tensor(rng, {1024}, -100.0, 100.0).data;
  std::vector<T> in(values.size());
  for (size_t i = 0; i < values.size(); ++i) in[i] = static_cast<T>(static_cast<float>(values[i]));
  const DeviceBuffer in_dev = upload(in);
  DeviceBuffer widened(in.size() * sizeof(float)), narrowed(in.size() * sizeof(T));
  const int vectors = static_cast<int>(in.size()) / kernels::Vec16<T>::kSize;
  vec_roundtrip_kernel<T>
      <<<(vectors + 127) / 128, 128>>>(in_dev.as<T>(), widened.as<float>(), narrowed.as<T>(), vectors);
  kernels::check_launch("vec_roundtrip_kernel");
  const auto w = download<float>(widened);
  const auto n = download<T>(narrowed);
  int wrong = 0;
  for (size_t i = 0; i < in.size(); ++i)
    wrong += w[i] != static_cast<float>(in[i]) || static_cast<float>(n[i]) != static_cast<float>(in[i]);
  CHECK(wrong == 0);
}

TEST_CASE("kernels: cp.async copies valid chunks and zero-fills the others") {
  std::vector<uint4> src(64);
  for (int i = 0; i < 64; ++i) src[i] = make_uint4(4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4);
  const DeviceBuffer src_dev = upload(src);
  DeviceBuffer dst_dev(64 * sizeof(uint4));
  FLASHSTEP_CUDA_CHECK(cudaMemset(dst_dev.get(), 0xff, dst_dev.bytes()));
  cp_async_kernel<<<1, 64>>>(src_dev.as<uint4>(), dst_dev.as<uint4>());
  kernels::check_launch("cp_async_kernel");
  const auto dst = download<uint4>(dst_dev);
  for (int t = 0; t < 64; ++t) {
    const int c = (t + 1) % 64;
    const uint4 want = c % 2 == 0 ? src[c] : make_uint4(0, 0, 0, 0);
    CHECK(dst[t].x == want.x);
    CHECK(dst[t].w == want.w);
  }
}

TEST_CASE("kernels: SoftmaxState, chunked and merged in any order, equals softmax in double") {
  auto rng = test::case_rng("SoftmaxState");
  const int rows = 64, n = 300;
  // Scores spread wide (up to +-30) so the running max really moves and rescales.
  const std::vector<double> s = test::random_tensor(rng, {rows, n}, -30.0, 30.0).data;
  const std::vector<double> v = test::random_tensor(rng, {rows, n, 4}, -1.0, 1.0).data;
  const std::vector<float> s32(s.begin(), s.end()), v32(v.begin(), v.end());
  std::vector<double> s_f(s32.begin(), s32.end()), v_f(v32.begin(), v32.end());  // what the device sees
  const DeviceBuffer s_dev = upload(s32), v_dev = upload(v32);
  for (int chunk : {1, 7, 64, 300}) {
    CAPTURE(chunk);
    DeviceBuffer o_dev(rows * 4 * sizeof(float)), lse_dev(rows * sizeof(float));
    softmax_state_kernel<<<1, rows>>>(s_dev.as<float>(), v_dev.as<float>(), rows, n, chunk, o_dev.as<float>(),
                                      lse_dev.as<float>());
    kernels::check_launch("softmax_state_kernel");
    const auto o = download<float>(o_dev), lse = download<float>(lse_dev);
    std::vector<double> o_ref, lse_ref, o_got(o.begin(), o.end()), lse_got(lse.begin(), lse.end());
    for (int r = 0; r < rows; ++r) {
      const double m = *std::max_element(s_f.begin() + r * n, s_f.begin() + (r + 1) * n);
      double d = 0, acc[4] = {};
      for (int j = 0; j < n; ++j) {
        const double p = std::exp(s_f[r * n + j] - m);
        d += p;
        for (int e = 0; e < 4; ++e) acc[e] += p * v_f[(r * n + j) * 4 + e];
      }
      for (int e = 0; e < 4; ++e) o_ref.push_back(acc[e] / d);
      lse_ref.push_back(m + std::log(d));
    }
    const auto label = [](int64_t i) { return "(element " + std::to_string(i) + ")"; };
    const auto& tol = stages::harness::tolerance_for(stages::DType::f32);
    const auto co = stages::harness::compare("o", o_got, o_ref, tol.o, label);
    const auto cl = stages::harness::compare("lse", lse_got, lse_ref, tol.lse, label);
    CHECK_MESSAGE(co.passed, co.summary());
    CHECK_MESSAGE(cl.passed, cl.summary());
  }
}

TEST_CASE("kernels: the merge of normalized states handles empty states (lse = -inf) exactly") {
  const std::vector<float> a{0.f, -INFINITY, -INFINITY, 3.f, 100.f};
  const std::vector<float> b{0.f, 2.f, -INFINITY, -INFINITY, 99.f};
  const DeviceBuffer a_dev = upload(a), b_dev = upload(b);
  DeviceBuffer out_dev(a.size() * 4 * sizeof(float));
  merge_pairs_kernel<<<1, 32>>>(a_dev.as<float>(), b_dev.as<float>(), static_cast<int>(a.size()), out_dev.as<float>());
  kernels::check_launch("merge_pairs_kernel");
  const auto w = download<float>(out_dev);
  const double e = std::exp(-1.0);
  for (int form = 0; form < 2; ++form) {  // merge_normalized, then init(max) + absorb
    CAPTURE(form);
    const float* r = w.data() + 2 * form;
    CHECK(r[0] == doctest::Approx(2.0));  // equal weights: (1 + 3) / 2
    CHECK(r[1] == doctest::Approx(std::log(2.0)));
    CHECK(r[4] == doctest::Approx(3.0));  // A empty: B alone
    CHECK(r[5] == doctest::Approx(2.0));
    CHECK(r[8] == 0.f);  // both empty: the empty state
    CHECK(r[9] == -INFINITY);
    CHECK(r[12] == doctest::Approx(1.0));  // B empty: A alone
    CHECK(r[13] == doctest::Approx(3.0));
    CHECK(r[16] == doctest::Approx((1.0 + 3.0 * e) / (1.0 + e)));
    CHECK(r[17] == doctest::Approx(100.0 + std::log1p(e)));  // no overflow at large lse
  }
}
