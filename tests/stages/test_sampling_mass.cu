// Device half of "stage 06 MassAcc on the GPU splits exactly the reference's masses"
// (test_sampling.cpp): MassAcc::parts and add_unit as the device compiles them (its
// float-to-uint64 conversions and truncation, mass.cuh), one thread a value.
#include <cstdint>
#include <vector>

#include "06_sampling/mass.cuh"
#include "sampling_support.hpp"

namespace {

__global__ void mass_parts_kernel(const float* values, int n, uint64_t* out) {
  using flashstep::stages::sampling::MassAcc;
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const MassAcc::Parts m = MassAcc::parts(values[i]);
  MassAcc unit;
  unit.add_unit(values[i]);
  out[4 * i] = m.hi;
  out[4 * i + 1] = m.lo;
  out[4 * i + 2] = unit.hi;
  out[4 * i + 3] = unit.lo;
}

}  // namespace

/// For each value: parts(p).hi, parts(p).lo, then add_unit(p)'s hi and lo, as the GPU computes them.
std::vector<uint64_t> device_mass_parts(const std::vector<float>& values) {
  const int n = static_cast<int>(values.size());
  const flashstep::test::DeviceArray<float> in(values);
  flashstep::test::DeviceArray<uint64_t> out(values.size() * 4);
  out.poison();
  mass_parts_kernel<<<(n + 255) / 256, 256>>>(in.get(), n, out.get());
  flashstep::test::cuda_ok(cudaGetLastError(), "launch");
  return out.download();
}
