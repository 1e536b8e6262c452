#include "09_engine/step_arrays.hpp"

#include <string>

#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::engine {

StepArrays pack_step(const StepBatch& b, int64_t padded_rows) {
  const int64_t rows = b.batch_size(), nnz = b.nnz(), nd = b.num_decodes, np = rows - nd;
  const int64_t samples = static_cast<int64_t>(b.sample_rows.size());
  const bool pad = padded_rows > 0;
  ref::require(padded_rows >= 0, "pack_step", "padded_rows must be >= 0 (got " + std::to_string(padded_rows) + ")");
  if (pad)
    ref::require(np == 0 && padded_rows >= rows, "pack_step",
                 "padded_rows " + std::to_string(padded_rows) +
                     " needs a decode-only step of at most that many rows (" + std::to_string(nd) + " decodes, " +
                     std::to_string(np) + " prefills)");
  StepArrays a;
  a.nnz = pad ? padded_rows : nnz;
  a.rows = pad ? padded_rows : rows;
  a.samples = pad ? padded_rows : samples;
  a.num_decodes = nd;
  a.num_prefills = np;
  const int32_t pages = rows > 0 ? b.kv_indptr[static_cast<size_t>(rows)] : 0;
  std::vector<int32_t>& d = a.data;
  // `n` values of `p`, then `fill(i)` for i = n .. padded_n - 1
  auto put = [&](const int32_t* p, int64_t n, int64_t padded_n, auto fill) {
    const size_t at = d.size();
    d.insert(d.end(), p, p + n);
    for (int64_t i = n; i < padded_n; ++i) d.push_back(fill(i));
    return at;
  };
  auto zero = [](int64_t) { return int32_t{0}; };
  auto self = [](int64_t i) { return static_cast<int32_t>(i); };
  a.tokens = put(b.tokens.data(), nnz, a.nnz, zero);
  a.positions = put(b.positions.data(), nnz, a.nnz, zero);
  a.batch_indices = put(b.batch_indices.data(), nnz, a.nnz, self);
  a.qo_indptr = put(b.qo_indptr.data(), rows + 1, a.rows + 1, self);  // decode rows: qo_indptr[i] = i
  a.kv_indptr = put(b.kv_indptr.data(), rows + 1, a.rows + 1, [&](int64_t) { return pages; });
  a.kv_last_page_len = put(b.kv_last_page_len.data(), rows, a.rows, zero);
  a.sample_token_rows = put(b.sample_token_rows.data(), samples, a.samples, zero);
  std::vector<int32_t> pqo(static_cast<size_t>(np + 1)), pkv(static_cast<size_t>(np + 1));
  for (int64_t i = 0; i <= np; ++i) {
    pqo[static_cast<size_t>(i)] = b.qo_indptr[static_cast<size_t>(nd + i)] - b.qo_indptr[static_cast<size_t>(nd)];
    pkv[static_cast<size_t>(i)] = b.kv_indptr[static_cast<size_t>(nd + i)] - b.kv_indptr[static_cast<size_t>(nd)];
  }
  a.prefill_qo_indptr = put(pqo.data(), np + 1, np + 1, zero);
  a.prefill_kv_indptr = put(pkv.data(), np + 1, np + 1, zero);
  a.kv_indices = put(b.kv_indices.data(), pages, pages, zero);
  return a;
}

}  // namespace flashstep::stages::engine
