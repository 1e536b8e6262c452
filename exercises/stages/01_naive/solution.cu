// Stage 01's exercise, solved: the three kernel bodies of stages/01_naive/exercise.cu.
// Each definition below replaces the one with the same first line there (fill_in.py
// builds the program flashstep_exercise_01_naive_solution from the result).

__global__ void exercise_scores(ExerciseParams p) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int kv_begin = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - kv_begin;
  const int kv_head = h / (p.num_qo_heads / p.num_kv_heads);
  const float* q = p.q + (int64_t{b} * p.num_qo_heads + h) * p.head_dim;
  float* scores = p.scores + (int64_t{b} * p.num_qo_heads + h) * p.max_kv_len;
  for (int j = threadIdx.x; j < kv_len; j += blockDim.x) {
    const float* k = p.k + (int64_t{kv_begin + j} * p.num_kv_heads + kv_head) * p.head_dim;
    float dot = 0.f;
    for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
    scores[j] = p.sm_scale * dot;
  }
}

__global__ void exercise_softmax(ExerciseParams p) {
  const int h = blockIdx.x, b = blockIdx.y;
  if (threadIdx.x != 0) return;  // one thread walks the whole row: slow, and plainly right
  const int kv_len = p.kv_indptr[b + 1] - p.kv_indptr[b];
  const int64_t row = int64_t{b} * p.num_qo_heads + h;
  float* scores = p.scores + row * p.max_kv_len;
  if (kv_len == 0) {
    p.lse[row] = -INFINITY;
    return;
  }
  float m = -INFINITY, sum = 0.f;
  for (int j = 0; j < kv_len; ++j) m = fmaxf(m, scores[j]);
  for (int j = 0; j < kv_len; ++j) sum += scores[j] = expf(scores[j] - m);
  for (int j = 0; j < kv_len; ++j) scores[j] /= sum;
  p.lse[row] = m + logf(sum);
}

__global__ void exercise_output(ExerciseParams p) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int kv_begin = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - kv_begin;
  const int kv_head = h / (p.num_qo_heads / p.num_kv_heads);
  const int64_t row = int64_t{b} * p.num_qo_heads + h;
  const float* probs = p.scores + row * p.max_kv_len;
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < kv_len; ++j)
      acc += probs[j] * p.v[(int64_t{kv_begin + j} * p.num_kv_heads + kv_head) * p.head_dim + d];
    p.o[row * p.head_dim + d] = acc;
  }
}
