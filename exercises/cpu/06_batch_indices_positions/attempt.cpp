// Exercise 6 (chapter 4, "Batching many requests"): read a ragged batch through its indptr.
//
// A step appends new tokens to several requests at once, packed back to back:
// append_indptr[i] .. append_indptr[i+1] are request i's new tokens. Fill in
// batch_indices_positions() below: for every packed token, which request it belongs to
// and its position in that request's sequence. The grader compares your arrays with the
// reference's get_batch_indices_positions (FlashInfer's function of the same name).
//
//     cmake --build build --target flashstep_exercise_cpu_06_batch_indices_positions
//     flashstep exercise check 6          (or run build/bin/flashstep_exercise_cpu_06_batch_indices_positions)
//
// Stuck? `flashstep exercise hint 6`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <utility>
#include <vector>

/// Request and position of every appended token.
/// \param append_indptr (batch_size + 1), starts at 0, never decreases: request i's new
///        tokens are rows append_indptr[i] .. append_indptr[i+1] of the packed batch
/// \param seq_lens (batch_size) each request's length *after* the append
/// \return (batch_indices, positions), each with append_indptr[batch_size] entries: the
///         t-th new token of request i (t = 0, 1, ...) belongs to request i and sits at
///         position seq_lens[i] - append_len_i + t
std::pair<std::vector<int32_t>, std::vector<int32_t>> batch_indices_positions(const std::vector<int32_t>& append_indptr,
                                                                              const std::vector<int32_t>& seq_lens) {
  std::vector<int32_t> batch_indices, positions;
  // TODO(exercise): one entry per packed token, in packed order.
  return {batch_indices, positions};
}
