// Every kind of bad input gets an InvalidArgument naming the function, the argument and
// the rule it broke. The expected fragments are written by hand from the rules.
#include <doctest/doctest.h>

#include "support/expect_error.hpp"

#include <cmath>
#include <flashstep/reference.hpp>
#include <functional>
#include <limits>
#include <string>

using namespace flashstep;
using ref::AttentionOptions;
using ref::Tensor;

using flashstep::test::expect_error;

namespace {

/// A valid 2-request NHD cache: page_size 4, 2 kv heads, head_dim 8, 6 pages.
ref::PagedKVCache valid_cache() {
  ref::PagedKVCache c;
  c.pages = Tensor({6, 2, 4, 2, 8}, 0.5);
  c.kv_indptr = {0, 2, 3};
  c.kv_indices = {4, 1, 5};
  c.kv_last_page_len = {3, 4};
  return c;
}

}  // namespace

TEST_CASE("bad page tables are named") {
  const Tensor q({2, 4, 8}, 0.1);
  const char* fn = "batch_decode_with_paged_kv_cache";
  auto run = [&](ref::PagedKVCache c) { return [q, c] { ref::batch_decode_with_paged_kv_cache(q, c); }; };
  ref::PagedKVCache c = valid_cache();
  CHECK_NOTHROW(run(c)());

  c = valid_cache();
  c.kv_indptr = {1, 2, 3};
  expect_error(run(c), {fn, "kv_indptr[0] must be 0"});
  c = valid_cache();
  c.kv_indptr = {0, 3, 2};
  c.kv_indices = {4, 1};
  expect_error(run(c), {fn, "kv_indptr", "non-decreasing"});
  c = valid_cache();
  c.kv_indptr = {0, 2, 2};
  expect_error(run(c), {fn, "kv_indptr", "must end at the data length 3"});
  c = valid_cache();
  c.kv_indices = {4, 6, 5};
  expect_error(run(c), {fn, "kv_indices[1] = 6", "out of range"});
  c = valid_cache();
  c.kv_indices = {4, -1, 5};
  expect_error(run(c), {fn, "kv_indices[1] = -1", "out of range"});
  c = valid_cache();
  c.kv_last_page_len = {0, 4};
  expect_error(run(c), {fn, "kv_last_page_len[0] = 0", "1..page_size"});
  c = valid_cache();
  c.kv_last_page_len = {3, 5};
  expect_error(run(c), {fn, "kv_last_page_len[1] = 5", "1..page_size (4)"});
  c = valid_cache();
  c.kv_last_page_len = {3};
  expect_error(run(c), {fn, "kv_last_page_len must have length batch_size"});
  c = valid_cache();
  c.pages = Tensor({6, 2, 4, 2}, 0.5);
  expect_error(run(c), {fn, "paged_kv_cache must have rank 5"});
  c = valid_cache();
  c.pages = Tensor({6, 3, 4, 2, 8}, 0.5);
  expect_error(run(c), {fn, "paged_kv_cache dimension 1 must be 2"});
  c = valid_cache();
  c.pages({1, 1, 2, 0, 3}) = NAN;  // request 0, token 6, V
  expect_error(run(c), {fn, "paged_kv_cache must be finite", "V of request 0, token 6"});
  c = valid_cache();
  c.pages({0, 0, 0, 0, 0}) = NAN;  // page 0 is not referenced: fine
  CHECK_NOTHROW(run(c)());
  c = valid_cache();
  c.pages({4, 0, 0, 0, 0}) = INFINITY;
  expect_error(run(c), {fn, "paged_kv_cache must be finite"});
}

TEST_CASE("bad queries, heads and shapes are named") {
  const ref::PagedKVCache c = valid_cache();
  const char* fn = "batch_decode_with_paged_kv_cache";
  expect_error(
      [&] {
        ref::batch_decode_with_paged_kv_cache(Tensor({2, 3, 8}, 0.1), c);
      },
      {fn, "num_qo_heads (3) must be a multiple of num_kv_heads (2)"});
  expect_error(
      [&] {
        ref::batch_decode_with_paged_kv_cache(Tensor({2, 4, 16}, 0.1), c);
      },
      {fn, "head_dim", "must be 16", "got 8"});
  expect_error([&] { ref::batch_decode_with_paged_kv_cache(Tensor({3, 4, 8}, 0.1), c); }, {fn, "batch_size"});
  expect_error([&] { ref::batch_decode_with_paged_kv_cache(Tensor({2, 32}, 0.1), c); }, {fn, "q must have rank 3"});
  Tensor q_nan({2, 4, 8}, 0.1);
  q_nan({1, 2, 3}) = NAN;
  expect_error([&] { ref::batch_decode_with_paged_kv_cache(q_nan, c); }, {fn, "q must be finite"});

  const char* pf = "batch_prefill_with_paged_kv_cache";
  expect_error(
      [&] {
        ref::batch_prefill_with_paged_kv_cache(Tensor({5, 4, 8}, 0.1), {0, 2, 4}, c);
      },
      {pf, "qo_indptr", "must end at the data length 5"});
  expect_error(
      [&] {
        ref::batch_prefill_with_paged_kv_cache(Tensor({5, 4, 8}, 0.1), {0, 5}, c);
      },
      {pf, "qo_indptr must have length 3"});

  const char* sf = "single_prefill_with_kv_cache";
  const Tensor q({3, 4, 8}, 0.1), k({7, 2, 8}, 0.2);
  expect_error(
      [&] {
        ref::single_prefill_with_kv_cache(q, k, Tensor({7, 3, 8}, 0.2));
      },
      {sf, "k and v must have the same shape but for the last dimension"});
  expect_error(
      [&] {
        ref::single_prefill_with_kv_cache(q, k, Tensor({7, 2, 0}));
      },
      {sf, "head_dim_vo (v's last dimension) must be positive"});
  expect_error(
      [&] {
        ref::single_prefill_with_kv_cache(q, Tensor({7, 3, 8}, 0.2), Tensor({7, 3, 8}, 0.2));
      },
      {sf, "num_qo_heads (4) must be a multiple of num_kv_heads (3)"});
  expect_error(
      [&] {
        ref::single_prefill_with_kv_cache(q, Tensor({7, 2, 4}, 0.2), Tensor({7, 2, 4}, 0.2));
      },
      {sf, "k dimension 2 (head_dim, must match q) must be 8, got 4"});
  Tensor k_inf = k;
  k_inf({6, 1, 7}) = -INFINITY;
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k_inf, k); }, {sf, "k must be finite"});
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k, k_inf); }, {sf, "v must be finite"});
  Tensor hand_built({3, 4, 8});
  hand_built.data.pop_back();
  expect_error([&] { ref::single_prefill_with_kv_cache(hand_built, k, k); }, {sf, "q holds 95 elements"});

  // head_dim 0: shapes that agree with each other, but a head of no elements
  expect_error(
      [&] {
        ref::single_prefill_with_kv_cache(Tensor({3, 4, 0}), Tensor({7, 2, 0}), Tensor({7, 2, 0}));
      },
      {sf, "head_dim (q's last dimension) must be positive (got 0)"});

  const char* df = "single_decode_with_kv_cache";
  expect_error([&] { ref::single_decode_with_kv_cache(q, k, k); }, {df, "q must have rank 2"});
  expect_error(
      [&] {
        ref::single_decode_with_kv_cache(Tensor({4, 0}), Tensor({7, 2, 0}), Tensor({7, 2, 0}));
      },
      {df, "head_dim (q's last dimension) must be positive (got 0)"});

  AttentionOptions bad;
  bad.window_left = -2;
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k, k, bad); }, {sf, "window_left"});
  bad = {};
  bad.logits_soft_cap = -1;
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k, k, bad); }, {sf, "logits_soft_cap"});
  bad = {};
  bad.sm_scale = INFINITY;
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k, k, bad); }, {sf, "sm_scale"});
  bad.sm_scale = std::numeric_limits<double>::quiet_NaN();  // NaN is not "not given"
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k, k, bad); }, {sf, "sm_scale"});
  bad.sm_scale = 0.0;
  expect_error([&] { ref::single_prefill_with_kv_cache(q, k, k, bad); }, {sf, "sm_scale"});
  expect_error([] { ref::parse_kv_layout("NDH"); }, {"kv_layout", "NHD", "HND"});
}

TEST_CASE("ragged KV: bad kv_indptr is named") {
  const Tensor q({4, 2, 8}, 0.1), k({6, 2, 8}, 0.2);
  const char* fn = "batch_prefill_with_ragged_kv_cache";
  CHECK_NOTHROW(ref::batch_prefill_with_ragged_kv_cache(q, {0, 1, 4}, k, k, {0, 2, 6}));
  expect_error(
      [&] {
        ref::batch_prefill_with_ragged_kv_cache(q, {0, 1, 4}, k, k, {0, 2, 5});
      },
      {fn, "kv_indptr", "must end at the data length 6"});
  expect_error(
      [&] {
        ref::batch_prefill_with_ragged_kv_cache(q, {0, 1, 4}, k, k, {0, 6});
      },
      {fn, "kv_indptr must have length 3"});
  expect_error(
      [&] {
        ref::batch_prefill_with_ragged_kv_cache(q, {0, 3, 1, 4}, k, k, {0, 2, 4, 6});
      },
      {fn, "qo_indptr must be non-decreasing"});
}

TEST_CASE("merge and append reject bad arguments by name") {
  const Tensor v({2, 3, 4}, 1.0), s({2, 3}, 0.0);
  expect_error([&] { ref::merge_state(v, s, Tensor({2, 3, 5}, 1.0), s); }, {"merge_state", "v_a and v_b"});
  expect_error([&] { ref::merge_state(v, Tensor({2, 4}, 0.0), v, s); }, {"merge_state", "s_a must have shape (2, 3)"});
  expect_error([&] { ref::merge_state(v, Tensor({2, 3}, NAN), v, s); }, {"merge_state", "s_a must be finite or -inf"});
  expect_error(
      [&] {
        ref::merge_states(Tensor({2, 2, 3, 4}, 1.0), Tensor({2, 3, 3}, 0.0));
      },
      {"merge_states", "s must have shape (2, 2, 3)"});

  ref::PagedKVCache c = valid_cache();
  const Tensor kv({2, 2, 8}, 1.0);
  expect_error(
      [&] {
        ref::append_paged_kv_cache(kv, kv, {0, 2}, {0, 1}, c);
      },
      {"append_paged_kv_cache", "batch_indices[1] = 2", "out of range"});
  expect_error(
      [&] {
        ref::append_paged_kv_cache(kv, kv, {0, 1}, {0, 4}, c);
      },
      {"append_paged_kv_cache", "positions[1] = 4", "kv_len 4"});
  expect_error(
      [&] {
        ref::append_paged_kv_cache(kv, kv, {0}, {0, 1}, c);
      },
      {"append_paged_kv_cache", "batch_indices must have length nnz = 2"});
  expect_error(
      [&] {
        ref::append_paged_kv_cache(Tensor({2, 3, 8}, 1.0), Tensor({2, 3, 8}, 1.0), {0, 1}, {0, 1}, c);
      },
      {"append_paged_kv_cache", "num_kv_heads"});
  expect_error(
      [] {
        ref::get_batch_indices_positions({0, 4, 5}, {3, 1}, 5);
      },
      {"get_batch_indices_positions", "seq_lens[0] = 3"});
}
