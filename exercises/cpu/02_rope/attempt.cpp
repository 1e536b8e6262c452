// Exercise 2 (chapter 1, "Positions as rotations: RoPE"): rotate queries or keys by their
// positions.
//
// Fill in rope() below: split each head's head_dim numbers into head_dim / 2 pairs, and
// turn pair i of a row at position p by the angle p * theta_i, with
// theta_i = rope_theta^(-2 i / head_dim). Which numbers form a pair is the layout:
// rotate-half pairs x[i] with x[i + head_dim / 2], interleaved pairs x[2i] with x[2i + 1].
// The grader compares your result with the reference's apply_rope_pos_ids.
//
//     cmake --build build --target flashstep_exercise_cpu_02_rope
//     flashstep exercise check 2          (or run build/bin/flashstep_exercise_cpu_02_rope)
//
// Stuck? `flashstep exercise hint 2`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Tensor;

/// RoPE over every head of every row.
/// \param x (nnz, num_heads, head_dim), head_dim even
/// \param positions (nnz) position of each row
/// \param rope_theta base of the frequencies (1e4 in the original, 5e5 in Llama 3)
/// \param interleave false: pairs (x[i], x[i + head_dim/2]); true: pairs (x[2i], x[2i+1])
/// \return (nnz, num_heads, head_dim): pair (a, b) becomes (a cos - b sin, b cos + a sin)
Tensor rope(const Tensor& x, const std::vector<int32_t>& positions, double rope_theta, bool interleave) {
  Tensor out;
  // TODO(exercise): rotate every pair of every head of every row.
  return out;
}
