// Section "decoder": the reference's tiny decoder (random weights, byte tokens) generating
// after the prompts three ways: recomputing everything, with a contiguous KV cache, and
// as one batch on the paged cache with prefixes shared through the radix cache. The
// tokens must agree; the memory and the work differ, and that is the point.
#include <cstdio>

#include <flashstep/reference/tiny_decoder.hpp>

#include "story.hpp"
#include "text_table.hpp"

namespace flashstep::cli {

namespace {

// The decoder's own page size: its tokens are bytes, so a page holds a few characters.
constexpr int64_t kDecoderPageSize = 4;
constexpr int64_t kNewTokens = 8;

// Random weights generate arbitrary bytes: show printable ASCII, escape the rest.
std::string printable(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string bytes_text(int64_t bytes) { return std::to_string(bytes) + " B"; }

}  // namespace

void show_decoder(const Scenario& s, std::ostream& os, Ledger& ledger) {
  // The decoder reads bytes, and its recompute run redoes the whole prompt for every new
  // token: past this many bytes a prompt takes it minutes, so the view says so instead.
  constexpr size_t kMaxPromptBytes = 512;
  for (size_t r = 0; r < s.prompts.size(); ++r) {
    if (s.prompts[r].size() > kMaxPromptBytes) {
      os << "Skipped: prompt " << s.names[r] << " is " << s.prompts[r].size()
         << " bytes; the tiny decoder reads bytes and this view runs it on prompts of up to " << kMaxPromptBytes
         << ".\n";
      ledger.skipped("decoder (prompt " + s.names[r] + " longer than " + std::to_string(kMaxPromptBytes) + " bytes)");
      return;
    }
  }
  const ref::TinyDecoderDemo demo = ref::tiny_decoder_demo(s.prompts, kNewTokens, kDecoderPageSize);
  const auto& cfg = demo.config;
  os << "A decoder built as the course describes, with random weights (seed " << cfg.weight_seed
     << "):\nbyte tokens (vocabulary " << cfg.vocab_size << "), d_model " << cfg.d_model << ", " << cfg.num_layers
     << " layers of attention (" << cfg.num_qo_heads << " query / " << cfg.num_kv_heads
     << " KV heads) with a residual,\nthen W_vocab. Its weights are random, so "
     << "the text is noise; what matters is that it is the same\nnoise every way. It generates " << kNewTokens
     << " tokens after each prompt, greedily (T -> 0), three ways:\n\n";

  TextTable t({"mode", "request", "generated (after the prompt)", "rows computed", "K/V kept"});
  const auto& reference_run = demo.runs.front();
  bool agree = true;
  for (const auto& run : demo.runs) {
    for (size_t r = 0; r < run.requests.size(); ++r) {
      t.add({r == 0 ? ref::to_string(run.mode) : "", s.names[r],
             "\"" + printable(run.requests[r].generated_text) + "\"",
             r == 0 ? std::to_string(run.memory.query_rows_computed) : "",
             r == 0 ? bytes_text(run.memory.kv_bytes_kept) : ""});
      agree &= run.requests[r].generated_tokens == reference_run.requests[r].generated_tokens;
    }
  }
  t.print(os, "  ");
  os << "  (rows computed: (token, layer) rows pushed through attention, the work; K/V kept:\n"
        "   at fp16, over all layers, at the end of the run)\n";
  ledger.expect(agree, "the three ways generate the same tokens");
  ledger.expect(demo.tokens_agree, "the decoder reports that its three runs agree");

  const ref::GenerationMemory& mem = demo.runs.back().memory;
  os << "\nThe paged run, in pages of " << mem.page_size << " bytes:\n"
     << "  pages used " << mem.pages_used << " (" << mem.shared_pages << " shared by several requests)\n"
     << "  contiguous preallocation of prompt + " << kNewTokens
     << " new tokens per request: " << mem.contiguous_pages_equivalent << " pages' worth, "
     << mem.contiguous_preallocated_bytes << " B\n"
     << "  prompt tokens whose K/V came from the radix cache instead of being computed: " << mem.prefix_tokens_reused
     << "\n"
     << "  K/V per token: " << mem.kv_bytes_per_token << " B (K and V, " << cfg.num_kv_heads << " heads x "
     << cfg.d_model / cfg.num_qo_heads << " dims x " << cfg.num_layers << " layers, fp16)\n";

  // With a temperature the decoder samples, reproducibly for a given seed.
  ref::GenerationOptions sampled;
  sampled.max_new_tokens = kNewTokens;
  sampled.temperature = 0.8;
  sampled.seed = s.seed;
  sampled.page_size = kDecoderPageSize;
  const ref::TinyDecoder model(cfg);
  const auto first = ref::generate(model, s.prompts, ref::GenerationMode::paged_kv_cache, sampled);
  const auto again = ref::generate(model, s.prompts, ref::GenerationMode::paged_kv_cache, sampled);
  os << "\nSampling at temperature " << sampled.temperature << " (seed " << s.seed << "):\n";
  bool same = true;
  for (size_t r = 0; r < first.requests.size(); ++r) {
    os << "  " << s.names[r] << ": \"" << printable(first.requests[r].generated_text) << "\"\n";
    same &= first.requests[r].generated_tokens == again.requests[r].generated_tokens;
  }
  ledger.expect(same, "sampling with the same seed gives the same tokens");
}

}  // namespace flashstep::cli
