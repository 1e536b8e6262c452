/// \file scheduler.hpp
/// \brief Stage 09's host side: continuous batching over the paged KV pool, prefix
/// sharing through the radix cache, and the metadata of one step as FlashInfer's
/// wrappers take it.
///
/// An engine step, seen from the host:
///
/// ```
///   next_step()      admit waiting requests (arrival order, while pages last),
///                    give every decoding request 1 token and the prefills the rest of
///                    the token budget (chunked), append their slots to the page tables
///                    -> StepBatch: qo_indptr, kv_indptr/indices/last_page_len, positions,
///                       the (page, slot) of each new token, which rows sample
///   ... the GPU runs the model on the batch and samples ...
///   complete_step()  hand back the sampled tokens; finished requests free their pages
///                    (their whole pages stay in the radix cache for later prompts)
/// ```
///
/// **Layout of a step.** Decodes first, then prefills (as vLLM's FlashInfer backend
/// orders a mixed batch, so each wrapper gets a contiguous range): batch rows
/// 0 .. num_decodes-1 are decodes with one query each, the rest are prefill chunks.
/// Inside each group, requests keep their admission order.
///
/// **Admission reserves a request's whole life.** A request is admitted only if the pool
/// (after evicting unused cached pages) can hold its prompt and every token it may
/// generate: ceil((prompt + max_new_tokens - 1) / page_size) pages, less the pages of
/// its cached prefix. Decodes therefore never run out of pages and nothing is ever
/// preempted; the price is that a request that stops early at the end token held a
/// reservation it did not use (vLLM instead admits on the prompt alone and preempts
/// when decodes run out). Admission is first come first served: a request that does not
/// fit waits, and the requests behind it wait too. Nothing is dropped.
///
/// **Prefix sharing.** At admission, the prompt's longest cached prefix (whole pages,
/// RadixCache::match_prefix) is reused: its pages join the request's page table with one
/// more reference each and only the rest of the prompt is prefilled. At least the
/// prompt's last token is always computed (its logits give the first new token), so a
/// match is capped at the whole pages before it. A prompt's pages enter the cache in
/// complete_step() of the step that finishes its prefill; a request admitted in that
/// same step cannot see them yet. A finished request inserts its prompt and generated
/// tokens and drops its own references. Since only whole pages are cached, appends to
/// a request never write into a shared page; PagedSequences' copy-on-write would still
/// catch it, and StepBatch::page_copies carries any copy it asks for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "09_engine/arrival_schedule.hpp"
#include "flashstep/reference/page_allocator.hpp"
#include "flashstep/reference/radix_cache.hpp"

namespace flashstep::stages::engine {

/// The limits a Scheduler works within.
struct SchedulerConfig {
  int64_t num_pages = 64;             ///< pages in the KV pool, >= 1
  int64_t page_size = 16;             ///< token slots per page, >= 1
  int64_t max_tokens_per_step = 256;  ///< query tokens per step (decodes + prefill chunks), >= max_running
  int64_t max_running = 32;           ///< requests admitted and not finished at once, >= 1
  bool prefix_sharing = true;         ///< reuse cached prefixes through the radix cache
  int32_t end_token = -1;             ///< a sampled token that finishes its request; -1: none
};

/// Where a request is in its life.
enum class Phase { not_arrived, waiting, prefill, decode, finished };

/// Phase's name ("waiting", "prefill", ...).
const char* phase_name(Phase phase);

/// A request's progress, for tests, printers and the engine.
struct RequestState {
  Phase phase = Phase::not_arrived;
  int64_t admitted_step = -1;      ///< step of admission, -1 before
  int64_t finished_step = -1;      ///< step whose complete_step finished it, -1 before
  int32_t sequence = -1;           ///< its PagedSequences id while admitted, else -1
  int64_t cached_tokens = 0;       ///< prompt tokens reused from the radix cache
  int64_t prefilled = 0;           ///< prompt tokens in the KV (cached ones included)
  std::vector<int32_t> generated;  ///< sampled tokens so far
  int64_t reserved_pages = 0;      ///< fresh pages it may still allocate (its reservation)
};

/// The metadata of one engine step, in the arrays FlashInfer's plan() and run() take.
///
/// `batch = num_decodes + num_prefills` requests, `nnz = qo_indptr[batch]` new tokens.
/// The page table describes every request *after* this step's tokens are appended (the
/// K/V of the new tokens are written first, then attention reads them: FlashInfer's
/// append_paged_kv_cache followed by the attention call).
struct StepBatch {
  int64_t step = 0;                        ///< engine step number, from 0
  int32_t num_decodes = 0;                 ///< batch rows 0 .. num_decodes-1: one query each
  int32_t num_prefills = 0;                ///< the following rows: prefill chunks
  std::vector<int32_t> request_ids;        ///< (batch) request of each row (its index in the workload)
  std::vector<int32_t> qo_indptr;          ///< (batch + 1) new tokens of row i: qo_indptr[i] .. qo_indptr[i+1]
  std::vector<int32_t> kv_indptr;          ///< (batch + 1) pages of row i: kv_indices[kv_indptr[i] .. kv_indptr[i+1]]
  std::vector<int32_t> kv_indices;         ///< (kv_indptr[batch]) page ids
  std::vector<int32_t> kv_last_page_len;   ///< (batch) 1 .. page_size
  std::vector<int32_t> kv_lens;            ///< (batch) KV length of each row after the append
  std::vector<int32_t> cached_tokens;      ///< (batch) prompt tokens of the row reused from the cache
  std::vector<int32_t> tokens;             ///< (nnz) input token ids
  std::vector<int32_t> batch_indices;      ///< (nnz) row of each new token
  std::vector<int32_t> positions;          ///< (nnz) index of each new token in its request's sequence
  std::vector<int32_t> append_pages;       ///< (nnz) page the token's K/V is written to
  std::vector<int32_t> append_slots;       ///< (nnz) slot in that page, 0 .. page_size-1
  std::vector<ref::PageCopy> page_copies;  ///< copy-on-write copies to run before the append
  std::vector<int32_t> sample_rows;        ///< rows that sample a token this step, ascending
  std::vector<int32_t> sample_token_rows;  ///< (sample_rows) the token whose logits sample: qo_indptr[row+1]-1
  std::vector<int32_t> admitted;           ///< requests admitted in this step
  std::vector<int32_t> waiting;            ///< requests arrived and not admitted, after admission

  /// Rows in the batch.
  int32_t batch_size() const { return static_cast<int32_t>(request_ids.size()); }
  /// New tokens in the batch.
  int32_t nnz() const { return qo_indptr.empty() ? 0 : qo_indptr.back(); }
  /// The step in words and arrays: a table of rows, then every array (for the chapter).
  std::string describe() const;
};

/// Continuous batching over a PageAllocator, PagedSequences and RadixCache of its own.
///
/// Call next_step() and complete_step() alternately until done(). The Scheduler has no
/// model: the caller (the engine, a test) computes the step and passes back the tokens
/// it sampled.
class Scheduler {
 public:
  /// A scheduler for `requests` (arrival_step never decreasing). Throws
  /// ref::InvalidArgument naming a bad configuration or request: an empty prompt, a
  /// prompt longer than the whole pool, a request whose prompt and new tokens need more
  /// pages than the pool has, a pool too small to admit any request, a non-positive
  /// budget, page size or pool, a negative token id.
  Scheduler(const SchedulerConfig& config, std::vector<Request> requests);
  /// The same over a drawn schedule.
  Scheduler(const SchedulerConfig& config, const ArrivalSchedule& schedule);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Admits, schedules and appends the next step; returns its metadata. The batch may be
  /// empty (no request has arrived yet, or every one waits). Throws std::logic_error if
  /// the previous step was not completed or if done().
  StepBatch next_step();
  /// Ends the step: `sampled` holds one token per entry of the step's sample_rows, in
  /// that order. Requests reaching max_new_tokens (or sampling end_token) finish and
  /// release their pages. Throws InvalidArgument for a wrong count or a negative token.
  void complete_step(const std::vector<int32_t>& sampled);
  /// Whether every request has finished.
  bool done() const;
  /// Steps begun so far.
  int64_t steps() const { return step_; }

  /// Drops every page the radix cache holds that no request holds (end of a run): after
  /// done() and this, every page is back in the free list.
  void release_cache();

  const SchedulerConfig& config() const { return config_; }
  const std::vector<Request>& requests() const { return requests_; }
  const RequestState& state(int32_t request) const;
  const ref::PageAllocator& allocator() const { return *allocator_; }
  const ref::PagedSequences& sequences() const { return *sequences_; }
  const ref::RadixCache& cache() const { return *cache_; }
  /// Pages a request needs over its whole life with nothing cached:
  /// ceil((prompt + max_new_tokens - 1) / page_size).
  int64_t lifetime_pages(int32_t request) const;
  /// Most pages in use at once so far (after any step).
  int64_t peak_used_pages() const { return peak_used_; }
  /// Fresh pages allocated so far (pages reused from the cache not counted).
  int64_t pages_allocated() const { return pages_allocated_; }

 private:
  bool try_admit(int32_t r);
  int64_t reserved_total() const;

  SchedulerConfig config_;
  std::vector<Request> requests_;
  std::vector<RequestState> states_;
  std::unique_ptr<ref::PageAllocator> allocator_;
  std::unique_ptr<ref::PagedSequences> sequences_;
  std::unique_ptr<ref::RadixCache> cache_;
  std::vector<int32_t> lock_node_;  // per request: the radix node locked at admission, -1 none
  std::vector<int32_t> running_;    // admitted, not finished, in admission order
  std::vector<int32_t> waiting_;    // arrived, not admitted, in arrival order
  int32_t next_arrival_ = 0;
  int64_t step_ = 0;
  bool in_step_ = false;
  StepBatch last_;
  int64_t peak_used_ = 0;
  int64_t pages_allocated_ = 0;
};

}  // namespace flashstep::stages::engine
