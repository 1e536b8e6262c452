/// \file registry.hpp
/// \brief The list of CUDA stages, in teaching order. Tests, the benchmark, the CLI, the
/// Python module and the docs iterate over it; none of them names a stage in code.
///
/// Adding a stage: give its folder a `stage_info()` (see 02_paged/paged.hpp) and add its
/// one line to the table in registry.cpp.
#pragma once

#include <string>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages {

/// Every stage, in teaching order (01_naive first).
const std::vector<StageInfo>& registry();

/// The stage called `name` (e.g. "02_paged"; the number alone, "02", names the stage's
/// first entry: "04" is "04_tensor_core", not "04_tensor_core_ragged").
/// Throws ref::InvalidArgument listing the known names otherwise.
const StageInfo& find_stage(const std::string& name);

}  // namespace flashstep::stages
