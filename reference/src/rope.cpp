// Rotary position encoding. Every entry point validates, turns its arguments into a
// position per row and a frequency per pair, then calls apply_rotary_embedding(), the one
// loop that rotates pairs. Written from the formulas in rope.hpp.
#include "flashstep/reference/rope.hpp"

#include "flashstep/reference/rope_fp32.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

namespace {

void check_positive_finite(const char* fn, const char* name, double value) {
  require(std::isfinite(value) && value > 0, fn,
          std::string(name) + " must be positive and finite (got " + std::to_string(value) + ")");
}

void check_rotary_dim(const char* fn, int64_t rotary_dim) {
  require(rotary_dim >= 2 && rotary_dim % 2 == 0, fn,
          "rotary_dim must be even and >= 2 (it is split into pairs), got " + std::to_string(rotary_dim));
}

/// q and k of one call: rank 3, finite, one nnz and one head_dim; returns rotary_dim
/// (the option, or head_dim when not given), checked against head_dim.
int64_t check_qk(const char* fn, const Tensor& q, const Tensor& k, const std::optional<int64_t>& rotary_dim) {
  check_rank(fn, "q", q, 3);
  check_rank(fn, "k", k, 3);
  check_dim(fn, "k", k, 0, q.dim(0), "nnz, must match q");
  check_dim(fn, "k", k, 2, q.dim(2), "head_dim, must match q");
  check_head_dim(fn, q.dim(2));
  check_finite(fn, "q", q);
  check_finite(fn, "k", k);
  const int64_t r = rotary_dim.value_or(q.dim(2));
  check_rotary_dim(fn, r);
  require(r <= q.dim(2), fn,
          "rotary_dim (" + std::to_string(r) + ") must not exceed head_dim (" + std::to_string(q.dim(2)) + ")");
  return r;
}

std::vector<int64_t> checked_pos_ids(const char* fn, const std::vector<int32_t>& pos_ids, int64_t nnz) {
  require(static_cast<int64_t>(pos_ids.size()) == nnz, fn,
          "pos_ids must have one position per row, length nnz = " + std::to_string(nnz) + ", got " +
              std::to_string(pos_ids.size()));
  for (size_t t = 0; t < pos_ids.size(); ++t)
    require_lazy(pos_ids[t] >= 0, fn, [&] {
      return "pos_ids[" + std::to_string(t) + "] = " + std::to_string(pos_ids[t]) + " must be >= 0";
    });
  return {pos_ids.begin(), pos_ids.end()};
}

std::vector<int64_t> checked_positions(const char* fn, const std::vector<int32_t>& indptr,
                                       const std::vector<int32_t>& offsets, int64_t nnz) {
  check_indptr(fn, "indptr", indptr, -1, nnz);
  require(offsets.size() + 1 == indptr.size(), fn,
          "offsets must have length batch_size = " + std::to_string(indptr.size() - 1) + ", got " +
              std::to_string(offsets.size()));
  for (size_t b = 0; b < offsets.size(); ++b)
    require_lazy(offsets[b] >= 0, fn, [&] {
      return "offsets[" + std::to_string(b) + "] = " + std::to_string(offsets[b]) + " must be >= 0";
    });
  std::vector<int64_t> positions(static_cast<size_t>(indptr.back()));
  for (size_t b = 0; b + 1 < indptr.size(); ++b)
    for (int32_t t = indptr[b]; t < indptr[b + 1]; ++t)
      positions[static_cast<size_t>(t)] = static_cast<int64_t>(offsets[b]) + (t - indptr[b]);
  return positions;
}

RopeResult rotate_qk(const Tensor& q, const Tensor& k, const std::vector<int64_t>& positions,
                     const std::vector<double>& frequencies, bool interleave) {
  return {apply_rotary_embedding(q, positions, frequencies, interleave),
          apply_rotary_embedding(k, positions, frequencies, interleave)};
}

std::vector<double> plain_frequencies(const char* fn, int64_t rotary_dim, double rope_scale, double rope_theta) {
  check_rotary_dim(fn, rotary_dim);
  check_positive_finite(fn, "rope_scale", rope_scale);
  check_positive_finite(fn, "rope_theta", rope_theta);
  std::vector<double> theta(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < theta.size(); ++i)
    theta[i] = std::pow(rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim)) / rope_scale;
  return theta;
}

std::vector<double> llama31_frequencies(const char* fn, int64_t rotary_dim, const Llama31RopeOptions& opt) {
  check_positive_finite(fn, "rope_scale", opt.rope_scale);
  check_positive_finite(fn, "low_freq_factor", opt.low_freq_factor);
  check_positive_finite(fn, "high_freq_factor", opt.high_freq_factor);
  check_positive_finite(fn, "old_context_len", opt.old_context_len);
  require(opt.high_freq_factor > opt.low_freq_factor, fn,
          "high_freq_factor (" + std::to_string(opt.high_freq_factor) + ") must exceed low_freq_factor (" +
              std::to_string(opt.low_freq_factor) + ")");
  std::vector<double> theta = plain_frequencies(fn, rotary_dim, 1.0, opt.rope_theta);
  const double pi = std::acos(-1.0);
  for (double& f : theta) {
    // smooth = 1 keeps a short wavelength, 0 divides a long one by rope_scale.
    const double wavelength = 2.0 * pi / f;
    const double smooth = std::clamp((opt.old_context_len / wavelength - opt.low_freq_factor) /
                                         (opt.high_freq_factor - opt.low_freq_factor),
                                     0.0, 1.0);
    f = (1.0 - smooth) * f / opt.rope_scale + smooth * f;
  }
  return theta;
}

}  // namespace

std::vector<double> rope_frequencies(int64_t rotary_dim, double rope_scale, double rope_theta) {
  return plain_frequencies("rope_frequencies", rotary_dim, rope_scale, rope_theta);
}

std::vector<double> llama31_rope_frequencies(int64_t rotary_dim, const Llama31RopeOptions& opt) {
  return llama31_frequencies("llama31_rope_frequencies", rotary_dim, opt);
}

Tensor apply_rotary_embedding(const Tensor& x, const std::vector<int64_t>& positions,
                              const std::vector<double>& frequencies, bool interleave) {
  const char* fn = "apply_rotary_embedding";
  check_rank(fn, "x", x, 3);
  check_finite(fn, "x", x);
  const int64_t nnz = x.dim(0), num_heads = x.dim(1), head_dim = x.dim(2);
  const int64_t half = static_cast<int64_t>(frequencies.size()), rotary_dim = 2 * half;
  require(static_cast<int64_t>(positions.size()) == nnz, fn,
          "positions must have length nnz = " + std::to_string(nnz) + ", got " + std::to_string(positions.size()));
  require(half >= 1 && rotary_dim <= head_dim, fn,
          "frequencies must hold 1 .. head_dim / 2 = " + std::to_string(head_dim / 2) + " values, got " +
              std::to_string(half));
  for (size_t i = 0; i < frequencies.size(); ++i)
    require_lazy(std::isfinite(frequencies[i]), fn, [&] {
      return "frequencies[" + std::to_string(i) + "] must be finite, got " + std::to_string(frequencies[i]);
    });

  Tensor out = x;  // elements past rotary_dim stay as they are
  for (int64_t t = 0; t < nnz; ++t)
    for (int64_t i = 0; i < half; ++i) {
      // Pair i turns by p * theta_i.
      const double angle = static_cast<double>(positions[static_cast<size_t>(t)]) * frequencies[static_cast<size_t>(i)];
      const double c = std::cos(angle), s = std::sin(angle);
      const int64_t first = interleave ? 2 * i : i;
      const int64_t second = interleave ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < num_heads; ++h) {
        const double a = x({t, h, first}), b = x({t, h, second});
        out({t, h, first}) = a * c - b * s;
        out({t, h, second}) = b * c + a * s;
      }
    }
  return out;
}

std::vector<int64_t> rope_positions(const std::vector<int32_t>& indptr, const std::vector<int32_t>& offsets) {
  const char* fn = "rope_positions";
  check_indptr(fn, "indptr", indptr, -1, -1);
  return checked_positions(fn, indptr, offsets, indptr.back());
}

RopeResult apply_rope(const Tensor& q, const Tensor& k, const std::vector<int32_t>& indptr,
                      const std::vector<int32_t>& offsets, const RopeOptions& opt) {
  const char* fn = "apply_rope";
  const int64_t rotary_dim = check_qk(fn, q, k, opt.rotary_dim);
  const auto positions = checked_positions(fn, indptr, offsets, q.dim(0));
  return rotate_qk(q, k, positions, plain_frequencies(fn, rotary_dim, opt.rope_scale, opt.rope_theta), opt.interleave);
}

RopeResult apply_rope_pos_ids(const Tensor& q, const Tensor& k, const std::vector<int32_t>& pos_ids,
                              const RopeOptions& opt) {
  const char* fn = "apply_rope_pos_ids";
  const int64_t rotary_dim = check_qk(fn, q, k, opt.rotary_dim);
  const auto positions = checked_pos_ids(fn, pos_ids, q.dim(0));
  return rotate_qk(q, k, positions, plain_frequencies(fn, rotary_dim, opt.rope_scale, opt.rope_theta), opt.interleave);
}

RopeResult apply_llama31_rope(const Tensor& q, const Tensor& k, const std::vector<int32_t>& indptr,
                              const std::vector<int32_t>& offsets, const Llama31RopeOptions& opt) {
  const char* fn = "apply_llama31_rope";
  const int64_t rotary_dim = check_qk(fn, q, k, opt.rotary_dim);
  const auto positions = checked_positions(fn, indptr, offsets, q.dim(0));
  return rotate_qk(q, k, positions, llama31_frequencies(fn, rotary_dim, opt), opt.interleave);
}

RopeResult apply_llama31_rope_pos_ids(const Tensor& q, const Tensor& k, const std::vector<int32_t>& pos_ids,
                                      const Llama31RopeOptions& opt) {
  const char* fn = "apply_llama31_rope_pos_ids";
  const int64_t rotary_dim = check_qk(fn, q, k, opt.rotary_dim);
  const auto positions = checked_pos_ids(fn, pos_ids, q.dim(0));
  return rotate_qk(q, k, positions, llama31_frequencies(fn, rotary_dim, opt), opt.interleave);
}

std::vector<double> rope_llama_turns(int64_t head_dim, double rope_scale, double rope_theta) {
  std::vector<double> turns = plain_frequencies("rope_llama_turns", head_dim, rope_scale, rope_theta);
  const double two_pi = 2.0 * std::acos(-1.0);
  for (double& f : turns) f /= two_pi;
  return turns;
}

Tensor rope_llama_fp32(const Tensor& x, const std::vector<int64_t>& positions, const std::vector<double>& turns) {
  const char* fn = "rope_llama_fp32";
  check_rank(fn, "x", x, 3);
  const int64_t nnz = x.dim(0), num_heads = x.dim(1), head_dim = x.dim(2), half = head_dim / 2;
  require(static_cast<int64_t>(positions.size()) == nnz, fn,
          "positions must have length nnz = " + std::to_string(nnz) + ", got " + std::to_string(positions.size()));
  require(head_dim % 2 == 0 && static_cast<int64_t>(turns.size()) == half, fn,
          "turns must hold head_dim / 2 = " + std::to_string(half) + " values (head_dim even), got " +
              std::to_string(turns.size()));
  for (size_t t = 0; t < positions.size(); ++t)
    require_lazy(std::abs(positions[t]) <= (int64_t{1} << 24), fn, [&] {
      return "positions[" + std::to_string(t) + "] = " + std::to_string(positions[t]) + " must be in -2^24 .. 2^24";
    });
  for (double v : x.data)
    require(std::isfinite(v) && static_cast<double>(static_cast<float>(v)) == v, fn,
            "x must hold fp32 values (got " + std::to_string(v) + ")");
  Tensor out = x;
  for (int64_t t = 0; t < nnz; ++t)
    for (int64_t i = 0; i < half; ++i) {
      float c, s;
      rope_cos_sin_fp32(static_cast<int>(positions[static_cast<size_t>(t)]), turns[static_cast<size_t>(i)], c, s);
      for (int64_t h = 0; h < num_heads; ++h) {
        float a = static_cast<float>(x({t, h, i})), b = static_cast<float>(x({t, h, i + half}));
        rope_rotate_fp32(a, b, c, s);
        out({t, h, i}) = a;
        out({t, h, i + half}) = b;
      }
    }
  return out;
}

}  // namespace flashstep::ref
