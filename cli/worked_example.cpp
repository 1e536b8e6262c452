// Section "attention" of the tour: the worked example of
// docs/concepts/01_sequence_and_attention.md for row "A, pos 2", computed by the
// reference and checked against the numbers worked out by hand there.
#include "story.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include <flashstep/reference.hpp>

namespace flashstep::cli {

namespace {

using ref::Tensor;

// The course's five one-token pages (d_model = 2, one head): K and V of each token.
struct Token {
  const char* text;
  double k[2];
  double v[2];
};
const Token kTokens[] = {
    {"The", {1, 0}, {1, 1}},  {"cat", {0, 1}, {2, 0}},   {"sat", {1, 1}, {0, 1}},
    {"ran", {1, -1}, {1, 0}}, {"fast", {0, -1}, {0, 1}},
};

Tensor kv_of(const std::vector<int>& tokens, bool values) {
  Tensor t({static_cast<int64_t>(tokens.size()), 1, 2});
  for (size_t j = 0; j < tokens.size(); ++j)
    for (int d = 0; d < 2; ++d)
      t({static_cast<int64_t>(j), 0, d}) = values ? kTokens[tokens[j]].v[d] : kTokens[tokens[j]].k[d];
  return t;
}

std::string vec(const double* x, int n, int precision = 2) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << "[";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << x[i];
  os << "]";
  return os.str();
}

}  // namespace

bool example_kv(const std::string& word, double k[2], double v[2]) {
  for (const Token& t : kTokens)
    if (word == t.text) {
      for (int d = 0; d < 2; ++d) k[d] = t.k[d], v[d] = t.v[d];
      return true;
    }
  return false;
}

void show_worked_attention(std::ostream& os, Ledger& ledger) {
  auto expect = [&](bool ok, const std::string& what) { ledger.expect(ok, "worked example: " + what); };

  os << "KV cache pages (page size 1, d_model 2, one head):\n";
  for (int p = 0; p < 5; ++p)
    os << "  P" << p << " (\"" << kTokens[p].text << "\"): K=" << vec(kTokens[p].k, 2, 0)
       << "  V=" << vec(kTokens[p].v, 2, 0) << "\n";

  // Request A = "The cat sat" on pages P0, P1, P2; its last query is Q = [1, 1].
  os << "\nRow \"A, pos 2\": Q = [1, 1], pages [P0, P1, P2], sm_scale = 1\n";
  ref::AttentionOptions opt;
  opt.sm_scale = 1.0;
  opt.causal = true;
  Tensor q_a({3, 1, 2}, {1, 0, 0, 1, 1, 1});  // queries of A at pos 0, 1, 2
  const Tensor k_a = kv_of({0, 1, 2}, false), v_a = kv_of({0, 1, 2}, true);
  const Tensor scores = ref::attention_scores(q_a, k_a, 0, opt);
  double p[3], m = -INFINITY, sum = 0;
  for (int j = 0; j < 3; ++j) m = std::max(m, scores({2, j}));
  for (int j = 0; j < 3; ++j) sum += (p[j] = std::exp(scores({2, j}) - m));
  for (double& x : p) x /= sum;
  double s2[3] = {scores({2, 0}), scores({2, 1}), scores({2, 2})};
  os << "  scores  = Q . K^T              = " << vec(s2, 3, 0) << "\n";
  os << "  softmax(scores)                = " << vec(p, 3) << "\n";
  const auto a = ref::single_prefill_with_kv_cache(q_a, k_a, v_a, opt);
  const double out[2] = {a.o({2, 0, 0}), a.o({2, 0, 1})};
  os << "  output  = sum_j p_j V_j        = " << vec(out, 2, 4) << "\n";
  // The course multiplies the *rounded* weights: 0.21*[1,1] + 0.21*[2,0] + 0.58*[0,1].
  double rounded[2] = {0, 0};
  for (int j = 0; j < 3; ++j)
    for (int d = 0; d < 2; ++d) rounded[d] += std::round(p[j] * 100) / 100 * kTokens[j].v[d];
  os << "  with the weights rounded to 2 decimals, as the course does: " << vec(rounded, 2)
     << "   (worked example: [0.63, 0.79];\n  exactly, o = [3, 1 + e] / (2 + e) = " << vec(out, 2, 4) << ")\n";
  os << "  lse     = log sum_j exp(s_j)   = " << std::fixed << std::setprecision(4) << a.lse({2, 0}) << "\n";
  expect(std::abs(p[0] - 0.21) < 0.005 && std::abs(p[2] - 0.58) < 0.005, "softmax [0.21, 0.21, 0.58]");
  expect(std::abs(rounded[0] - 0.63) < 1e-9 && std::abs(rounded[1] - 0.79) < 1e-9,
         "output [0.63, 0.79] from the rounded weights");
  expect(std::abs(out[0] - 3 / (2 + std::exp(1.0))) < 1e-12, "exact output 3 / (2 + e)");

  os << "\nBr = 3: A's three queries in one row block; the causal mask is now essential:\n";
  os << "            P0     P1     P2\n";
  for (int i = 0; i < 3; ++i) {
    os << "  pos " << i << "   [";
    for (int j = 0; j < 3; ++j) {
      const double s = scores({i, j});
      os << std::setw(5) << (std::isinf(s) ? std::string("-inf") : std::to_string(static_cast<int>(s)))
         << (j < 2 ? "  " : "");
    }
    os << " ]\n";
  }
  expect(std::isinf(scores({0, 1})) && std::isinf(scores({0, 2})) && std::isinf(scores({1, 2})),
         "-inf above the diagonal");

  os << "\nBc = 2: the same tokens repacked two per page; B = \"The cat ran fast\" on [P0, P2]:\n";
  // Pages of size 2: P0 = (The, cat), P1 = (sat), P2 = (ran, fast).
  std::vector<Tensor> ks = {k_a, kv_of({0, 1, 3, 4}, false)};
  std::vector<Tensor> vs = {v_a, kv_of({0, 1, 3, 4}, true)};
  // Physical ids: A gets P0, P1; B gets P0's twin (shared content) then P2. The page table
  // below shares P0 between A and B by pointing both at page 0.
  ref::PagedKVCache cache = ref::make_paged_kv_cache(ks, vs, 2, ref::KVLayout::NHD, {0, 1, 3, 2}, 4);
  cache.kv_indices = {0, 1, 0, 2};  // B reuses A's P0 ("The", "cat"): the shared prefix
  Tensor q_all({7, 1, 2}, {1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, -1, 0, -1});
  const auto paged = ref::batch_prefill_with_paged_kv_cache(q_all, {0, 3, 7}, cache, opt);
  const double out2[2] = {paged.o({2, 0, 0}), paged.o({2, 0, 1})};
  os << "  page table: kv_indptr [0, 2, 4], kv_indices [P0, P1, P0, P2], last_page_len [1, 2]\n";
  os << "  \"A, pos 2\" through the Bc=2 pages = " << vec(out2, 2, 4) << "   (same as Bc = 1)\n";
  expect(std::abs(out2[0] - out[0]) < 1e-12 && std::abs(out2[1] - out[1]) < 1e-12, "Bc=2 gives the same output");
}

}  // namespace flashstep::cli
