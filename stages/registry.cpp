// The stage registry: one line per stage, in teaching order, the kernels stages lend, and
// the default choice of stage.
#include "registry.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>

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

int default_stage_among(const std::vector<std::string>& supporting, Mode mode, int group_size) {
  if (supporting.empty()) return -1;
  if (mode == Mode::decode && group_size <= kDecodeStageMaxGroup)
    for (size_t i = 0; i < supporting.size(); ++i)
      if (supporting[i] == kDecodeStage) return static_cast<int>(i);
  return static_cast<int>(supporting.size()) - 1;
}

namespace {

/// Makes `device` current while it lives (-1 or the current one: nothing to do), and the
/// previous one current again after, also when the question throws.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (device < 0) return;
    int current = 0;
    check(cudaGetDevice(&current));
    if (current == device) return;
    check(cudaSetDevice(device));
    previous_ = current;
  }
  ~CurrentDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);  // (a destructor must not throw)
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  static void check(cudaError_t err) {
    if (err == cudaSuccess) return;
    cudaGetLastError();
    throw std::runtime_error(std::string("default_stage: CUDA error: ") + cudaGetErrorString(err));
  }
  int previous_ = -1;
};

}  // namespace

const std::string& default_stage(const BatchShape& shape, int device) {
  const CurrentDevice scope(device);
  // The rule gives a decode of a small group to kDecodeStage whenever that stage supports
  // it: ask it first, the others only when it does not (the same answer, without asking
  // every stage at every engine step).
  if (shape.mode == Mode::decode && shape.group_size() <= kDecodeStageMaxGroup) {
    const StageInfo& decode = find_stage(kDecodeStage);
    if (decode.unsupported_reason(shape).empty()) return decode.name;
  }
  std::vector<std::string> supporting;
  std::vector<const StageInfo*> infos;
  std::string reasons;
  for (const StageInfo& s : registry()) {
    if (s.needs_host_page_table) continue;
    const std::string why = s.unsupported_reason(shape);
    if (why.empty()) {
      supporting.push_back(s.name);
      infos.push_back(&s);
    } else {
      reasons += "\n  " + s.name + ": " + why;
    }
  }
  const int chosen = default_stage_among(supporting, shape.mode, shape.group_size());
  if (chosen < 0) throw ref::InvalidArgument("default_stage: no stage runs " + shape.describe() + ":" + reasons);
  return infos[static_cast<size_t>(chosen)]->name;
}

}  // namespace flashstep::stages
