/// \file device_model.hpp
/// \brief What the planners' cost models assume of the GPU: how fast it streams K/V, how
/// many multiprocessors share the work, what one more kernel costs. No stage owns it:
/// stage 03 prices its split against stage 02's kernel, stage 05 the cascade against the
/// flat batch and stage 08 one GPU against several, each with the same DeviceModel.
///
/// Where the numbers come from, best first: measured in this process (bench/ceilings: the
/// read ceiling and the launch floor, which the benchmark and `flashstep serve --json`
/// hand to the planners), the device's attributes (device_model_from_attributes), or,
/// where no device answers, kFallbackDeviceModel.
#pragma once

#include <cuda_runtime_api.h>

namespace flashstep::kernels {

/// A GPU as the cost models see it.
struct DeviceModel {
  double read_bytes_per_second = 0;  ///< K/V streamed from memory into registers by the whole chip
  int num_sm = 0;                    ///< multiprocessors the blocks spread over
  double launch_seconds = 0;         ///< what one more kernel of a run costs (in a CUDA-graph replay)
};

/// An H100 SXM as flashstep measured it (docs/results): stage 02's best decode read
/// 2.9 TB/s, 132 SMs, 3 us for each kernel of a graph replay. The model where the device
/// cannot be asked.
inline constexpr DeviceModel kFallbackDeviceModel{2.9e12, 132, 3e-6};

/// The fraction of its theoretical memory bandwidth a decode's 16-byte loads reach: the
/// fallback's read rate over an H100 SXM's peak, 2 x 2619 MHz x 5120 bits / 8 = 3.35 TB/s.
inline constexpr double kReadFractionOfPeak = 2.9e12 / 3.35e12;

/// The model of CUDA device `device` from its attributes: the read rate is
/// kReadFractionOfPeak of the peak, 2 (double data rate) x memory clock x bus width / 8;
/// num_sm its multiprocessors; launch_seconds the fallback's (no attribute tells it; the
/// launch floor measures it). What cannot be read keeps the fallback's number. (CUDA 13
/// dropped the memory clock from cudaDeviceProp; the attribute remains.)
inline DeviceModel device_model_from_attributes(int device) {
  DeviceModel model = kFallbackDeviceModel;
  int clock_khz = 0, bus_bits = 0, sms = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();  // no device to ask: the fallback, and no error left behind
    return model;
  }
  if (clock_khz > 0 && bus_bits > 0)
    model.read_bytes_per_second = kReadFractionOfPeak * 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  if (sms > 0) model.num_sm = sms;
  return model;
}

}  // namespace flashstep::kernels
