// Exercise 5's types: the contiguous KV cache you grow, and the step you write.
#pragma once

#include <flashstep/reference.hpp>

/// One layer's KV cache for one request: K and V of every token so far, in NHD layout.
struct KVCache {
  flashstep::ref::Tensor k;  ///< (kv_len, num_kv_heads, head_dim); kv_len 0 at the start
  flashstep::ref::Tensor v;  ///< (kv_len, num_kv_heads, head_dim)
};

/// One step with the cache: append the new tokens' K and V rows, then attend the query
/// of the last new token to every key in the cache (it is the last token, so it sees
/// them all: no mask).
/// \param cache grown in place by n rows
/// \param q (num_qo_heads, head_dim) query of the last new token; query head h reads kv
///        head h / (num_qo_heads / num_kv_heads)
/// \param k_new (n, num_kv_heads, head_dim), n >= 1 (a prompt at the first step, then 1)
/// \param v_new (n, num_kv_heads, head_dim)
/// \param sm_scale multiplies every q . k
/// \return o (num_qo_heads, head_dim) and lse (num_qo_heads), natural log
flashstep::ref::AttentionResult decode_step(KVCache& cache, const flashstep::ref::Tensor& q,
                                            const flashstep::ref::Tensor& k_new, const flashstep::ref::Tensor& v_new,
                                            double sm_scale);
