// A mixed step's attention as two calls, one call or one POD launch (mixed_step.hpp).
#include "mixed_step.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "09_engine/engine.hpp"
#include "09_engine/grow_buffer.hpp"
#include "09_engine/pod_attention.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "registry.hpp"

namespace flashstep::bench {

using stages::BatchShape;
using stages::default_stage;
using stages::DeviceBatch;
using stages::KVStorage;
using stages::Mode;
using stages::StageRunner;

const char* to_string(MixedForm form) {
  switch (form) {
    case MixedForm::two_calls: return "two_calls";
    case MixedForm::one_call: return "one_call";
    case MixedForm::pod: return "pod";
  }
  return "?";
}

namespace {

using Buffer = stages::engine::GrowBuffer;

// One call: a stage's runner and its workspace.
struct Call {
  std::string name;
  std::unique_ptr<StageRunner> runner;
  Buffer workspace;
  void plan(const std::string& asked, const BatchShape& shape, cudaStream_t stream) {
    std::string stage = asked.empty() ? default_stage(shape) : asked;
    const std::string why = stages::find_stage(stage).unsupported_reason(shape);
    ref::require(why.empty(), "MixedStepAttention::plan", stage + " cannot run " + shape.describe() + ": " + why);
    if (stage != name || !runner) {
      runner = stages::find_stage(stage).make_runner();
      name = stage;
    }
    workspace.reserve(std::max<size_t>(runner->workspace_bytes(shape), 256), stream);
    runner->plan(shape, workspace.ptr, workspace.bytes, stream);
  }
};

std::vector<int32_t> rebased(const std::vector<int32_t>& indptr, size_t from, size_t n) {
  std::vector<int32_t> out(indptr.begin() + static_cast<std::ptrdiff_t>(from),
                           indptr.begin() + static_cast<std::ptrdiff_t>(from + n));
  for (int32_t& x : out) x -= indptr[from];
  return out;
}

}  // namespace

struct MixedStepAttention::Impl {
  MixedForm form;
  std::string decode_asked, prefill_asked;
  Call decode, prefill;
  stages::engine::PodAttention pod;
  bool runs_decode = false, runs_prefill = false;
  std::string none, pod_name = "pod_attention";
  BatchShape step;
  int nd = 0;
  // the prefill rows' qo_indptr and kv_indptr rebased to 0 (two calls), on the device
  Buffer prefill_indptr;
  int32_t* pinned = nullptr;
  size_t pinned_count = 0;
  ~Impl() {
    if (pinned) cudaFreeHost(pinned);
  }
};

MixedStepAttention::MixedStepAttention(MixedForm form, std::string decode_stage, std::string prefill_stage)
    : impl_(std::make_unique<Impl>()) {
  impl_->form = form;
  impl_->decode_asked = std::move(decode_stage);
  impl_->prefill_asked = std::move(prefill_stage);
}
MixedStepAttention::~MixedStepAttention() = default;

const std::string& MixedStepAttention::decode_stage() const {
  return impl_->runs_decode ? impl_->decode.name : impl_->none;
}
const std::string& MixedStepAttention::prefill_stage() const {
  if (!impl_->runs_prefill) return impl_->none;
  return impl_->form == MixedForm::pod ? impl_->pod_name : impl_->prefill.name;
}

void MixedStepAttention::plan(const BatchShape& step, int num_decodes, cudaStream_t stream) {
  const char* fn = "MixedStepAttention::plan";
  Impl& m = *impl_;
  const int rows = step.batch_size;
  ref::require(step.mode == Mode::prefill && step.storage == KVStorage::paged, fn,
               "the step must be a prefill batch over a paged pool");
  ref::require(num_decodes >= 0 && num_decodes <= rows, fn,
               "num_decodes must be in 0..batch_size, got " + std::to_string(num_decodes));
  ref::require(static_cast<int>(step.qo_indptr.size()) == rows + 1 &&
                   static_cast<int>(step.kv_indptr.size()) == rows + 1 &&
                   static_cast<int>(step.kv_last_page_len.size()) == rows,
               fn, "qo_indptr and kv_indptr must have batch_size + 1 entries, kv_last_page_len batch_size");
  for (int i = 0; i < num_decodes; ++i)
    ref::require(step.qo_indptr[i + 1] - step.qo_indptr[i] == 1, fn,
                 "decode row " + std::to_string(i) + " must have one query");
  m.step = step;
  m.nd = num_decodes;
  const int np = rows - num_decodes;
  m.runs_decode = m.form == MixedForm::two_calls && num_decodes > 0;
  m.runs_prefill = m.form == MixedForm::two_calls ? np > 0 : rows > 0;
  if (m.form == MixedForm::pod) {
    m.pod.plan(step, num_decodes, stream);
    return;
  }
  if (m.form == MixedForm::one_call) {
    if (m.runs_prefill) m.prefill.plan(m.prefill_asked, step, stream);
    return;
  }
  const int32_t p0 = step.kv_indptr[num_decodes];
  if (m.runs_decode) {
    BatchShape d = step;
    d.mode = Mode::decode;
    d.causal = false;
    d.batch_size = num_decodes;
    d.qo_indptr.assign(step.qo_indptr.begin(), step.qo_indptr.begin() + num_decodes + 1);
    d.kv_indptr.assign(step.kv_indptr.begin(), step.kv_indptr.begin() + num_decodes + 1);
    d.kv_last_page_len.assign(step.kv_last_page_len.begin(), step.kv_last_page_len.begin() + num_decodes);
    d.kv_indices.assign(step.kv_indices.begin(),
                        step.kv_indices.begin() + std::min<size_t>(p0, step.kv_indices.size()));
    m.decode.plan(m.decode_asked, d, stream);
  }
  if (m.runs_prefill) {
    BatchShape p = step;
    p.batch_size = np;
    p.qo_indptr = rebased(step.qo_indptr, static_cast<size_t>(num_decodes), static_cast<size_t>(np) + 1);
    p.kv_indptr = rebased(step.kv_indptr, static_cast<size_t>(num_decodes), static_cast<size_t>(np) + 1);
    p.kv_last_page_len.assign(step.kv_last_page_len.begin() + num_decodes, step.kv_last_page_len.end());
    if (!step.kv_indices.empty()) p.kv_indices.assign(step.kv_indices.begin() + p0, step.kv_indices.end());
    m.prefill.plan(m.prefill_asked, p, stream);
    // the rebased arrays on the device: [qo_indptr | kv_indptr]
    const size_t n = 2 * (static_cast<size_t>(np) + 1);
    if (n > m.pinned_count) {
      if (m.pinned) {
        FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        FLASHSTEP_CUDA_CHECK(cudaFreeHost(m.pinned));
      }
      FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.pinned), n * sizeof(int32_t)));
      m.pinned_count = n;
    }
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));  // the last upload out of `pinned` is done
    std::copy(p.qo_indptr.begin(), p.qo_indptr.end(), m.pinned);
    std::copy(p.kv_indptr.begin(), p.kv_indptr.end(), m.pinned + np + 1);
    m.prefill_indptr.reserve(n * sizeof(int32_t), stream);
    FLASHSTEP_CUDA_CHECK(
        cudaMemcpyAsync(m.prefill_indptr.ptr, m.pinned, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
}

void MixedStepAttention::run(const DeviceBatch& step, cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.form == MixedForm::pod) {
    m.pod.run(step, stream);
    return;
  }
  if (m.form == MixedForm::one_call) {
    if (m.runs_prefill) m.prefill.runner->run(step, stream);
    return;
  }
  if (m.runs_decode) m.decode.runner->run(step, stream);  // rows 0 .. nd-1: prefixes of the step's arrays
  if (!m.runs_prefill) return;
  const BatchShape& s = m.step;
  const int np = s.batch_size - m.nd;
  const size_t q0 = static_cast<size_t>(s.qo_indptr[m.nd]), p0 = static_cast<size_t>(s.kv_indptr[m.nd]);
  const size_t row = static_cast<size_t>(s.num_qo_heads) * static_cast<size_t>(s.head_dim) *
                     stages::dtype_bytes(s.dtype);
  DeviceBatch p = step;
  p.q = static_cast<const char*>(step.q) + q0 * row;
  p.o = static_cast<char*>(step.o) + q0 * row;
  p.lse = step.lse + q0 * static_cast<size_t>(s.num_qo_heads);
  p.qo_indptr = static_cast<const int32_t*>(m.prefill_indptr.ptr);
  p.kv_indptr = static_cast<const int32_t*>(m.prefill_indptr.ptr) + np + 1;
  p.kv_indices = step.kv_indices + p0;
  p.kv_last_page_len = step.kv_last_page_len + m.nd;
  m.prefill.runner->run(p, stream);
}

}  // namespace flashstep::bench
