#include "09_engine/scheduler.hpp"

#include <algorithm>
#include <climits>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::engine {

using ref::require;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string join(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s + "]";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::not_arrived: return "not arrived";
    case Phase::waiting: return "waiting";
    case Phase::prefill: return "prefill";
    case Phase::decode: return "decode";
    case Phase::finished: return "finished";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerConfig& config, const ArrivalSchedule& schedule)
    : Scheduler(config, schedule.requests()) {}

Scheduler::Scheduler(const SchedulerConfig& config, std::vector<Request> requests)
    : config_(config), requests_(std::move(requests)) {
  const char* fn = "Scheduler";
  const SchedulerConfig& c = config_;
  require(c.num_pages >= 1, fn, "num_pages must be >= 1 (got " + str(c.num_pages) + ")");
  require(c.page_size >= 1, fn, "page_size must be >= 1 (got " + str(c.page_size) + ")");
  require(c.num_pages <= INT32_MAX / c.page_size, fn,
          "num_pages * page_size must fit int32, the type of a KV length (got " + str(c.num_pages) + " * " +
              str(c.page_size) + ")");
  require(c.max_running >= 1, fn, "max_running must be >= 1 (got " + str(c.max_running) + ")");
  require(c.max_tokens_per_step >= 1, fn, "max_tokens_per_step must be >= 1 (got " + str(c.max_tokens_per_step) + ")");
  require(c.max_tokens_per_step >= c.max_running, fn,
          "max_tokens_per_step must be >= max_running, so that every running request's decode "
          "token fits a step (got " +
              str(c.max_tokens_per_step) + " < " + str(c.max_running) + ")");
  require(c.end_token >= -1, fn, "end_token must be a token id or -1 for none (got " + str(c.end_token) + ")");
  require(!requests_.empty(), fn, "requests must not be empty");
  const int64_t slots = c.num_pages * c.page_size;
  int64_t smallest = INT64_MAX;
  for (size_t i = 0; i < requests_.size(); ++i) {
    const Request& r = requests_[i];
    const std::string name = "request " + str(static_cast<int64_t>(i)) + ": ";
    require(!r.prompt.empty(), fn, name + "prompt is empty (a request needs at least one token)");
    for (size_t t = 0; t < r.prompt.size(); ++t)
      ref::require_lazy(r.prompt[t] >= 0, fn, [&] {
        return name + "prompt[" + str(static_cast<int64_t>(t)) + "] is a negative token id (" + str(r.prompt[t]) + ")";
      });
    require(r.max_new_tokens >= 1, fn, name + "max_new_tokens must be >= 1 (got " + str(r.max_new_tokens) + ")");
    require(r.arrival_step >= 0, fn, name + "arrival_step must be >= 0 (got " + str(r.arrival_step) + ")");
    require(i == 0 || r.arrival_step >= requests_[i - 1].arrival_step, fn,
            name + "arrival_step " + str(r.arrival_step) + " is before the previous request's (" +
                str(requests_[i - 1].arrival_step) + "): requests must be in arrival order");
    require(static_cast<int64_t>(r.prompt.size()) <= slots, fn,
            name + "prompt of " + str(static_cast<int64_t>(r.prompt.size())) +
                " tokens is longer than the whole pool (num_pages * page_size = " + str(slots) + " slots)");
    require(r.max_new_tokens <= INT32_MAX, fn, name + "max_new_tokens must fit int32");
    smallest = std::min(smallest, lifetime_pages(static_cast<int32_t>(i)));
  }
  require(smallest <= c.num_pages, fn,
          "num_pages " + str(c.num_pages) + " is too small to admit any request: the smallest needs " + str(smallest) +
              " pages (prompt + max_new_tokens - 1 tokens)");
  for (size_t i = 0; i < requests_.size(); ++i) {
    const int64_t need = lifetime_pages(static_cast<int32_t>(i));
    require(need <= c.num_pages, fn,
            "request " + str(static_cast<int64_t>(i)) + ": prompt (" +
                str(static_cast<int64_t>(requests_[i].prompt.size())) + " tokens) + max_new_tokens (" +
                str(requests_[i].max_new_tokens) + ") needs " + str(need) + " pages, more than the pool's " +
                str(c.num_pages) + "; it could never be admitted");
  }
  states_.resize(requests_.size());
  lock_node_.assign(requests_.size(), -1);
  allocator_ = std::make_unique<ref::PageAllocator>(c.num_pages, c.page_size);
  sequences_ = std::make_unique<ref::PagedSequences>(*allocator_);
  cache_ = std::make_unique<ref::RadixCache>(*allocator_);
}

// Members are destroyed in reverse order: the cache and the sequences drop their
// references before the allocator goes.
Scheduler::~Scheduler() = default;

int64_t Scheduler::lifetime_pages(int32_t request) const {
  const Request& r = requests_.at(static_cast<size_t>(request));
  return ceil_div(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens - 1, config_.page_size);
}

const RequestState& Scheduler::state(int32_t request) const {
  require(request >= 0 && request < static_cast<int32_t>(states_.size()), "Scheduler::state",
          "request must be in [0, " + str(static_cast<int64_t>(states_.size())) + ") (got " + str(request) + ")");
  return states_[static_cast<size_t>(request)];
}

bool Scheduler::done() const {
  return std::all_of(states_.begin(), states_.end(), [](const RequestState& s) { return s.phase == Phase::finished; });
}

int64_t Scheduler::reserved_total() const {
  int64_t total = 0;
  for (int32_t r : running_) total += states_[static_cast<size_t>(r)].reserved_pages;
  return total;
}

bool Scheduler::try_admit(int32_t r) {
  const Request& req = requests_[static_cast<size_t>(r)];
  const int64_t ps = config_.page_size;
  const int64_t prompt_len = static_cast<int64_t>(req.prompt.size());
  ref::RadixMatch match;
  int32_t node = -1;
  if (config_.prefix_sharing) {
    // The prompt's last token is always computed: match only the whole pages before it.
    const int64_t limit = (prompt_len - 1) / ps * ps;
    match = cache_->match_prefix(std::vector<int32_t>(req.prompt.begin(), req.prompt.begin() + limit));
    node = match.last_node;
    cache_->lock(node);  // the matched pages must not be evicted to make room for this request
  }
  const int64_t need = lifetime_pages(r) - match.length / ps;
  auto room = [&] { return allocator_->num_free_pages() - reserved_total(); };
  while (room() < need && cache_->evictable_pages() > 0) cache_->evict(need - room());
  if (room() < need) {
    if (node >= 0) cache_->unlock(node);
    return false;
  }
  RequestState& s = states_[static_cast<size_t>(r)];
  s.sequence = sequences_->add_sequence(match.pages, match.length);
  s.phase = Phase::prefill;
  s.admitted_step = step_;
  s.cached_tokens = match.length;
  s.prefilled = match.length;
  s.reserved_pages = need;
  lock_node_[static_cast<size_t>(r)] = node;
  return true;
}

StepBatch Scheduler::next_step() {
  if (in_step_)
    throw std::logic_error("Scheduler::next_step: the previous step was not completed (call complete_step)");
  if (done()) throw std::logic_error("Scheduler::next_step: every request has finished");
  StepBatch b;
  b.step = step_;
  while (next_arrival_ < static_cast<int32_t>(requests_.size()) &&
         requests_[static_cast<size_t>(next_arrival_)].arrival_step <= step_) {
    states_[static_cast<size_t>(next_arrival_)].phase = Phase::waiting;
    waiting_.push_back(next_arrival_++);
  }

  struct Row {
    int32_t request;
    int64_t n;
  };
  std::vector<Row> decodes, prefills;
  int64_t budget = config_.max_tokens_per_step;
  for (int32_t r : running_) {
    if (states_[static_cast<size_t>(r)].phase == Phase::decode) {
      decodes.push_back({r, 1});
      --budget;
    }
  }
  auto chunk = [&](int32_t r) {
    const RequestState& s = states_[static_cast<size_t>(r)];
    const int64_t n = std::min<int64_t>(
        static_cast<int64_t>(requests_[static_cast<size_t>(r)].prompt.size()) - s.prefilled, budget);
    prefills.push_back({r, n});
    budget -= n;
  };
  for (int32_t r : running_)
    if (budget > 0 && states_[static_cast<size_t>(r)].phase == Phase::prefill) chunk(r);
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_running) {
    const int32_t r = waiting_.front();
    if (!try_admit(r)) break;  // first come first served: the ones behind it wait too
    waiting_.erase(waiting_.begin());
    running_.push_back(r);
    b.admitted.push_back(r);
    chunk(r);
  }
  b.waiting = waiting_;
  b.num_decodes = static_cast<int32_t>(decodes.size());
  b.num_prefills = static_cast<int32_t>(prefills.size());

  std::vector<Row> rows = decodes;
  rows.insert(rows.end(), prefills.begin(), prefills.end());
  std::vector<int32_t> seqs;
  b.qo_indptr.push_back(0);
  const int64_t ps = config_.page_size;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t r = rows[i].request;
    const Request& req = requests_[static_cast<size_t>(r)];
    RequestState& s = states_[static_cast<size_t>(r)];
    const bool decode = i < decodes.size();
    const int64_t old_len = sequences_->seq_len(s.sequence);
    const ref::AppendResult appended = sequences_->append_tokens(s.sequence, rows[i].n);
    pages_allocated_ += static_cast<int64_t>(appended.new_pages.size());
    s.reserved_pages -= static_cast<int64_t>(appended.new_pages.size());
    b.page_copies.insert(b.page_copies.end(), appended.copies.begin(), appended.copies.end());
    const std::vector<int32_t>& pages = sequences_->pages(s.sequence);
    for (int64_t t = 0; t < rows[i].n; ++t) {
      const int64_t pos = old_len + t;
      b.tokens.push_back(decode ? s.generated.back() : req.prompt[static_cast<size_t>(s.prefilled + t)]);
      b.batch_indices.push_back(static_cast<int32_t>(i));
      b.positions.push_back(static_cast<int32_t>(pos));
      b.append_pages.push_back(pages[static_cast<size_t>(pos / ps)]);
      b.append_slots.push_back(static_cast<int32_t>(pos % ps));
    }
    if (!decode) s.prefilled += rows[i].n;
    b.request_ids.push_back(r);
    b.qo_indptr.push_back(b.qo_indptr.back() + static_cast<int32_t>(rows[i].n));
    b.kv_lens.push_back(static_cast<int32_t>(sequences_->seq_len(s.sequence)));
    b.cached_tokens.push_back(static_cast<int32_t>(s.cached_tokens));
    if (decode || s.prefilled == static_cast<int64_t>(req.prompt.size())) {
      b.sample_rows.push_back(static_cast<int32_t>(i));
      b.sample_token_rows.push_back(b.qo_indptr.back() - 1);
    }
    seqs.push_back(s.sequence);
  }
  ref::PageTable table = sequences_->page_table(seqs);
  b.kv_indptr = std::move(table.kv_indptr);
  b.kv_indices = std::move(table.kv_indices);
  b.kv_last_page_len = std::move(table.kv_last_page_len);

  peak_used_ = std::max(peak_used_, allocator_->num_used_pages());
  ++step_;
  in_step_ = true;
  last_ = b;
  return b;
}

void Scheduler::complete_step(const std::vector<int32_t>& sampled) {
  if (!in_step_) throw std::logic_error("Scheduler::complete_step: no step in progress (call next_step first)");
  const char* fn = "Scheduler::complete_step";
  require(sampled.size() == last_.sample_rows.size(), fn,
          "sampled must hold one token per sample row of the step (" +
              str(static_cast<int64_t>(last_.sample_rows.size())) + "), got " +
              str(static_cast<int64_t>(sampled.size())));
  for (size_t k = 0; k < sampled.size(); ++k)
    require(sampled[k] >= 0, fn,
            "sampled[" + str(static_cast<int64_t>(k)) + "] is a negative token id (" + str(sampled[k]) + ")");
  const int64_t ps = config_.page_size;
  for (size_t k = 0; k < sampled.size(); ++k) {
    const int32_t r = last_.request_ids[static_cast<size_t>(last_.sample_rows[k])];
    const Request& req = requests_[static_cast<size_t>(r)];
    RequestState& s = states_[static_cast<size_t>(r)];
    s.generated.push_back(sampled[k]);
    const std::vector<int32_t>& pages = sequences_->pages(s.sequence);
    if (s.phase == Phase::prefill) {
      s.phase = Phase::decode;
      if (config_.prefix_sharing) {  // the prompt's whole pages now hold K/V: cache them
        const auto prompt_pages = static_cast<size_t>(ceil_div(static_cast<int64_t>(req.prompt.size()), ps));
        cache_->insert(req.prompt, std::vector<int32_t>(pages.begin(), pages.begin() + prompt_pages));
      }
    }
    const bool finished = static_cast<int64_t>(s.generated.size()) == req.max_new_tokens ||
                          (config_.end_token >= 0 && sampled[k] == config_.end_token);
    if (!finished) continue;
    if (config_.prefix_sharing) {
      // The tokens whose K/V are in the pages: the prompt and every generated token but
      // the last (which was sampled, never fed back).
      std::vector<int32_t> kv_tokens = req.prompt;
      kv_tokens.insert(kv_tokens.end(), s.generated.begin(), s.generated.end() - 1);
      cache_->insert(kv_tokens, pages);
    }
    if (lock_node_[static_cast<size_t>(r)] >= 0) cache_->unlock(lock_node_[static_cast<size_t>(r)]);
    lock_node_[static_cast<size_t>(r)] = -1;
    sequences_->free_sequence(s.sequence);
    s.sequence = -1;
    s.reserved_pages = 0;
    s.phase = Phase::finished;
    s.finished_step = last_.step;
    running_.erase(std::find(running_.begin(), running_.end(), r));
  }
  in_step_ = false;
}

void Scheduler::release_cache() {
  if (in_step_) throw std::logic_error("Scheduler::release_cache: a step is in progress");
  cache_->evict(cache_->cached_pages());
}

std::string StepBatch::describe() const {
  std::ostringstream os;
  os << "step " << step << ": " << num_decodes << " decode" << (num_decodes == 1 ? "" : "s") << " + " << num_prefills
     << " prefill chunk" << (num_prefills == 1 ? "" : "s") << ", " << nnz() << " new token" << (nnz() == 1 ? "" : "s");
  if (!admitted.empty()) {
    os << "; admitted";
    for (int32_t r : admitted) os << " r" << r;
  }
  if (!waiting.empty()) {
    os << "; waiting";
    for (int32_t r : waiting) os << " r" << r;
  }
  os << "\n";
  if (batch_size() > 0) {
    os << std::left << std::setw(5) << "row" << std::setw(9) << "request" << std::setw(9) << "kind" << std::setw(12)
       << "positions" << std::setw(8) << "kv_len" << std::setw(8) << "cached" << std::setw(20) << "pages"
       << std::setw(15) << "last_page_len"
       << "samples\n";
    for (int32_t i = 0; i < batch_size(); ++i) {
      const int32_t q0 = qo_indptr[i], q1 = qo_indptr[i + 1];
      const std::string span = q1 - q0 == 1 ? std::to_string(positions[q0])
                                            : std::to_string(positions[q0]) + ".." + std::to_string(positions[q1 - 1]);
      const std::vector<int32_t> pages(kv_indices.begin() + kv_indptr[i], kv_indices.begin() + kv_indptr[i + 1]);
      const bool samples = std::find(sample_rows.begin(), sample_rows.end(), i) != sample_rows.end();
      os << std::setw(5) << i << std::setw(9) << ("r" + std::to_string(request_ids[i])) << std::setw(9)
         << (i < num_decodes ? "decode" : "prefill") << std::setw(12) << span << std::setw(8) << kv_lens[i]
         << std::setw(8) << cached_tokens[i] << std::setw(20) << join(pages) << std::setw(15) << kv_last_page_len[i]
         << (samples ? "yes" : "no") << "\n";
    }
  }
  std::string append = "[";
  for (size_t t = 0; t < append_pages.size(); ++t)
    append += (t ? " " : "") + std::to_string(append_pages[t]) + ":" + std::to_string(append_slots[t]);
  append += "]";
  std::string copies = page_copies.empty() ? "none" : "";
  for (const ref::PageCopy& c : page_copies) copies += std::to_string(c.src) + "->" + std::to_string(c.dst) + " ";
  os << "qo_indptr          " << join(qo_indptr) << "\n"
     << "kv_indptr          " << join(kv_indptr) << "\n"
     << "kv_indices         " << join(kv_indices) << "\n"
     << "kv_last_page_len   " << join(kv_last_page_len) << "\n"
     << "tokens             " << join(tokens) << "\n"
     << "positions          " << join(positions) << "\n"
     << "append page:slot   " << append << "\n"
     << "sample_token_rows  " << join(sample_token_rows) << "\n"
     << "page copies        " << copies << "\n";
  return os.str();
}

}  // namespace flashstep::stages::engine
