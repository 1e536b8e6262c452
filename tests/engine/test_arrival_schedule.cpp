// ArrivalSchedule and its generator: reproducible from (seed, parameters), within the
// parameters' bounds, shared prefixes where drawn, bad parameters refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "09_engine/arrival_schedule.hpp"
#include "support/expect_error.hpp"

using namespace flashstep::stages::engine;
using flashstep::test::expect_error;

TEST_CASE("SplitMix64 gives the published splitmix64 stream") {
  // splitmix64 from seed 0 (Vigna's reference implementation, prng.di.unimi.it): the
  // first three outputs.
  SplitMix64 g(0);
  CHECK(g.next() == 0xE220A8397B1DCDAFULL);
  CHECK(g.next() == 0x6E789E6AA1B965F4ULL);
  CHECK(g.next() == 0x06C45D188009454FULL);
}

TEST_CASE("SplitMix64: uniform_int stays in range and reaches both ends and poisson has its mean") {
  SplitMix64 g(7);
  bool lo = false, hi = false;
  for (int i = 0; i < 10000; ++i) {
    const int64_t v = g.uniform_int(-3, 3);
    REQUIRE(v >= -3);
    REQUIRE(v <= 3);
    lo |= v == -3;
    hi |= v == 3;
  }
  CHECK(lo);
  CHECK(hi);
  // Poisson(mean) over n draws: the sample mean is within 5 standard errors sqrt(mean / n).
  for (double mean : {0.3, 2.0, 150.0}) {
    const int n = 20000;
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += static_cast<double>(g.poisson(mean));
    CAPTURE(mean);
    CHECK(std::abs(sum / n - mean) < 5 * std::sqrt(mean / n));
  }
}

TEST_CASE("ArrivalSchedule: same seed gives the same schedule and another seed another") {
  ArrivalParams p;
  p.seed = 42;
  p.num_requests = 50;
  p.arrivals_per_step = 1.5;
  p.num_shared_prefixes = 3;
  p.shared_prefix_len = 20;
  p.shared_fraction = 0.5;
  const ArrivalSchedule a = ArrivalSchedule::make(p), b = ArrivalSchedule::make(p);
  REQUIRE(a.requests().size() == 50);
  for (size_t i = 0; i < a.requests().size(); ++i) {
    CHECK(a.requests()[i].arrival_step == b.requests()[i].arrival_step);
    CHECK(a.requests()[i].prompt == b.requests()[i].prompt);
    CHECK(a.requests()[i].max_new_tokens == b.requests()[i].max_new_tokens);
    CHECK(a.requests()[i].shared_prefix == b.requests()[i].shared_prefix);
  }
  CHECK(a.shared_prefixes() == b.shared_prefixes());
  CHECK(a.describe() == b.describe());
  p.seed = 43;
  const ArrivalSchedule c = ArrivalSchedule::make(p);
  bool differs = false;
  for (size_t i = 0; i < c.requests().size(); ++i) differs |= c.requests()[i].prompt != a.requests()[i].prompt;
  CHECK(differs);
}

TEST_CASE("ArrivalSchedule: every request within its parameters, prefixes where drawn") {
  ArrivalParams p;
  p.seed = 5;
  p.num_requests = 400;
  p.arrivals_per_step = 2.5;
  p.min_prompt_len = 3;
  p.max_prompt_len = 9;
  p.min_new_tokens = 2;
  p.max_new_tokens = 6;
  p.vocab_size = 100;
  p.num_shared_prefixes = 4;
  p.shared_prefix_len = 12;
  p.shared_fraction = 0.25;
  const ArrivalSchedule s = ArrivalSchedule::make(p);
  REQUIRE(s.shared_prefixes().size() == 4);
  int64_t shared = 0, prev = 0;
  std::vector<int> per_prefix(4, 0);
  for (const Request& r : s.requests()) {
    CHECK(r.arrival_step >= prev);
    prev = r.arrival_step;
    CHECK(r.max_new_tokens >= 2);
    CHECK(r.max_new_tokens <= 6);
    for (int32_t t : r.prompt) {
      CHECK(t >= 0);
      CHECK(t < 100);
    }
    int64_t own = static_cast<int64_t>(r.prompt.size());
    if (r.shared_prefix >= 0) {
      REQUIRE(r.shared_prefix < 4);
      const auto& prefix = s.shared_prefixes()[static_cast<size_t>(r.shared_prefix)];
      CHECK(std::equal(prefix.begin(), prefix.end(), r.prompt.begin()));
      own -= 12;
      ++shared;
      ++per_prefix[static_cast<size_t>(r.shared_prefix)];
    }
    CHECK(own >= 3);
    CHECK(own <= 9);
  }
  // 400 draws at 0.25: 100 expected, standard deviation sqrt(400 * 0.25 * 0.75) = 8.7.
  CHECK(shared > 100 - 5 * 8.7);
  CHECK(shared < 100 + 5 * 8.7);
  for (int n : per_prefix) CHECK(n > 0);
  // Poisson arrivals at 2.5 per step: 400 requests take about 160 steps (sd of the
  // count over 160 steps is sqrt(400) = 20 requests, i.e. 8 steps).
  CHECK(s.last_arrival_step() > 160 - 5 * 8);
  CHECK(s.last_arrival_step() < 160 + 5 * 8);
}

TEST_CASE("ArrivalSchedule: fraction 0 and 1 share nothing and everything") {
  ArrivalParams p;
  p.num_requests = 30;
  p.num_shared_prefixes = 2;
  p.shared_prefix_len = 8;
  p.shared_fraction = 1.0;
  for (const Request& r : ArrivalSchedule::make(p).requests()) CHECK(r.shared_prefix >= 0);
  p.shared_fraction = 0.0;
  for (const Request& r : ArrivalSchedule::make(p).requests()) CHECK(r.shared_prefix == -1);
}

TEST_CASE("ArrivalSchedule: bad parameters are refused by name") {
  auto with = [](auto change) {
    ArrivalParams p;
    change(p);
    return [p] { ArrivalSchedule::make(p); };
  };
  expect_error(with([](ArrivalParams& p) { p.num_requests = 0; }), {"ArrivalSchedule::make", "num_requests"});
  expect_error(with([](ArrivalParams& p) { p.arrivals_per_step = 0; }), {"arrivals_per_step", "(0, 1000]"});
  expect_error(with([](ArrivalParams& p) { p.arrivals_per_step = -1; }), {"arrivals_per_step"});
  expect_error(with([](ArrivalParams& p) { p.min_prompt_len = 0; }), {"min_prompt_len", "empty"});
  expect_error(with([](ArrivalParams& p) { p.max_prompt_len = p.min_prompt_len - 1; }), {"max_prompt_len"});
  expect_error(with([](ArrivalParams& p) { p.min_new_tokens = 0; }), {"min_new_tokens"});
  expect_error(with([](ArrivalParams& p) { p.max_new_tokens = p.min_new_tokens - 1; }), {"max_new_tokens"});
  expect_error(with([](ArrivalParams& p) { p.vocab_size = 1; }), {"vocab_size"});
  expect_error(with([](ArrivalParams& p) { p.num_shared_prefixes = -1; }), {"num_shared_prefixes"});
  expect_error(with([](ArrivalParams& p) {
                 p.num_shared_prefixes = 1;
                 p.shared_prefix_len = 0;
               }),
               {"shared_prefix_len"});
  expect_error(with([](ArrivalParams& p) {
                 p.num_shared_prefixes = 1;
                 p.shared_prefix_len = 4;
                 p.shared_fraction = 1.5;
               }),
               {"shared_fraction", "[0, 1]"});
  expect_error(with([](ArrivalParams& p) { p.shared_fraction = 0.5; }),
               {"shared_fraction", "num_shared_prefixes is 0"});
}
