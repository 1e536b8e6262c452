// The stage registry: one line per stage, in teaching order, and the kernels stages lend.
#include "registry.hpp"

#include "01_naive/naive.hpp"
#include "02_paged/paged.hpp"
#include "03_split_kv/split_kv.hpp"
#include "04_tensor_core/tensor_core.hpp"
#include "05_cascade/cascade.hpp"
#include "07_hopper/hopper.hpp"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages {

const std::vector<StageInfo>& registry() {
  static const std::vector<StageInfo> stages = {
      naive::stage_info(),               // 01: scores materialized, three passes, fp32
      paged::stage_info(),               // 02: paged decode, online softmax, one pass
      split_kv::stage_info(),            // 03: plan/run, KV split into chunks that fill the chip, merge
      tensor_core::stage_info(),         // 04: prefill and large-group decode on tensor cores, paged K/V
      tensor_core::ragged_stage_info(),  // 04: the same kernel over ragged K/V
      cascade::stage_info(),             // 05: shared prefix pages read once per group, levels merged
      hopper::stage_info(),              // 07: prefill on Hopper: TMA, wgmma, warp specialisation, paged K/V
      hopper::ragged_stage_info(),       // 07: the same over ragged K/V, every tile one TMA copy
  };
  return stages;
}

const std::vector<LevelKernel>& level_kernels() {
  static const std::vector<LevelKernel> kernels = {
      hopper::level_kernel(),  // 07 lends stage 05 its kernel for cascade levels (sm_90a)
  };
  return kernels;
}

const LevelKernel* find_level_kernel(const std::string& stage) {
  for (const LevelKernel& k : level_kernels())
    if (k.stage == stage) return &k;
  return nullptr;
}

const StageInfo& find_stage(const std::string& name) {
  std::string known;
  for (const StageInfo& s : registry()) {
    if (s.name == name || s.name.substr(0, s.name.find('_')) == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw ref::InvalidArgument("find_stage: no stage named \"" + name + "\" (known: " + known + ")");
}

}  // namespace flashstep::stages
