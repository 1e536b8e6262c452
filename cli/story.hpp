// The views that `flashstep tour` and `flashstep explain` print: one function per
// section of the course's story, each computed by the reference and each checking what
// it can (the checks feed the command's PASS/FAIL line).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <flashstep/reference/attention.hpp>

namespace flashstep::cli {

/// Collects the checks a command makes while it prints, for its final PASS/FAIL line.
class Ledger {
 public:
  /// \param os where a failed check is reported, as it happens
  explicit Ledger(std::ostream& os) : os_(os) {}
  /// Records one check; prints "!! MISMATCH: <what>" when `ok` is false.
  void expect(bool ok, const std::string& what);
  /// Records a part that could not run (not built, not present); it is not a failure.
  void skipped(const std::string& what);
  int failures() const { return failures_; }  ///< checks that failed
  int checks() const { return checks_; }      ///< checks made
  /// Parts that were skipped, in order.
  const std::vector<std::string>& skips() const { return skips_; }

 private:
  std::ostream& os_;
  int failures_ = 0;
  int checks_ = 0;
  std::vector<std::string> skips_;
};

/// The batch the views describe: prompts, their tokens, and the block sizes.
struct Scenario {
  std::vector<std::string> prompts;          ///< as given, one per request
  std::vector<std::string> names;            ///< request names: "A", "B", ...
  std::vector<std::vector<int32_t>> tokens;  ///< token ids of each request
  std::vector<std::string> vocab;            ///< token id -> its text, as shown (display_text)
  int page_size = 1;                         ///< tokens per KV page (= Bc)
  int br = 3;                                ///< the larger query tile to show (Br)
  uint64_t seed = 0;                         ///< seed of any random values shown
  int64_t total_tokens() const;              ///< sum of the requests' token counts
};

/// The scenario's batch on a paged KV cache, as an engine would hold it after admitting
/// the requests in order through the radix cache (shared prefixes on shared pages).
struct PagedBatch {
  ref::PagedKVCache cache;               ///< pool (num_pages, 2, page_size, 1, 2) NHD + CSR table
  ref::Tensor q;                         ///< (nnz_qo, 1, 2): one query per token (prefill)
  std::vector<int32_t> qo_indptr;        ///< (batch + 1)
  std::vector<std::string> page_labels;  ///< (num_pages) the tokens each page holds
  ref::AttentionOptions opt;             ///< causal, sm_scale 1 (the course's convention)
};

/// The course's K and V (d_model 2) of one of its words ("The", "cat", "sat", "ran",
/// "fast"); false for any other word.
bool example_kv(const std::string& word, double k[2], double v[2]);

/// Builds the PagedBatch of `s` with pages of `page_size` tokens. K, V and Q have d = 2:
/// for the course's words the course's own vectors (Q of a token = its K, as in the
/// worked example), for other words values drawn from `s.seed`, one per (word, position)
/// so that a shared prefix holds the same K/V whoever wrote it.
PagedBatch make_paged_batch(const Scenario& s, int page_size);

/// Tokenizes each prompt into words (whitespace-separated; tokenization is
/// implementation-specific and words read best) and numbers the distinct words in order
/// of first appearance. Throws ref::InvalidArgument naming the option for an empty
/// prompt, more than 26 prompts, a page size or Br below 1, or too many tokens to draw.
Scenario make_scenario(const std::vector<std::string>& prompts, int page_size, int br, uint64_t seed);

/// The worked example: "The cat sat" and "The cat ran fast", page size 1, Br = 3.
Scenario example_scenario(uint64_t seed);

/// Section "tokens": word tokens, ids, the ragged packing (qo_indptr) against padding.
void show_tokens(const Scenario& s, std::ostream& os, Ledger& ledger);
/// Section "radix": the radix tree of the prompts' token sequences.
void show_radix(const Scenario& s, std::ostream& os, Ledger& ledger);
/// Section "pages": page tables from the page allocator, shared prefix pages, memory.
void show_pages(const Scenario& s, std::ostream& os, Ledger& ledger);
/// Section "block-sparse": the BSR matrix for Br=1/Bc=page_size and for the larger Br.
void show_block_sparse(const Scenario& s, std::ostream& os, Ledger& ledger);
/// Section "cascade": the levels of cascade attention and the exact merge, checked.
void show_cascade(const Scenario& s, std::ostream& os, Ledger& ledger);
/// Section "attention": the course's numbers for row "A, pos 2" (worked-example scenario only).
void show_worked_attention(std::ostream& os, Ledger& ledger);
/// Section "decoder": the tiny decoder generating with a KV cache and shared prefixes.
void show_decoder(const Scenario& s, std::ostream& os, Ledger& ledger);

/// max |a - b| (ref::max_abs_diff: NaN or a shape mismatch is +inf).
using ref::max_abs_diff;

/// A prompt wider than this many terminal columns is shown cut (display_text).
constexpr size_t kMaxPromptColumns = 40;

/// Prints a section heading: "== <number>. <title> ==".
void heading(std::ostream& os, int number, const std::string& title);

}  // namespace flashstep::cli
