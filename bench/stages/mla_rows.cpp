// flashstep_bench's MLA rows: see mla_rows.hpp.
#include "mla_rows.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "device_fill.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "harness/device.hpp"
#include "10_mla/mla.hpp"
#include "timing.hpp"

namespace flashstep::bench {
namespace {

constexpr const char* kHeader = "name,set,batch,kv_len,qo_len,num_heads,page_size,causal,dtype";

/// One row of bench/shapes_mla.csv.
struct MlaBenchShape {
  std::string name, set;
  int batch = 0, kv_len = 0, qo_len = 0, num_heads = 0, page_size = 0;
  bool causal = false;
  stages::DType dtype = stages::DType::bf16;
};

std::vector<MlaBenchShape> load(const std::string& path) {
  const char* fn = "load_mla_shapes";
  std::ifstream in(path);
  ref::require(in.good(), fn, "cannot open " + path);
  std::vector<MlaBenchShape> out;
  bool header = false;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty() || line[0] == '#') continue;
    if (!header) {
      header = true;
      ref::require(line == kHeader, fn, path + ": the header must be " + std::string(kHeader));
      continue;
    }
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    const std::string where = path + ":" + std::to_string(line_no);
    ref::require(f.size() == 9, fn, where + ": expected 9 fields, got " + std::to_string(f.size()));
    MlaBenchShape s;
    s.name = f[0], s.set = f[1];
    try {
      s.batch = std::stoi(f[2]), s.kv_len = std::stoi(f[3]), s.qo_len = std::stoi(f[4]);
      s.num_heads = std::stoi(f[5]), s.page_size = std::stoi(f[6]), s.causal = std::stoi(f[7]) != 0;
    } catch (const std::exception&) {
      ref::require(false, fn, where + ": a size field is not an integer");
    }
    s.dtype = stages::parse_dtype(f[8]);
    out.push_back(s);
  }
  return out;
}

/// (query row, key) pairs the mask lets through, per head.
double visible_pairs(const MlaBenchShape& s) {
  double per = 0;
  for (int i = 0; i < s.qo_len; ++i)
    per += s.causal ? std::max(0, std::min(s.kv_len, i + s.kv_len - s.qo_len + 1)) : s.kv_len;
  return per * s.batch;
}

/// The device inputs of one shape: pages in a shuffled order, values uniform in [-1, 1).
struct MlaInputs {
  stages::mla::MlaShape shape;
  stages::harness::DeviceBuffer q_nope, q_pe, ckv, kpe, indices, o, lse, workspace;
  stages::mla::MlaRunner runner;
  stages::mla::MlaBatch batch;

  MlaInputs(const MlaBenchShape& s, bool portable_only) {
    const int pages_per = (s.kv_len + s.page_size - 1) / s.page_size;
    const int64_t used = int64_t(s.batch) * pages_per, num_pages = used + used / 4;
    std::vector<int32_t> pool(static_cast<size_t>(num_pages));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937_64(20261129));
    std::vector<int32_t> ids(pool.begin(), pool.begin() + used);
    shape.dtype = s.dtype;
    shape.batch_size = s.batch;
    shape.num_heads = s.num_heads;
    shape.page_size = s.page_size;
    shape.num_pages = num_pages;
    shape.causal = s.causal;
    shape.sm_scale = 1.f / std::sqrt(192.f);
    shape.portable_only = portable_only;
    for (int i = 0; i <= s.batch; ++i) {
      shape.qo_indptr.push_back(i * s.qo_len);
      shape.kv_indptr.push_back(i * pages_per);
    }
    shape.kv_len.assign(static_cast<size_t>(s.batch), s.kv_len);
    const size_t e = stages::dtype_bytes(s.dtype), rows = size_t(s.batch) * s.qo_len * s.num_heads;
    const size_t slots = size_t(num_pages) * s.page_size;
    q_nope = stages::harness::DeviceBuffer(rows * 512 * e);
    q_pe = stages::harness::DeviceBuffer(rows * 64 * e);
    ckv = stages::harness::DeviceBuffer(slots * 512 * e);
    kpe = stages::harness::DeviceBuffer(slots * 64 * e);
    o = stages::harness::DeviceBuffer(rows * 512 * e);
    lse = stages::harness::DeviceBuffer(rows * sizeof(float));
    indices = stages::harness::upload(ids);
    fill_uniform(s.dtype, q_nope.get(), rows * 512, 1, -1.f, 1.f, nullptr);
    fill_uniform(s.dtype, q_pe.get(), rows * 64, 2, -1.f, 1.f, nullptr);
    fill_uniform(s.dtype, ckv.get(), slots * 512, 3, -1.f, 1.f, nullptr);
    fill_uniform(s.dtype, kpe.get(), slots * 64, 4, -1.f, 1.f, nullptr);
    workspace = stages::harness::DeviceBuffer(runner.workspace_bytes(shape));
    runner.plan(shape, workspace.get(), workspace.bytes(), nullptr);
    batch = {q_nope.get(), q_pe.get(), ckv.get(), kpe.get(), indices.as<int32_t>(), o.get(), lse.as<float>()};
    FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

}  // namespace

bool is_mla_shapes_file(const std::string& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') return line.rfind("name,set,batch,kv_len,qo_len,num_heads", 0) == 0;
  return false;
}

void register_mla_rows(const std::string& path, const std::set<std::string>& sets,
                       const std::function<benchmark::internal::Benchmark*(benchmark::internal::Benchmark*)>& configure,
                       const double* gemm_tflops, const double* read_gbps) {
  for (const bool portable : {false, true})
    for (const MlaBenchShape& s : load(path)) {
      if (!sets.count(s.set)) continue;
      // mla/: the kernel plan() picks (wgmma on an H100/H200); mla[mma_sync]/: the sm_80 kernels
      const std::string name = std::string(portable ? "mla[mma_sync]/" : "mla/") + s.name;
      configure(
          benchmark::RegisterBenchmark(name.c_str(), [s, portable, gemm_tflops, read_gbps](benchmark::State& state) {
            static GpuTimer timer;
            const MlaInputs in(s, portable);  // per repetition: a shape's pool is not held while the others run
            const double pairs = visible_pairs(s) * s.num_heads;
            const double flops = 2 * pairs * (512 + 64) + 2 * pairs * 512;
            const double rows = double(s.batch) * s.qo_len * s.num_heads;
            const double e = double(stages::dtype_bytes(s.dtype));
            const double bytes = e * s.batch * double(s.kv_len) * 576 + e * rows * (2 * 512 + 64) + 4 * rows;
            run_timed(
                state, timer, [&] { in.runner.run(in.batch, timer.stream()); }, bytes, flops, *gemm_tflops, *read_gbps);
            const stages::mla::MlaPlanInfo& info = in.runner.info();
            state.SetLabel(std::string(info.kernel) + ", rows/tile " + std::to_string(info.rows_per_tile) + ", chunk " +
                           std::to_string(info.chunk_keys) + ", blocks " + std::to_string(info.work_items));
          }));
    }
}

}  // namespace flashstep::bench
