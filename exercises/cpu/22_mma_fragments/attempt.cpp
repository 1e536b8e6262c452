// Exercise 22 (stage 03's tensor-core decode, stages/03_split_kv/README.md, "The kernels"):
// the fragment one warp turns S^T's accumulators into, to multiply by V^T.
//
// mma_decode.cuh computes, for 16 keys and a group of 8 query heads,
//     S^T (16 keys x 8 heads) = K Q^T        then, with P = exp2(S - max),
//     O^T (D x 8 heads)      += V^T P^T      where P^T (16 keys x 8 heads) is the B operand.
// The first product leaves S^T in the accumulator (C) fragment of mma.sync m16n8k16: lane
// l = 4g + t (g = l / 4, t = l % 4) holds four values,
//     c[0] = (key g, head 2t)    c[1] = (key g, head 2t+1)
//     c[2] = (key g+8, head 2t)  c[3] = (key g+8, head 2t+1)
// The second product wants P^T as its B fragment (k = keys, n = heads): lane l holds
//     b[0] = (key 2t, head g)    b[1] = (key 2t+1, head g)
//     b[2] = (key 2t+8, head g)  b[3] = (key 2t+9, head g)
// Fill in b_from_c() below: every lane's four B values, gathered from the lanes' C values.
// (On the GPU one movmatrix per 8 keys does it; here, a gather across the 32 lanes.)
//
//     cmake --build build --target flashstep_exercise_cpu_22_mma_fragments
//     flashstep exercise check 22         (or run build/bin/flashstep_exercise_cpu_22_mma_fragments)
//
// Stuck? `flashstep exercise hint 22`. The solution is solution.cpp beside this file.
#include <array>

using Fragments = std::array<std::array<float, 4>, 32>;  // [lane][register]

/// \param c each lane's C fragment of a 16 x 8 tile (keys x heads), as above
/// \return each lane's B fragment of the same tile as a k16 x n8 operand, as above
Fragments b_from_c(const Fragments& c) {
  Fragments b{};
  // TODO(exercise): fill b[lane][0..3] from c.
  return b;
}
