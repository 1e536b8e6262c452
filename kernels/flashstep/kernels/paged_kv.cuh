/// \file paged_kv.cuh
/// \brief The paged-KV view: a page pool plus a CSR page table, and the address
/// translation from (request, token, head) to an element of the pool.
///
/// Layout (FlashInfer's; ARCHITECTURE.md's conventions):
///
///     pool  NHD: (num_pages, 2, page_size, num_kv_heads, head_dim)   [:,0] = K, [:,1] = V
///           HND: (num_pages, 2, num_kv_heads, page_size, head_dim)
///     kv_indptr        (batch_size + 1)   request b owns kv_indices[kv_indptr[b] : kv_indptr[b+1]]
///     kv_indices       (kv_indptr[batch_size])  physical page ids
///     kv_last_page_len (batch_size)       tokens in b's last page, 1..page_size (0 if no page)
///
/// Token t of request b lives in page kv_indices[kv_indptr[b] + t / page_size], slot
/// t % page_size. That division runs for every token a kernel touches, and page_size is
/// only known at run time, so FastDivmod replaces it by a multiply-high and a shift
/// (Granlund & Montgomery; FlashInfer's uint_fastdiv does the same).
///
/// The two layouts differ only in two strides, so one kernel serves both:
///
///     stride      NHD          HND
///     token       H * D        D
///     head        D            page_size * D
#pragma once

#include <cuda_runtime.h>  // __host__ / __device__ also for host compilers: FastDivmod runs on both

#include <cstdint>

namespace flashstep::kernels {

/// Division and remainder by a run-time divisor d >= 1, for any 32-bit unsigned n,
/// without a divide instruction: q = (mulhi(n, mul) + n) >> shift.
struct FastDivmod {
  uint32_t divisor = 1;  ///< d
  uint32_t mul = 1;      ///< floor(2^32 (2^shift - d) / d) + 1
  uint32_t shift = 0;    ///< ceil(log2 d)

  FastDivmod() = default;
  /// Precomputes the magic numbers (host or device). \param d divisor, >= 1
  __host__ __device__ explicit FastDivmod(uint32_t d) : divisor(d) {
    shift = 0;
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  /// q = n / d and r = n % d.
  __host__ __device__ __forceinline__ void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * mul) >> 32);
#endif
    // hi + n can exceed 32 bits for n near 2^32, so add in 64 bits.
    q = static_cast<uint32_t>((uint64_t{hi} + n) >> shift);
    r = n - q * divisor;
  }
};

/// A read-only view of a paged KV cache of element type `T`. Raw pointers and strides
/// only: built on the host (make_paged_kv), passed by value to kernels.
template <typename T>
struct PagedKV {
  const T* pool;                    ///< the page pool, shape in the file comment
  const int32_t* kv_indptr;         ///< (batch_size + 1)
  const int32_t* kv_indices;        ///< (kv_indptr[batch_size])
  const int32_t* kv_last_page_len;  ///< (batch_size)
  FastDivmod page_size;             ///< tokens per page, as a fast divisor
  int64_t stride_page;              ///< elements from one page to the next: 2 * P * H * D
  int64_t stride_kv;                ///< elements from K to V within a page: P * H * D
  int64_t stride_token;             ///< elements from one slot to the next within a page
  int64_t stride_head;              ///< elements from one kv head to the next

  /// Number of keys of request b: (pages - 1) * page_size + last_page_len, 0 if no pages.
  __device__ __forceinline__ int kv_len(int b) const {
    const int pages = kv_indptr[b + 1] - kv_indptr[b];
    return pages == 0 ? 0 : (pages - 1) * static_cast<int>(page_size.divisor) + kv_last_page_len[b];
  }

  /// Element offset of K[slot, head, 0] within physical page `page` (add stride_kv for V).
  __device__ __forceinline__ int64_t offset(int32_t page, uint32_t slot, int head) const {
    return page * stride_page + slot * stride_token + head * stride_head;
  }

  /// Element offset of K of token t of request b, head `head`, dim 0: the page-table walk.
  __device__ __forceinline__ int64_t k_offset(int b, uint32_t t, int head) const {
    uint32_t page_iter, slot;
    page_size.divmod(t, page_iter, slot);
    return offset(kv_indices[kv_indptr[b] + page_iter], slot, head);
  }
};

/// Builds the view (host). Stores the pointers and precomputes the strides of the
/// layout; reads no device memory, so it is cheap to call once per launch.
/// \param pool device page pool, (num_pages, 2, page_size, num_kv_heads, head_dim) for NHD
///        or (num_pages, 2, num_kv_heads, page_size, head_dim) for HND
/// \param kv_indptr device array (batch_size + 1): request b owns kv_indices[kv_indptr[b] :
///        kv_indptr[b+1]]
/// \param kv_indices device array (kv_indptr[batch_size]) of physical page ids
/// \param kv_last_page_len device array (batch_size): tokens in each request's last page,
///        1..page_size (0 for a request with no pages)
/// \param page_size tokens per page, >= 1
/// \param num_kv_heads kv heads, Hkv, of the pool
/// \param head_dim elements per head, D
/// \param hnd true for the HND page layout, false for NHD
template <typename T>
inline PagedKV<T> make_paged_kv(const T* pool, const int32_t* kv_indptr, const int32_t* kv_indices,
                                const int32_t* kv_last_page_len, int page_size, int num_kv_heads, int head_dim,
                                bool hnd) {
  PagedKV<T> v;
  v.pool = pool;
  v.kv_indptr = kv_indptr;
  v.kv_indices = kv_indices;
  v.kv_last_page_len = kv_last_page_len;
  v.page_size = FastDivmod(static_cast<uint32_t>(page_size));
  v.stride_kv = int64_t{page_size} * num_kv_heads * head_dim;
  v.stride_page = 2 * v.stride_kv;
  v.stride_token = hnd ? head_dim : int64_t{num_kv_heads} * head_dim;
  v.stride_head = hnd ? int64_t{page_size} * head_dim : head_dim;
  return v;
}

}  // namespace flashstep::kernels
