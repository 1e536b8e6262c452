// Stage 06's exercise, solved: the two holes of stages/06_sampling/exercise.cu. Each
// definition below replaces the one with the same first line there (fill_in.py).

__device__ bool crosses(Mass before, float x, bool candidate, Mass threshold) {
  return candidate && before <= threshold && before + mass_of(x) > threshold;
}

__device__ void reject(float pivot_0, float pivot_1, bool pivot_1_passes, const Above& above, float& low, float& high,
                       Mass& q) {
  if (pivot_1_passes) {  // the cut lies in (pivot_0, pivot_1]
    low = pivot_0;
    high = pivot_1;
    q = above.mass_0;
  } else {
    low = pivot_1;
    q = above.mass_1;
  }
}
