// What jambo says about a bad command line, where CLI11 2.1's own words mislead or say too much: a misspelled
// subcommand reads "A subcommand is required", "--modle x" reads "--model is required", a failed
// CLI::NonNegativeNumber prints its bound in 300 digits, and "-1" given to an unsigned option silently
// becomes 2^64 - 1.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace jambo::cli {

// Makes every numeric option of `app` and of its subcommands strict and its errors short, wherever the option
// was declared: the value must be an integer (a non-negative one for unsigned options) or a finite number that
// fits its type, and a failed CLI::Range, CLI::NonNegativeNumber or CLI::PositiveNumber says
// "--max-num-seqs: 0 is outside [1, 1048576]" or "--seed: -1 is not a non-negative integer". Call it once, after
// every subcommand and option has been added.
void make_numeric_options_strict(CLI::App& app);

// The one line that reports a command line that did not parse: an unknown subcommand or option first (it is the
// likely cause of whatever else failed), with the nearest name when one is close, else CLI11's message.
std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error);

}  // namespace jambo::cli
