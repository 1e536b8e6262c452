// Stage 02's exercise, solved: the two holes of stages/02_paged/exercise.cu. Each
// definition below replaces the one with the same first line there (fill_in.py).

__device__ int64_t token_offset(const kernels::PagedKV<bf16>& kv, int b, int t, int head) {
  uint32_t page_iter, slot;
  kv.page_size.divmod(static_cast<uint32_t>(t), page_iter, slot);  // t / page_size, t % page_size
  const int64_t page = kv.kv_indices[kv.kv_indptr[b] + page_iter];
  return page * kv.stride_page + slot * kv.stride_token + head * kv.stride_head;
}

__device__ void online_update(RowState& st, float s, const float (&v)[kPerLane]) {
  const float m_new = fmaxf(st.m, s);
  const float scale = st.m == -INFINITY ? 0.f : expf(st.m - m_new);  // the first key: nothing to rescale
  const float w = expf(s - m_new);
  st.d = st.d * scale + w;
  for (int e = 0; e < kPerLane; ++e) st.o[e] = st.o[e] * scale + w * v[e];
  st.m = m_new;
}
