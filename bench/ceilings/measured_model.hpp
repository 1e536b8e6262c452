// The device model (kernels/device_model.hpp) with what this process measured in place of
// what the device's attributes suggest: the read ceiling's rate and the launch floor. The
// benchmark and `flashstep serve --json` measure both before anything is timed and hand
// the result to the planners (stages' use_device_model), so the plans they time price
// with the rates they report.
#pragma once

#include "flashstep/kernels/device_model.hpp"

namespace flashstep::bench {

/// `model` with its read rate and launch cost replaced by measured ones.
/// \param read_gbps the read ceiling, GB/s (1e9 bytes a second) of read_only's kernel
/// \param launch_floor_us the launch floor of one kernel, microseconds (LaunchFloor(1))
/// A measurement that is not positive and finite leaves the model's own number.
kernels::DeviceModel measured_device_model(kernels::DeviceModel model, double read_gbps, double launch_floor_us);

}  // namespace flashstep::bench
