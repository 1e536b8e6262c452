// One check for the error contract of the reference: a call must throw
// InvalidArgument whose message names the function, the argument and the rule.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "flashstep/reference/errors.hpp"

namespace flashstep::test {

/// Runs `call`; requires an InvalidArgument whose message contains every fragment.
inline void expect_error(const std::function<void()>& call, std::initializer_list<const char*> fragments) {
  std::string message;
  try {
    call();
  } catch (const ref::InvalidArgument& e) {
    message = e.what();
  }
  CAPTURE(message);
  REQUIRE_FALSE(message.empty());
  for (const char* f : fragments) {
    CAPTURE(f);
    CHECK(message.find(f) != std::string::npos);
  }
}

}  // namespace flashstep::test
