// The `flashstep` command: tour (the course's main job). Later subcommands: explain,
// validate, bench.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tour.hpp"

int main(int argc, char** argv) {
  CLI::App app{"flashstep: an LLM attention engine, built step by step and checked against a CPU reference"};
  app.require_subcommand(1);
  int rc = 0;
  auto* tour = app.add_subcommand("tour", "Walk the primer's worked example, computed by the reference");
  tour->callback([&] { rc = flashstep::cli::print_worked_example(std::cout); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return rc;
}
