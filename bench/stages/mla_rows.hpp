/// \file mla_rows.hpp
/// \brief flashstep_bench's MLA rows (stages/10_mla/): bench/shapes_mla.csv's shapes, timed
/// like every stage row, named mla/<shape>; bench/peers/mla.py times FlashInfer's MLA and
/// PyTorch on the same shapes.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <set>
#include <string>

namespace flashstep::bench {

/// Whether `path` is an MLA shapes file (its header starts "name,set,batch,kv_len,qo_len,num_heads").
bool is_mla_shapes_file(const std::string& path);

/// Registers mla/<shape> for every shape of `path` in `sets`: TFLOP/s against
/// `*gemm_tflops`, GB/s (the latent cache once, q, o and lse: bench/shapes.py's mla_work)
/// against `*read_gbps`. The ceilings are read when a row runs (they are measured first).
void register_mla_rows(const std::string& path, const std::set<std::string>& sets,
                       const std::function<benchmark::internal::Benchmark*(benchmark::internal::Benchmark*)>& configure,
                       const double* gemm_tflops, const double* read_gbps);

}  // namespace flashstep::bench
