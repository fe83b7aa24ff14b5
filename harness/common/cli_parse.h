// Parses a CLI11 command line with gradscope's exit codes, for the CLI and the benchmark
// programs alike: help exits 0; a usage error prints one line naming it and exits 2
// (CLI11's own codes, e.g. 105 for a failed check, are not ours).
#pragma once

#include <CLI/CLI.hpp>

#include <iostream>
#include <optional>
#include <string>

namespace gradscope {

// The exit code to stop with, or nothing when the command line parsed.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv,
                                             const std::string& program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << program << ": error: " << e.what() << "\n(run " << program
              << " --help for usage)\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace gradscope
