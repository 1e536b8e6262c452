// The device model with measured rates (measured_model.hpp).
#include "measured_model.hpp"

#include <cmath>

namespace flashstep::bench {

kernels::DeviceModel measured_device_model(kernels::DeviceModel model, double read_gbps, double launch_floor_us) {
  if (std::isfinite(read_gbps) && read_gbps > 0) model.read_bytes_per_second = read_gbps * 1e9;
  if (std::isfinite(launch_floor_us) && launch_floor_us > 0) model.launch_seconds = launch_floor_us * 1e-6;
  return model;
}

}  // namespace flashstep::bench
