// Exercise 6's solution: walk the requests; request i owns rows indptr[i] .. indptr[i+1].
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

std::pair<std::vector<int32_t>, std::vector<int32_t>> batch_indices_positions(const std::vector<int32_t>& append_indptr,
                                                                              const std::vector<int32_t>& seq_lens) {
  std::vector<int32_t> batch_indices, positions;
  for (size_t i = 0; i + 1 < append_indptr.size(); ++i) {
    const int32_t append_len = append_indptr[i + 1] - append_indptr[i];
    // the new tokens are the last append_len of the request's seq_lens[i]
    for (int32_t t = 0; t < append_len; ++t) {
      batch_indices.push_back(static_cast<int32_t>(i));
      positions.push_back(seq_lens[i] - append_len + t);
    }
  }
  return {batch_indices, positions};
}
