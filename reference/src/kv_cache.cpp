// Host KV caches: contiguous append, paged append and gather.
#include "flashstep/reference/kv_cache.hpp"

#include <set>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

ContiguousKVCache::ContiguousKVCache(int64_t num_kv_heads, int64_t head_dim)
    : k_({0, num_kv_heads, head_dim}), v_({0, num_kv_heads, head_dim}) {
  require(num_kv_heads > 0 && head_dim > 0, "ContiguousKVCache", "num_kv_heads and head_dim must be positive");
}

void ContiguousKVCache::append(const Tensor& k_new, const Tensor& v_new) {
  const char* fn = "ContiguousKVCache::append";
  check_rank(fn, "k_new", k_new, 3);
  check_rank(fn, "v_new", v_new, 3);
  require(k_new.shape == v_new.shape, fn, "k_new and v_new must have the same shape");
  check_dim(fn, "k_new", k_new, 1, k_.dim(1), "num_kv_heads");
  check_dim(fn, "k_new", k_new, 2, k_.dim(2), "head_dim");
  check_finite(fn, "k_new", k_new);
  check_finite(fn, "v_new", v_new);
  // NHD rows are contiguous, so appending tokens is appending to the flat vector.
  k_.data.insert(k_.data.end(), k_new.data.begin(), k_new.data.end());
  v_.data.insert(v_.data.end(), v_new.data.begin(), v_new.data.end());
  k_.shape[0] += k_new.dim(0);
  v_.shape[0] += v_new.dim(0);
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> get_batch_indices_positions(
    const std::vector<int32_t>& append_indptr, const std::vector<int32_t>& seq_lens, int64_t nnz) {
  const char* fn = "get_batch_indices_positions";
  check_indptr(fn, "append_indptr", append_indptr, static_cast<int64_t>(seq_lens.size()) + 1, nnz);
  std::vector<int32_t> batch_indices, positions;
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    const int32_t append_len = append_indptr[i + 1] - append_indptr[i];
    require(seq_lens[i] >= append_len, fn,
            "seq_lens[" + std::to_string(i) + "] = " + std::to_string(seq_lens[i]) + " is shorter than the " +
                std::to_string(append_len) + " tokens appended to it");
    for (int32_t t = 0; t < append_len; ++t) {
      batch_indices.push_back(static_cast<int32_t>(i));
      positions.push_back(seq_lens[i] - append_len + t);
    }
  }
  return {batch_indices, positions};
}

void append_paged_kv_cache(const Tensor& append_key, const Tensor& append_value,
                           const std::vector<int32_t>& batch_indices, const std::vector<int32_t>& positions,
                           PagedKVCache& cache) {
  const char* fn = "append_paged_kv_cache";
  check_rank(fn, "append_key", append_key, 3);
  check_rank(fn, "append_value", append_value, 3);
  require(append_key.dim(0) == append_value.dim(0) && append_key.dim(1) == append_value.dim(1), fn,
          "append_key and append_value must have the same shape but for the last dimension (head_dim_vo), got " +
              shape_string(append_key.shape) + " and " + shape_string(append_value.shape));
  check_paged_kv_pools(fn, cache);
  check_dim(fn, "append_key", append_key, 1, cache.num_kv_heads(), "num_kv_heads of the cache");
  check_dim(fn, "append_key", append_key, 2, cache.head_dim(), "head_dim of the cache");
  check_dim(fn, "append_value", append_value, 2, cache.head_dim_vo(), "head_dim_vo of the cache");
  check_finite(fn, "append_key", append_key);
  check_finite(fn, "append_value", append_value);
  const int64_t nnz = append_key.dim(0);
  require(static_cast<int64_t>(batch_indices.size()) == nnz, fn,
          "batch_indices must have length nnz = " + std::to_string(nnz) + ", got " +
              std::to_string(batch_indices.size()));
  require(static_cast<int64_t>(positions.size()) == nnz, fn,
          "positions must have length nnz = " + std::to_string(nnz) + ", got " + std::to_string(positions.size()));
  // The page table is validated without the finiteness scan: the slots being appended
  // are allowed to hold garbage until we write them.
  check_indptr(fn, "kv_indptr", cache.kv_indptr, -1, static_cast<int64_t>(cache.kv_indices.size()));
  for (size_t n = 0; n < cache.kv_indices.size(); ++n)
    require_lazy(cache.kv_indices[n] >= 0 && cache.kv_indices[n] < cache.num_pages(), fn, [&] {
      return "kv_indices[" + std::to_string(n) + "] = " + std::to_string(cache.kv_indices[n]) +
             " is out of range for a pool of " + std::to_string(cache.num_pages()) + " pages";
    });
  require(static_cast<int64_t>(cache.kv_last_page_len.size()) == cache.batch_size(), fn,
          "kv_last_page_len must have length batch_size = " + std::to_string(cache.batch_size()));
  for (int64_t i = 0; i < cache.batch_size(); ++i) {
    const bool has_pages = cache.kv_indptr[i + 1] > cache.kv_indptr[i];
    const int32_t lpl = cache.kv_last_page_len[i];
    require(has_pages ? (lpl >= 1 && lpl <= cache.page_size()) : lpl == 0, fn,
            "kv_last_page_len[" + std::to_string(i) + "] = " + std::to_string(lpl) + " must be in 1..page_size (" +
                std::to_string(cache.page_size()) + ")");
  }
  for (int64_t t = 0; t < nnz; ++t) {
    const int32_t b = batch_indices[t], pos = positions[t];
    require_lazy(b >= 0 && b < cache.batch_size(), fn, [&] {
      return "batch_indices[" + std::to_string(t) + "] = " + std::to_string(b) + " is out of range for batch_size " +
             std::to_string(cache.batch_size());
    });
    require_lazy(pos >= 0 && pos < cache.kv_len(b), fn, [&] {
      return "positions[" + std::to_string(t) + "] = " + std::to_string(pos) + " is outside request " +
             std::to_string(b) + "'s kv_len " + std::to_string(cache.kv_len(b)) +
             " (the page table must already include the appended tokens)";
    });
    // Address translation: logical position -> (page, slot) through the page table.
    const int32_t page = cache.kv_indices[cache.kv_indptr[b] + pos / cache.page_size()];
    const int64_t slot = pos % cache.page_size();
    for (int64_t h = 0; h < cache.num_kv_heads(); ++h) {
      for (int64_t d = 0; d < cache.head_dim(); ++d) cache.at(page, 0, slot, h, d) = append_key({t, h, d});
      for (int64_t d = 0; d < cache.head_dim_vo(); ++d) cache.at(page, 1, slot, h, d) = append_value({t, h, d});
    }
  }
}

std::pair<Tensor, Tensor> gather_paged_kv(const PagedKVCache& cache, int64_t request) {
  const char* fn = "gather_paged_kv";
  require(request >= 0 && request < cache.batch_size(), fn,
          "request must be in [0, " + std::to_string(cache.batch_size()) + "), got " + std::to_string(request));
  const int64_t kv_len = cache.kv_len(request), heads = cache.num_kv_heads(), dim = cache.head_dim();
  const int64_t dim_vo = cache.head_dim_vo();
  Tensor k({kv_len, heads, dim}), v({kv_len, heads, dim_vo});
  for (int64_t t = 0; t < kv_len; ++t) {
    const int32_t page = cache.kv_indices[cache.kv_indptr[request] + t / cache.page_size()];
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < dim; ++d) k({t, h, d}) = cache.at(page, 0, t % cache.page_size(), h, d);
      for (int64_t d = 0; d < dim_vo; ++d) v({t, h, d}) = cache.at(page, 1, t % cache.page_size(), h, d);
    }
  }
  return {std::move(k), std::move(v)};
}

PagedKVCache make_paged_kv_cache(const std::vector<Tensor>& k, const std::vector<Tensor>& v, int64_t page_size,
                                 KVLayout layout, const std::vector<int32_t>& page_order, int64_t num_pages) {
  const char* fn = "make_paged_kv_cache";
  require(page_size >= 1, fn, "page_size must be >= 1, got " + std::to_string(page_size));
  require(!k.empty() && k.size() == v.size(), fn, "k and v must be equally long, non-empty lists");
  const int64_t heads = k[0].dim(1), dim = k[0].dim(2);
  PagedKVCache c;
  c.layout = layout;
  c.pages = layout == KVLayout::NHD ? Tensor({num_pages, 2, page_size, heads, dim})
                                    : Tensor({num_pages, 2, heads, page_size, dim});
  c.kv_indptr.push_back(0);
  std::set<int32_t> used;
  size_t next = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    check_rank(fn, "k[i]", k[i], 3);
    require(k[i].shape == v[i].shape && k[i].dim(1) == heads && k[i].dim(2) == dim, fn,
            "every k[i], v[i] must have shape (kv_len_i, " + std::to_string(heads) + ", " + std::to_string(dim) + ")");
    const int64_t kv_len = k[i].dim(0);
    const int64_t pages = (kv_len + page_size - 1) / page_size;
    for (int64_t p = 0; p < pages; ++p) {
      require(next < page_order.size(), fn, "page_order has too few pages for these lengths");
      const int32_t page = page_order[next++];
      require(page >= 0 && page < num_pages && used.insert(page).second, fn,
              "page_order must hold distinct page ids in [0, num_pages)");
      c.kv_indices.push_back(page);
    }
    c.kv_indptr.push_back(static_cast<int32_t>(c.kv_indices.size()));
    c.kv_last_page_len.push_back(static_cast<int32_t>(pages == 0 ? 0 : kv_len - (pages - 1) * page_size));
    for (int64_t t = 0; t < kv_len; ++t) {
      const int32_t page = c.kv_indices[c.kv_indptr[i] + t / page_size];
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          c.at(page, 0, t % page_size, h, d) = k[i]({t, h, d});
          c.at(page, 1, t % page_size, h, d) = v[i]({t, h, d});
        }
    }
  }
  return c;
}

}  // namespace flashstep::ref
