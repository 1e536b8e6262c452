// Stage 08's exercise, solved: the two holes of stages/08_context_parallel/exercise.cu.
// Each definition below replaces the one with the same first line there (fill_in.py).

int32_t slice_last_page_len(int32_t begin, int32_t end, int32_t pages, int32_t last_page_len, int32_t page_size) {
  if (end == begin) return 0;
  return end == pages ? last_page_len : page_size;
}

__global__ void merge_kernel(MergeParams p) {
  const int h = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
  float acc[kPerLane] = {}, m = -INFINITY, d = 0.f;
  for (int j = 0; j < kRanks; ++j) {
    const int64_t state = (int64_t{j} * p.batch_size + r) * p.num_qo_heads + h;
    const float lse_j = p.states_lse[state];
    if (lse_j == -INFINITY) continue;  // no keys on rank j
    const float m_new = fmaxf(m, lse_j);
    const float scale = m == -INFINITY ? 0.f : expf(m - m_new), w = expf(lse_j - m_new);
    d = d * scale + w;
    for (int e = 0; e < kPerLane; ++e) acc[e] = acc[e] * scale + w * p.states_o[state * kHeadDim + lane * kPerLane + e];
    m = m_new;
  }
  const int64_t row = int64_t{r} * p.num_qo_heads + h;
  for (int e = 0; e < kPerLane; ++e)
    p.o[row * kHeadDim + lane * kPerLane + e] = __float2bfloat16_rn(d > 0.f ? acc[e] / d : 0.f);
  if (lane == 0) p.lse[row] = d > 0.f ? m + logf(d) : -INFINITY;
}
