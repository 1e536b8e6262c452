// The batch every view describes (prompts -> word tokens -> ids), the check ledger, and
// the first view: tokens packed as a ragged tensor.
#include "story.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include <flashstep/reference/errors.hpp>

#include "text_table.hpp"

namespace flashstep::cli {

void Ledger::expect(bool ok, const std::string& what) {
  ++checks_;
  if (!ok) {
    ++failures_;
    os_ << "  !! MISMATCH: " << what << "\n";
  }
}

void Ledger::skipped(const std::string& what) { skips_.push_back(what); }

int64_t Scenario::total_tokens() const {
  int64_t n = 0;
  for (const auto& t : tokens) n += static_cast<int64_t>(t.size());
  return n;
}

namespace {

// Views draw one row per query token; past this the tables stop being readable.
constexpr int64_t kMaxDrawnTokens = 96;
// A token or a prompt wider than this is shown cut, with its length.
constexpr size_t kMaxTokenColumns = 24;

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace

Scenario make_scenario(const std::vector<std::string>& prompts, int page_size, int br, uint64_t seed) {
  const char* fn = "flashstep";
  ref::require(!prompts.empty(), fn, "--prompt: give at least one prompt");
  ref::require(prompts.size() <= 26, fn,
               "--prompt: at most 26 prompts (requests are named A..Z), got " + std::to_string(prompts.size()));
  ref::require(page_size >= 1, fn, "--page-size must be >= 1, got " + std::to_string(page_size));
  ref::require(br >= 1, fn, "--br must be >= 1, got " + std::to_string(br));
  Scenario s;
  s.page_size = page_size;
  s.br = br;
  s.seed = seed;
  std::map<std::string, int32_t> ids;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const auto words = split_words(prompts[r]);
    ref::require(!words.empty(), fn, "--prompt #" + std::to_string(r + 1) + " is empty (a request needs a token)");
    std::vector<int32_t> toks;
    for (const auto& w : words) {
      auto it = ids.find(w);
      if (it == ids.end()) {
        it = ids.emplace(w, static_cast<int32_t>(s.vocab.size())).first;
        s.vocab.push_back(display_text(w, kMaxTokenColumns));
      }
      toks.push_back(it->second);
    }
    s.prompts.push_back(prompts[r]);
    s.names.push_back(std::string(1, static_cast<char>('A' + r)));
    s.tokens.push_back(std::move(toks));
  }
  ref::require(
      s.total_tokens() <= kMaxDrawnTokens, fn,
      "--prompt: the prompts have " + std::to_string(s.total_tokens()) +
          " tokens together; the views draw one row per token, so keep it <= " + std::to_string(kMaxDrawnTokens));
  return s;
}

Scenario example_scenario(uint64_t seed) { return make_scenario({"The cat sat", "The cat ran fast"}, 1, 3, seed); }

void heading(std::ostream& os, int number, const std::string& title) {
  // Each section starts from the stream's default number format, so that a value reads
  // the same whichever sections ran before it (tour or explain).
  os.unsetf(std::ios::floatfield);
  os.precision(6);
  os << "\n== " << number << ". " << title << " ==\n\n";
}

void show_tokens(const Scenario& s, std::ostream& os, Ledger& ledger) {
  os << "A prompt becomes tokens (here one word = one token; real tokenizers differ),\n"
        "each token an id in the vocabulary and, inside the model, a row of d_model numbers.\n\n";
  TextTable t({"request", "prompt", "tokens", "ids"});
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    std::string words = "[", ids = "[";
    for (size_t j = 0; j < s.tokens[r].size(); ++j) {
      words += (j ? ", " : "") + s.vocab[static_cast<size_t>(s.tokens[r][j])];
      ids += (j ? ", " : "") + std::to_string(s.tokens[r][j]);
    }
    t.add({s.names[r], "\"" + display_text(s.prompts[r], kMaxPromptColumns) + "\"", words + "]", ids + "]"});
  }
  t.print(os, "  ");

  // The ragged tensor: all query rows packed back to back, qo_indptr marking requests.
  std::vector<int32_t> qo_indptr{0};
  size_t longest = 0;
  for (const auto& toks : s.tokens) {
    qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(toks.size()));
    longest = std::max(longest, toks.size());
  }
  const int64_t padded = static_cast<int64_t>(longest * s.tokens.size());
  os << "\nA batch packs every request's query rows back to back, without padding (a ragged\n"
        "tensor); qo_indptr says where each request starts and ends:\n";
  os << "  qo_indptr = " << format_list(qo_indptr) << "\n";
  for (size_t r = 0; r < s.tokens.size(); ++r)
    os << "  request " << s.names[r] << " = rows " << qo_indptr[r] << ".." << qo_indptr[r + 1] - 1 << "\n";
  os << "  packed rows: " << qo_indptr.back() << "; padded to the longest request: " << s.tokens.size() << " x "
     << longest << " = " << count_of(padded, "row") << " (" << padded - qo_indptr.back() << " wasted)\n";
  ledger.expect(qo_indptr.back() == s.total_tokens(), "qo_indptr ends at the token count");
}

}  // namespace flashstep::cli
