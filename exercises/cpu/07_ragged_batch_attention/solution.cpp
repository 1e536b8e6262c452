// Exercise 7's solution: one single-request call per slice of the packed tensors.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::AttentionOptions;
using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

namespace {

// Rows [begin, end) of a row-major tensor: one contiguous run of its data.
Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t row = t.dim(1) * t.dim(2);
  Tensor out({end - begin, t.dim(1), t.dim(2)});
  std::copy(t.data.begin() + begin * row, t.data.begin() + end * row, out.data.begin());
  return out;
}

}  // namespace

AttentionResult batch_attention(const Tensor& q, const std::vector<int32_t>& qo_indptr, const Tensor& k,
                                const Tensor& v, const std::vector<int32_t>& kv_indptr, const AttentionOptions& opt) {
  AttentionResult result{Tensor(q.shape), Tensor({q.dim(0), q.dim(1)})};
  for (size_t i = 0; i + 1 < qo_indptr.size(); ++i) {
    const int64_t q0 = qo_indptr[i], q1 = qo_indptr[i + 1];
    if (q1 == q0) continue;  // a request with no queries has no output rows
    const AttentionResult r = flashstep::ref::single_prefill_with_kv_cache(
        rows(q, q0, q1), rows(k, kv_indptr[i], kv_indptr[i + 1]), rows(v, kv_indptr[i], kv_indptr[i + 1]), opt);
    // the request's output rows are rows q0 .. q1 of the packed output, in the same order
    std::copy(r.o.data.begin(), r.o.data.end(), result.o.data.begin() + q0 * q.dim(1) * q.dim(2));
    std::copy(r.lse.data.begin(), r.lse.data.end(), result.lse.data.begin() + q0 * q.dim(1));
  }
  return result;
}
