// Exercise 5 (chapter 3, "The KV cache: prefill once, then decode"): keep K and V, grow
// them by the new tokens' rows, and attend only the newest query.
//
// Fill in decode_step() below (its contract is in kv_cache.hpp). The first step brings a
// whole prompt's K/V rows, every later step one token's. The grader runs random
// generations step by step and compares your cache with the reference's
// ContiguousKVCache and your output with single_decode_with_kv_cache over it.
//
//     cmake --build build --target flashstep_exercise_cpu_05_decode_with_kv_cache
//     flashstep exercise check 5          (or run build/bin/flashstep_exercise_cpu_05_decode_with_kv_cache)
//
// Stuck? `flashstep exercise hint 5`. The solution is solution.cpp beside this file.
#include "kv_cache.hpp"

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

AttentionResult decode_step(KVCache& cache, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                            double sm_scale) {
  AttentionResult result;
  // TODO(exercise): append k_new and v_new to the cache, then attend q to all of it.
  return result;
}
