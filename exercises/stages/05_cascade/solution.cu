// Stage 05's exercise, solved: the two holes of stages/05_cascade/exercise.cu. Each
// definition below replaces the one with the same first line there (fill_in.py).

__device__ void group_pages(const Level& level, int r, int& first, int& count, int& last_len) {
  int g = 0;
  while (g + 1 < level.num_groups && level.request_indptr[g + 1] <= r) ++g;
  first = level.kv_indptr[g];
  count = level.kv_indptr[g + 1] - first;
  last_len = level.last_page_len[g];
}

__device__ void merge_into(float* o1, float& lse1, const float* o2, float lse2, int lane) {
  const float m = fmaxf(lse1, lse2);
  if (m == -INFINITY) return;  // both levels empty
  const float w1 = expf(lse1 - m), w2 = expf(lse2 - m);
  for (int i = 0; i < 2; ++i) o1[i] = (w1 * o1[i] + w2 * o2[i]) / (w1 + w2);
  lse1 = m + logf(w1 + w2);
}
