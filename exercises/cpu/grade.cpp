// The shared checks of the CPU exercises (grade.hpp).
#include "grade.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>

namespace flashstep::exercises {

namespace {

// Thrown by Grader::fail: the first difference ends the run (later ones would only repeat it).
struct Mismatch {
  std::string message;
};

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.12g", x);
  return buf;
}

std::string shape_text(const std::vector<int64_t>& shape) { return ref::shape_string(shape); }

// "row 1, head 0, dim 5" for flat index `flat` of a row-major tensor of `shape`.
std::string coordinates(const std::vector<int64_t>& shape, int64_t flat, const std::vector<std::string>& axes) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  std::string s;
  for (size_t d = 0; d < index.size(); ++d) {
    if (d) s += ", ";
    if (d < axes.size()) s += axes[d] + " ";
    s += std::to_string(index[d]);
  }
  return s;
}

bool agree(double yours, double expected, double tol) {
  if (std::isnan(yours) || std::isnan(expected)) return false;
  if (std::isinf(yours) || std::isinf(expected)) return yours == expected;
  return std::fabs(yours - expected) <= tol + tol * std::fabs(expected);
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

void Grader::at(const std::string& context) { context_ = context; }

void Grader::fail(const std::string& message) const {
  throw Mismatch{(context_.empty() ? "" : context_ + "\n") + "first difference at " + message};
}

void Grader::same(const std::string& what, const std::vector<int32_t>& yours, const std::vector<int32_t>& expected) {
  // Short arrays are printed whole under the message: the difference is easier to see.
  const std::string both = yours.size() <= 32 && expected.size() <= 32
                               ? "\n  yours    " + list_text(yours) + "\n  expected " + list_text(expected)
                               : "";
  const size_t n = std::min(yours.size(), expected.size());
  for (size_t i = 0; i < n; ++i)
    if (yours[i] != expected[i])
      fail(what + "[" + std::to_string(i) + "]: yours " + std::to_string(yours[i]) + ", expected " +
           std::to_string(expected[i]) + both);
  if (yours.size() != expected.size())
    fail(what + ": yours has " + std::to_string(yours.size()) + " entries, expected " +
         std::to_string(expected.size()) + both);
}

void Grader::same(const std::string& what, int64_t yours, int64_t expected) {
  if (yours != expected) fail(what + ": yours " + std::to_string(yours) + ", expected " + std::to_string(expected));
}

void Grader::same(const std::string& what, const std::vector<std::string>& yours,
                  const std::vector<std::string>& expected) {
  auto whole = [](const std::vector<std::string>& lines) {
    std::string s;
    for (const auto& l : lines) s += "\n    " + l;
    return s;
  };
  const std::string both = "\n  yours:" + whole(yours) + "\n  expected:" + whole(expected);
  const size_t n = std::min(yours.size(), expected.size());
  for (size_t i = 0; i < n; ++i)
    if (yours[i] != expected[i])
      fail(what + " line " + std::to_string(i + 1) + ": yours \"" + yours[i] + "\", expected \"" + expected[i] + "\"" +
           both);
  if (yours.size() != expected.size())
    fail(what + ": yours has " + std::to_string(yours.size()) + " lines, expected " + std::to_string(expected.size()) +
         both);
}

void Grader::close(const std::string& what, const Tensor& yours, const Tensor& expected,
                   const std::vector<std::string>& axes, double tol) {
  if (yours.shape != expected.shape || static_cast<int64_t>(yours.data.size()) != expected.numel())
    fail(what + ": yours has shape " + shape_text(yours.shape) + " (" + std::to_string(yours.data.size()) +
         " values), expected shape " + shape_text(expected.shape));
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double a = yours.data[static_cast<size_t>(i)], b = expected.data[static_cast<size_t>(i)];
    if (!agree(a, b, tol))
      fail(what + "[" + coordinates(expected.shape, i, axes) + "]: yours " + number(a) + ", expected " + number(b));
  }
}

void Grader::close(const std::string& what, const std::vector<double>& yours, const std::vector<double>& expected,
                   double tol) {
  const size_t n = std::min(yours.size(), expected.size());
  for (size_t i = 0; i < n; ++i)
    if (!agree(yours[i], expected[i], tol))
      fail(what + "[" + std::to_string(i) + "]: yours " + number(yours[i]) + ", expected " + number(expected[i]));
  if (yours.size() != expected.size())
    fail(what + ": yours has " + std::to_string(yours.size()) + " entries, expected " +
         std::to_string(expected.size()));
}

int run_exercise(int argc, char** argv, const std::string& name, const ExerciseBody& body) {
  uint64_t seed = 0;
  bool given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
      given = true;
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 7, nullptr, 10);
      given = true;
    } else {
      std::cerr << "usage: " << argv[0] << " [--seed S]\n";
      return 2;
    }
  }
  if (!given) seed = fresh_seed();
  std::cout << "exercise " << name << ", seed " << seed << " (rerun with --seed " << seed << ")\n";
  std::mt19937_64 rng(seed);
  Grader grader;
  try {
    body(grader, rng);
  } catch (const Mismatch& m) {
    std::cout << m.message << "\nFAIL (a hint: flashstep exercise hint " << name << ")\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout << "your code threw: " << e.what() << "\nFAIL (a hint: flashstep exercise hint " << name << ")\n";
    return 1;
  }
  std::cout << "PASS: " << grader.cases() << " random cases agree with the reference\n";
  return 0;
}

Tensor random_tensor(std::mt19937_64& rng, const std::vector<int64_t>& shape) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor t(shape);
  for (double& x : t.data) x = normal(rng);
  return t;
}

int64_t random_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

std::vector<int32_t> indptr_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> indptr{0};
  for (int32_t n : lengths) indptr.push_back(indptr.back() + n);
  return indptr;
}

std::string list_text(const std::vector<int32_t>& values) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  os << "]";
  return os.str();
}

}  // namespace flashstep::exercises
