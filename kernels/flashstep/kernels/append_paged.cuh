/// \file append_paged.cuh
/// \brief The append of new key/value rows into the paged KV pool (FlashInfer's
/// append_paged_kv_cache): row r goes to token positions[r] of request batch_indices[r],
/// whose page comes from the CSR page table (paged_kv.cuh's layout).
///
/// A plain element-wise copy: it moves a few bytes per element, so any head_dim works and
/// nothing is tiled. One block per appended row; its threads stride over (head, dim). A
/// row whose request, position or page is out of range is skipped and reported (status 1),
/// so a bad index never writes outside the pool.
///
/// **Quantize on write.** Rows of fp16/bf16 go into an FP8 cache (e4m3 or e5m2) divided by
/// the cache's per-tensor scale, the one attention multiplies back (`k_scale`, `v_scale`
/// of FlashInfer's run(): scores use k * k_scale). Element x is stored as
///
///     KV(double(x) / scale)      the __nv_fp8_e4m3 / __nv_fp8_e5m2 constructor from double:
///                                round to nearest even, saturating (__NV_SATFINITE)
///
/// The quotient is formed in double, correctly rounded (IEEE division on the device as on
/// the host), and rounded once more to FP8: exactly the steps of the reference's
/// ref::quantize(x, format, scale), so the stored pattern is its pattern bit for bit. A
/// float quotient (x * (1 / scale), or x / scale in float, as some engines write it) is
/// rounded to float first and can differ from it near an FP8 tie.
/// FlashInfer's own append copies rows already in the cache's type; that is the case
/// KV == T here (scales 1).
///
/// The Params struct compiles with a plain C++ compiler too (host code fills it); the
/// kernel and its launcher only under nvcc.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>
#endif

namespace flashstep::kernels {

/// Arguments of the append: raw pointers and element strides.
struct AppendPagedKVParams {
  const void* append_key = nullptr;        ///< (nnz, Hkv, D), rows key_row_stride apart
  const void* append_value = nullptr;      ///< (nnz, Hkv, D), rows value_row_stride apart
  int64_t key_row_stride = 0;              ///< elements between rows of append_key
  int64_t value_row_stride = 0;            ///< elements between rows of append_value
  int64_t nnz = 0;                         ///< rows to append
  const int32_t* batch_indices = nullptr;  ///< (nnz) request of each row
  const int32_t* positions = nullptr;      ///< (nnz) position of each row in its request's KV
  void* k_cache = nullptr;                 ///< key half of page 0, in the cache's type
  void* v_cache = nullptr;                 ///< value half of page 0, in the cache's type
  int64_t page_stride = 0;                 ///< elements from one page to the next
  bool hnd = false;                        ///< page layout HND (else NHD)
  int num_kv_heads = 0;                    ///< Hkv
  int head_dim = 0;                        ///< D
  int page_size = 0;                       ///< tokens per page
  int64_t num_pages = 0;                   ///< pages in the pool
  const int32_t* kv_indices = nullptr;     ///< (kv_indptr[batch_size]) page ids
  const int32_t* kv_indptr = nullptr;      ///< (batch_size + 1)
  int batch_size = 0;                      ///< requests
  int32_t* status = nullptr;               ///< (nnz) 0 written, 1 refused; may be null
  double k_scale = 1.0;                    ///< FP8 cache: keys are stored as k / k_scale; positive, finite
  double v_scale = 1.0;                    ///< FP8 cache: values are stored as v / v_scale; positive, finite
};

#if defined(__CUDACC__)

/// Threads per block of the append.
constexpr int kAppendThreads = 128;

/// What element x of a row becomes in a cache of type KV: itself when the types agree,
/// else KV(double(x) / scale) (file comment).
template <typename KV, typename T>
__device__ __forceinline__ KV to_cache_element(T x, double scale) {
  if constexpr (std::is_same_v<KV, T>) return x;
  else return KV(static_cast<double>(static_cast<float>(x)) / scale);
}

/// Appends row blockIdx.x of (append_key, append_value). T is the rows' element type, KV
/// the cache's: T itself (a copy), or __nv_fp8_e4m3 / __nv_fp8_e5m2 for 16-bit T
/// (quantize on write under k_scale / v_scale).
template <typename T, typename KV = T>
__global__ void __launch_bounds__(kAppendThreads) append_paged_kv_cache_kernel(const AppendPagedKVParams p) {
  const int64_t r = blockIdx.x;
  const int32_t b = p.batch_indices[r];
  const int32_t pos = p.positions[r];
  bool ok = b >= 0 && b < p.batch_size && pos >= 0;
  int64_t page = -1;
  if (ok) {
    const int64_t entry = static_cast<int64_t>(p.kv_indptr[b]) + pos / p.page_size;
    ok = entry < p.kv_indptr[b + 1];
    if (ok) page = p.kv_indices[entry];
    ok = ok && page >= 0 && page < p.num_pages;
  }
  if (threadIdx.x == 0 && p.status != nullptr) p.status[r] = ok ? 0 : 1;
  if (!ok) return;
  const int slot = pos % p.page_size;
  const T* key = static_cast<const T*>(p.append_key) + r * p.key_row_stride;
  const T* value = static_cast<const T*>(p.append_value) + r * p.value_row_stride;
  KV* k_page = static_cast<KV*>(p.k_cache) + page * p.page_stride;
  KV* v_page = static_cast<KV*>(p.v_cache) + page * p.page_stride;
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    const int64_t h = i / p.head_dim;
    const int64_t d = i % p.head_dim;
    // NHD: page[slot][h][d]; HND: page[h][slot][d]
    const int64_t at = p.hnd ? (h * p.page_size + slot) * p.head_dim + d
                             : (static_cast<int64_t>(slot) * p.num_kv_heads + h) * p.head_dim + d;
    k_page[at] = to_cache_element<KV>(key[i], p.k_scale);
    v_page[at] = to_cache_element<KV>(value[i], p.v_scale);
  }
}

/// Launches the append on `stream` (nothing for nnz == 0); the caller checks the launch.
/// \tparam T the rows' element type \tparam KV the cache's (T, or FP8 for 16-bit T)
/// \param p the arguments \param stream where the kernel runs
template <typename T, typename KV = T>
void launch_append_paged_kv_cache(const AppendPagedKVParams& p, cudaStream_t stream) {
  static_assert(std::is_same_v<KV, T> ||
                    ((std::is_same_v<KV, __nv_fp8_e4m3> || std::is_same_v<KV, __nv_fp8_e5m2>)&&sizeof(T) == 2),
                "a cache holds the rows' type, or FP8 for 16-bit rows");
  if (p.nnz == 0) return;
  append_paged_kv_cache_kernel<T, KV><<<static_cast<unsigned>(p.nnz), kAppendThreads, 0, stream>>>(p);
}

#endif  // __CUDACC__

}  // namespace flashstep::kernels
