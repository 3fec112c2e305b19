// What jambo says about a command line that does not parse, where CLI11 2.1's own words mislead: a misspelled
// subcommand reads "A subcommand is required", and "--modle x" reads "--model is required".
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace jambo::cli {

// The one line that reports a command line that did not parse: an unknown subcommand or option first (it is the
// likely cause of whatever else failed), with the nearest name when one is close, else CLI11's message.
std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error);

}  // namespace jambo::cli
