/// \file step_arrays.hpp
/// \brief One step's int32 arrays as the GPU engine uploads them: a single buffer (one
/// host-to-device copy per step) holding every array the step's kernels and the two
/// attention calls read, at offsets recorded beside it.
///
/// The decode rows (0 .. num_decodes-1) read the step's arrays directly: their qo_indptr,
/// kv_indptr and kv_last_page_len are prefixes of the step's. The prefill rows get their
/// own qo_indptr and kv_indptr, rebased to start at 0 (FlashInfer's prefill wrapper sees
/// only its rows); their page ids and last_page_len are the step's, from their first row.
///
/// **Padding for a CUDA graph.** A decode-only step may be padded to `padded_rows` rows:
/// a padding row has one token (id 0, position 0, batch index its own row), no pages
/// (kv_indptr stays at the step's page count, last_page_len 0), and samples row 0's token
/// (its logits are never read). An append skips such a row (it has no page) and attention
/// gives it no keys. kv_indices comes last, so every other offset depends only on
/// (padded) rows, tokens and samples: a graph captured for one padded step reads the next
/// one's arrays at the same addresses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "09_engine/scheduler.hpp"

namespace flashstep::stages::engine {

/// The packed arrays of one step and where each starts in `data`.
struct StepArrays {
  std::vector<int32_t> data;     ///< every array below, back to back
  int64_t nnz = 0;               ///< tokens laid out (padded)
  int64_t rows = 0;              ///< rows laid out (padded)
  int64_t samples = 0;           ///< sampling rows laid out (padded)
  int64_t num_decodes = 0;       ///< the step's decode rows (not padded)
  int64_t num_prefills = 0;      ///< the step's prefill rows
  size_t tokens = 0;             ///< (nnz) token ids
  size_t positions = 0;          ///< (nnz) positions in the sequence
  size_t batch_indices = 0;      ///< (nnz) row of each token
  size_t qo_indptr = 0;          ///< (rows + 1)
  size_t kv_indptr = 0;          ///< (rows + 1) pages
  size_t kv_last_page_len = 0;   ///< (rows)
  size_t sample_token_rows = 0;  ///< (samples) token whose logits each sampling row reads
  size_t prefill_qo_indptr = 0;  ///< (num_prefills + 1) rebased to 0
  size_t prefill_kv_indptr = 0;  ///< (num_prefills + 1) rebased to 0
  size_t kv_indices = 0;         ///< (the step's pages) last

  /// The array at `offset`, `n` entries, as a vector (for a BatchShape).
  std::vector<int32_t> slice(size_t offset, int64_t n) const {
    return std::vector<int32_t>(data.begin() + static_cast<std::ptrdiff_t>(offset),
                                data.begin() + static_cast<std::ptrdiff_t>(offset) + n);
  }
};

/// Packs `batch`. \param padded_rows 0: as it is; else a decode-only step padded to this
/// many rows (>= the batch's rows). Throws ref::InvalidArgument naming `padded_rows` when
/// the step has prefill rows or more rows than that.
StepArrays pack_step(const StepBatch& batch, int64_t padded_rows = 0);

}  // namespace flashstep::stages::engine
