// What every CPU exercise's grader shares: the seed of the run, random inputs, and checks
// that stop at the first place your value differs from the reference's and print both.
//
// A grader is a `main` that calls run_exercise() with a body. The body draws inputs from
// the seeded generator, calls your function and the reference's, and compares them with
// Grader::same / Grader::close. The first mismatch ends the run:
//
//     exercise merge_state, seed 1234 (rerun with --seed 1234)
//     case 3 of 20: seq_len 4, num_heads 2, head_dim 8, set B empty
//     first difference at o[row 1, head 0, dim 5]: yours 0.12, expected -0.53
//     FAIL (a hint: flashstep exercise hint merge_state)
//
// and the program exits 1; when every check passes it prints PASS and exits 0.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <flashstep/reference.hpp>

namespace flashstep::exercises {

using ref::Tensor;

/// Compares your values with the reference's; the first difference throws (and ends the run).
class Grader {
 public:
  /// What the next checks are about ("case 3 of 20: batch 4, page_size 2"); printed on failure.
  void at(const std::string& context);

  /// Integers must be equal, entry by entry (sizes too). \param what the array's name
  void same(const std::string& what, const std::vector<int32_t>& yours, const std::vector<int32_t>& expected);
  /// Two integers must be equal.
  void same(const std::string& what, int64_t yours, int64_t expected);
  /// Lines of text (e.g. a tree listed one node per line) must be equal, line by line.
  void same(const std::string& what, const std::vector<std::string>& yours, const std::vector<std::string>& expected);

  /// Same shape, and every element within `tol` (absolute, plus `tol` relative); equal
  /// infinities agree, a NaN never does.
  /// \param axes one name per dimension, for the message ("row", "head", "dim")
  void close(const std::string& what, const Tensor& yours, const Tensor& expected, const std::vector<std::string>& axes,
             double tol = 1e-9);
  /// The same for a plain vector of doubles.
  void close(const std::string& what, const std::vector<double>& yours, const std::vector<double>& expected,
             double tol = 1e-9);

  /// Counts one passed case (for the PASS line).
  void passed_case() { ++cases_; }
  /// Cases counted so far.
  int cases() const { return cases_; }

 private:
  [[noreturn]] void fail(const std::string& message) const;
  std::string context_;
  int cases_ = 0;
};

/// The body of a grader: draws inputs from `rng`, checks your function against the reference.
using ExerciseBody = std::function<void(Grader& grader, std::mt19937_64& rng)>;

/// Runs a grader: reads `--seed S` (or draws a fresh seed), prints it, runs `body`, and
/// prints PASS (returns 0) or FAIL with the first difference (returns 1). An exception
/// from your code is a FAIL too, with its message.
/// \param name the exercise's name, as `flashstep exercise list` shows it
int run_exercise(int argc, char** argv, const std::string& name, const ExerciseBody& body);

/// Normal(0, 1) values of the given shape.
Tensor random_tensor(std::mt19937_64& rng, const std::vector<int64_t>& shape);
/// A uniform integer in [lo, hi].
int64_t random_int(std::mt19937_64& rng, int64_t lo, int64_t hi);
/// The offsets of consecutive runs of the given lengths: {0, l0, l0 + l1, ...}.
std::vector<int32_t> indptr_of(const std::vector<int32_t>& lengths);
/// "[3, 1, 4]" for a message.
std::string list_text(const std::vector<int32_t>& values);

}  // namespace flashstep::exercises
