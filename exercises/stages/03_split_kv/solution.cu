// Stage 03's exercise, solved: the two holes of stages/03_split_kv/exercise.cu. Each
// definition below replaces the one with the same first line there (fill_in.py).

__device__ void chunk_range(int kv_len, int tile, int chunk_tokens, int& start, int& end) {
  start = min(kv_len, tile * chunk_tokens);
  end = min(kv_len, start + chunk_tokens);
}

__device__ void merge_into(float (&o)[kPerLane], float& lse, const float (&o_k)[kPerLane], float lse_k) {
  const float m = fmaxf(lse, lse_k);
  if (m == -INFINITY) return;  // both empty: the empty state stays
  const float w = expf(lse - m), w_k = expf(lse_k - m);
  for (int e = 0; e < kPerLane; ++e) o[e] = (w * o[e] + w_k * o_k[e]) / (w + w_k);
  lse = m + logf(w + w_k);
}
