// Stage 06 — row transforms: softmax, top_k_renorm_probs, top_p_renorm_probs,
// top_k_mask_logits. One block per output row, built from the passes of row_passes.cuh.
//
// The renorm and mask operators need the value where a row is cut (the k-th largest,
// or the smallest head reaching top_p). Without a sort, the block bisects on the value:
// order keys (row_passes.cuh) turn floats into unsigned integers with the same order, and
// ~30 halvings of the key range, each one counting pass (count or exact mass above the
// key), find the cut exactly, ties included. Slow next to a radix select (4 passes of
// 8-bit histograms), but short and obviously exact; the chapter's exercise list has it.
#include <cmath>
#include <limits>
#include <cstdint>
#include <string>

#include "06_sampling/launch.hpp"
#include "06_sampling/row_passes.cuh"
#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::sampling {

namespace device {

enum class Transform { softmax, top_k_renorm, top_p_renorm, top_k_mask };

/// One launch of a row transform.
struct TransformParams {
  const void* in;                  ///< (rows, vocab): float, or bf16 logits (softmax, mask)
  int64_t rows, vocab;             ///< shape of `in`
  const int32_t* indices;          ///< (outputs) or null: output o reads row indices[o] (or o)
  const int32_t* prior_status;     ///< (rows) or null
  int64_t top_k;                   ///< scalar top_k
  const int32_t* top_k_per_output; ///< (outputs) or null
  float top_p;                     ///< scalar top_p
  const float* top_p_per_output;   ///< (outputs) or null
  float temperature;               ///< scalar temperature
  const float* temperature_per_output;  ///< (outputs) or null
  float* out;                      ///< (outputs, vocab); may alias `in` when indices is null
  int32_t* status;                 ///< (outputs) or null
};

/// Step 1: the input row of output `o` and its parameters, or why there is none.
template <Transform T>
__device__ Status read_row(const TransformParams& p, int64_t o, int64_t& row, int64_t& top_k, float& top_p,
                           float& temperature) {
  row = p.indices ? p.indices[o] : o;
  if (row < 0 || row >= p.rows) return Status::bad_index;
  if (p.prior_status && p.prior_status[row] != static_cast<int32_t>(Status::ok))
    return static_cast<Status>(p.prior_status[row]);
  top_k = p.top_k_per_output ? p.top_k_per_output[o] : p.top_k;
  top_p = p.top_p_per_output ? p.top_p_per_output[o] : p.top_p;
  temperature = p.temperature_per_output ? p.temperature_per_output[o] : p.temperature;
  if ((T == Transform::top_k_renorm || T == Transform::top_k_mask) && top_k < 1) return Status::bad_top_k;
  if (T == Transform::top_p_renorm && !(top_p > 0.f && top_p <= 1.f)) return Status::bad_top_p;
  if (T == Transform::softmax && !(isfinite(temperature) && temperature > 0.f)) return Status::bad_temperature;
  return Status::ok;
}

/// Pass 0 of a logit row: largest logit, and kFlagNotFinite for NaN or +inf.
template <typename Row>
__device__ RowSummary summarize_logits(const Row& row, SharedState& sh) {
  RowSummary s{0, -INFINITY, 0u};
  for (int64_t i = threadIdx.x; i < row.vocab; i += kBlock) {
    const float x = row.at(i);
    if (isnan(x) || x == INFINITY) s.flags |= kFlagNotFinite;
    else s.max_p = fmaxf(s.max_p, x);
  }
  const RowSummary r = cub::BlockReduce<RowSummary, kBlock>(sh.temp.summary).Reduce(s, [](const RowSummary& a, const RowSummary& b) {
    return RowSummary{0, fmaxf(a.max_p, b.max_p), a.flags | b.flags};
  });
  return broadcast(r, sh.summary);
}

/// The smallest order key K in [lo, hi] with `passes(count, mass above K)`, by bisection;
/// `passes` must hold at hi and be monotone. Entries are kept iff key >= K.
template <typename Row, typename Keep, typename Passes>
__device__ uint32_t bisect_cut(const Row& row, uint32_t lo, uint32_t hi, Keep keep, Passes passes, SharedState& sh) {
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const PivotStats above = count_mass_key_above<8>(row, mid, keep, sh);
    if (passes(above.count_0, above.mass_0)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

__device__ void fill_row(float* out, int64_t vocab, float value) {
  for (int64_t i = threadIdx.x; i < vocab; i += kBlock) out[i] = value;
}

/// softmax(x / temperature): max, sum of exp, divide (in place allowed: each thread
/// writes only the entries it has just read, after the sum's barrier). The very passes
/// of the fused from-logits samplers (row_passes.cuh: softmax_scale, SoftmaxRowT, VEC 16),
/// so at temperature 1 this writes the probabilities they draw from, bit for bit.
template <typename Row>
__device__ Status softmax_row(const Row& row, float temperature, float* out, SharedState& sh) {
  SoftmaxScale scale{};
  uint32_t flags = 0;
  if (!softmax_scale<16>(row, temperature, scale, flags, sh)) return flags ? Status::not_finite : Status::zero_row;
  write_row<16>(SoftmaxRowT<Row>{row, scale, row.vocab}, out);
  return Status::ok;
}

/// top_k_renorm_probs / top_p_renorm_probs of one row.
template <Transform T>
__device__ Status renorm_row(const ProbRow& row, int64_t top_k, float top_p, float* out, SharedState& sh) {
  const RowSummary s = summarize_row<8>(row, sh);
  if (s.flags & kFlagNotFinite) return Status::not_finite;
  if (s.flags & kFlagNegative) return Status::negative;
  if (s.flags & kFlagAboveOne) return Status::above_one;
  if (s.total == 0) return Status::zero_row;
  auto positive = [](float x) { return x > 0.f; };
  const Mass top_p_bound = mass_fraction_ceil(s.total, top_p);  // unused by top-k
  // keep p iff fewer than k entries are larger (top-k), or their mass is below the bound (top-p)
  const uint32_t cut = bisect_cut(
      row, order_key(0.f), order_key(s.max_p), positive,
      [&](int32_t count, Mass mass) {
        if constexpr (T == Transform::top_k_renorm) return count < top_k;
        else return mass < top_p_bound;
      },
      sh);
  auto kept = [cut](float x) { return x > 0.f && order_key(x) >= cut; };
  const double kept_units = mass_units(sum_mass_where<8>(row, kept, sh));
  for (int64_t i = threadIdx.x; i < row.vocab; i += kBlock) {
    const float x = row.p[i];
    out[i] = kept(x) ? static_cast<float>(mass_units(mass_of(x)) / kept_units) : 0.f;
  }
  return Status::ok;
}

/// top_k_mask_logits of one row (in place allowed: every entry is read before it is written).
template <typename Row>
__device__ Status mask_row(const Row& row, int64_t top_k, float* out, SharedState& sh) {
  const RowSummary s = summarize_logits(row, sh);
  if (s.flags & kFlagNotFinite) return Status::not_finite;
  if (s.max_p == -INFINITY) return Status::zero_row;
  const uint32_t cut = bisect_cut(
      row, order_key(-INFINITY), order_key(s.max_p), [](float) { return true; },
      [&](int32_t count, Mass) { return count < top_k; }, sh);
  for (int64_t i = threadIdx.x; i < row.vocab; i += kBlock) {
    const float x = row.at(i);
    out[i] = order_key(x) >= cut ? x : -INFINITY;
  }
  return Status::ok;
}

/// One block per output row: read the row and parameters, transform, or write NaN + status.
/// In: float or Bf16Bits (softmax and mask only); VECTOR_LOADS: softmax's 16-byte loads.
template <Transform T, typename In, bool VECTOR_LOADS>
__global__ void __launch_bounds__(kBlock) transform_kernel(TransformParams p) {
  __shared__ SharedState sh;
  const int64_t o = blockIdx.x;
  int64_t row = 0, top_k = 0;
  float top_p = 0.f, temperature = 0.f;
  Status status = read_row<T>(p, o, row, top_k, top_p, temperature);
  float* out = p.out + o * p.vocab;
  if (status == Status::ok) {
    const In* in = static_cast<const In*>(p.in) + row * p.vocab;
    if constexpr (T == Transform::softmax) status = softmax_row(LogitRowT<In, VECTOR_LOADS>{in, p.vocab}, temperature, out, sh);
    if constexpr (T == Transform::top_k_mask) status = mask_row(LogitRowT<In, false>{in, p.vocab}, top_k, out, sh);
    if constexpr (T == Transform::top_k_renorm || T == Transform::top_p_renorm)
      status = renorm_row<T>(ProbRow{in, p.vocab}, top_k, top_p, out, sh);
  }
  if (status != Status::ok) {
    __syncthreads();  // an in-place row is fully read before NaN overwrites it
    fill_row(out, p.vocab, NAN);
  }
  if (threadIdx.x == 0 && p.status) p.status[o] = static_cast<int32_t>(status);
}

}  // namespace device

namespace detail {

namespace {

template <device::Transform T, typename In, bool VECTOR_LOADS = false>
void launch_transform(const device::TransformParams& p, int64_t outputs, cudaStream_t stream) {
  if (outputs == 0) return;
  device::transform_kernel<T, In, VECTOR_LOADS><<<static_cast<unsigned>(outputs), device::kBlock, 0, stream>>>(p);
  kernels::check_launch("transform_kernel");
}

// 16-byte loads for softmax when every row start is aligned (as the fused samplers decide)
template <typename In>
void launch_softmax_as(const device::TransformParams& p, int64_t outputs, cudaStream_t stream) {
  const bool vec = p.vocab * static_cast<int64_t>(sizeof(In)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.in) % 16 == 0;
  if (vec) {
    launch_transform<device::Transform::softmax, In, true>(p, outputs, stream);
  } else {
    launch_transform<device::Transform::softmax, In, false>(p, outputs, stream);
  }
}

device::TransformParams transform_params(DeviceRows in, float* out, const Gather& g) {
  device::TransformParams p{};
  p.in = in.data;
  p.rows = in.rows;
  p.vocab = in.vocab;
  p.indices = g.indices;
  p.prior_status = g.prior_status;
  p.top_k = 1;
  p.top_p = 1.f;
  p.temperature = 1.f;
  p.out = out;
  p.status = g.status;
  return p;
}

}  // namespace

void launch_softmax(DeviceRows logits, RowParam<double, float> temperature, float* probs_out, Gather gather,
                    cudaStream_t stream) {
  device::TransformParams p = transform_params(logits, probs_out, gather);
  p.temperature = static_cast<float>(temperature.scalar);
  p.temperature_per_output = temperature.per_output;
  if (logits.dtype == ElementType::bf16) {
    launch_softmax_as<device::Bf16Bits>(p, gather.outputs, stream);
  } else {
    launch_softmax_as<float>(p, gather.outputs, stream);
  }
}

void launch_renorm(FilterKind kind, DeviceRows probs, TopK top_k, Fraction top_p, float* probs_out, Gather gather,
                   cudaStream_t stream) {
  device::TransformParams p = transform_params(probs, probs_out, gather);
  p.top_k = top_k.scalar;
  p.top_k_per_output = top_k.per_output;
  p.top_p = static_cast<float>(top_p.scalar);
  p.top_p_per_output = top_p.per_output;
  if (kind == FilterKind::top_k) {
    launch_transform<device::Transform::top_k_renorm, float>(p, gather.outputs, stream);
  } else {
    launch_transform<device::Transform::top_p_renorm, float>(p, gather.outputs, stream);
  }
}

void launch_mask_logits(DeviceRows logits, TopK top_k, float* logits_out, Gather gather, cudaStream_t stream) {
  device::TransformParams p = transform_params(logits, logits_out, gather);
  p.top_k = top_k.scalar;
  p.top_k_per_output = top_k.per_output;
  if (logits.dtype == ElementType::bf16) {
    launch_transform<device::Transform::top_k_mask, device::Bf16Bits>(p, gather.outputs, stream);
  } else {
    launch_transform<device::Transform::top_k_mask, float>(p, gather.outputs, stream);
  }
}

}  // namespace detail

namespace {
void check_out(const char* fn, const char* name, const void* out, int64_t rows) {
  if (rows > 0 && out == nullptr) throw ref::InvalidArgument(std::string(fn) + ": " + name + " is null");
}
}  // namespace

void softmax(DeviceRows logits, RowParam<double, float> temperature, float* probs_out, int32_t* status,
             cudaStream_t stream) {
  const char* fn = "softmax";
  detail::check_rows(fn, "logits", logits, true);
  check_out(fn, "probs_out", probs_out, logits.rows);
  const double t = temperature.scalar;
  if (!temperature.per_output && !(std::isfinite(t) && t > 0.0 && std::isfinite(static_cast<float>(1.0 / t))))
    throw ref::InvalidArgument(std::string(fn) + ": temperature must be finite and > 0, but temperature = " +
                               std::to_string(t) + " (temperature 0 means greedy decoding: take the argmax)");
  detail::launch_softmax(logits, temperature, probs_out, detail::Gather{nullptr, logits.rows, nullptr, status}, stream);
}

void top_k_renorm_probs(DeviceRows probs, TopK top_k, float* probs_out, int32_t* status, cudaStream_t stream) {
  const char* fn = "top_k_renorm_probs";
  detail::check_rows(fn, "probs", probs);
  detail::check_top_k(fn, top_k);
  check_out(fn, "probs_out", probs_out, probs.rows);
  detail::launch_renorm(FilterKind::top_k, probs, top_k, Fraction(1.0), probs_out,
                        detail::Gather{nullptr, probs.rows, nullptr, status}, stream);
}

void top_p_renorm_probs(DeviceRows probs, Fraction top_p, float* probs_out, int32_t* status, cudaStream_t stream) {
  const char* fn = "top_p_renorm_probs";
  detail::check_rows(fn, "probs", probs);
  detail::check_top_p(fn, top_p);
  check_out(fn, "probs_out", probs_out, probs.rows);
  detail::launch_renorm(FilterKind::top_p, probs, TopK(1), top_p, probs_out,
                        detail::Gather{nullptr, probs.rows, nullptr, status}, stream);
}

void top_k_mask_logits(DeviceRows logits, TopK top_k, float* logits_out, int32_t* status, cudaStream_t stream) {
  const char* fn = "top_k_mask_logits";
  detail::check_rows(fn, "logits", logits, true);
  detail::check_top_k(fn, top_k);
  check_out(fn, "logits_out", logits_out, logits.rows);
  detail::launch_mask_logits(logits, top_k, logits_out, detail::Gather{nullptr, logits.rows, nullptr, status}, stream);
}

}  // namespace flashstep::stages::sampling
