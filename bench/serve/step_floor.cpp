// The engine's step floor (step_floor.hpp): bytes a decode step reads, and its floor.
#include "step_floor.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "flashstep/reference/errors.hpp"

namespace flashstep::bench {

int64_t kv_slot_bytes(const ref::TinyDecoderConfig& model, int64_t elem_bytes) {
  const int64_t head_dim = model.d_model / model.num_qo_heads;
  return 2 * model.num_kv_heads * head_dim * model.num_layers * elem_bytes;
}

int64_t step_weight_bytes(const ref::TinyDecoderConfig& model, int64_t elem_bytes, int64_t tokens) {
  const int64_t d = model.d_model, head_dim = d / model.num_qo_heads;
  const int64_t qw = model.num_qo_heads * head_dim, kw = model.num_kv_heads * head_dim;
  const int64_t per_layer = d * qw + 2 * d * kw + (model.output_projection ? qw * d : 0);
  return (model.num_layers * per_layer + d * model.vocab_size + tokens * d) * elem_bytes;
}

KvSlots decode_kv_slots(const stages::engine::StepBatch& batch, int64_t page_size) {
  KvSlots s;
  std::map<int32_t, int64_t> used;  // page id -> slots in use, the most any row sees
  for (int32_t row = 0; row < batch.num_decodes; ++row) {
    s.flat += batch.kv_lens[static_cast<size_t>(row)];
    const int32_t first = batch.kv_indptr[static_cast<size_t>(row)];
    const int32_t last = batch.kv_indptr[static_cast<size_t>(row) + 1] - 1;
    for (int32_t p = first; p <= last; ++p) {
      const int64_t slots = p == last ? batch.kv_last_page_len[static_cast<size_t>(row)] : page_size;
      int64_t& u = used[batch.kv_indices[static_cast<size_t>(p)]];
      u = std::max(u, slots);
    }
  }
  for (const auto& [page, slots] : used) s.unique += slots;
  return s;
}

double floor_us(int64_t bytes, double read_gbps, double launch_floor_us) {
  ref::require(std::isfinite(read_gbps) && read_gbps > 0, "floor_us",
               "read_gbps must be finite and > 0, got " + std::to_string(read_gbps));
  ref::require(std::isfinite(launch_floor_us) && launch_floor_us >= 0, "floor_us",
               "launch_floor_us must be finite and >= 0, got " + std::to_string(launch_floor_us));
  // GB/s = 1e9 bytes per second = 1e3 bytes per microsecond
  return static_cast<double>(bytes) / (read_gbps * 1e3) + launch_floor_us;
}

}  // namespace flashstep::bench
