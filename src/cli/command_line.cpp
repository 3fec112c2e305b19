#include "cli/command_line.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string_view>
#include <vector>

namespace jambo::cli {
namespace {

// What a numeric option holds.
enum class NumberKind { Integer, Unsigned, Real };

std::optional<NumberKind> number_kind(const CLI::Option& option) {
  // CLI11's name of the option's type, followed by ":" and the description of each of its validators.
  const std::string type_name = option.get_type_name();
  const std::string type = type_name.substr(0, type_name.find(':'));
  if (type == "INT") return NumberKind::Integer;
  if (type == "UINT") return NumberKind::Unsigned;
  if (type == "FLOAT") return NumberKind::Real;
  return std::nullopt;
}

std::string_view noun(NumberKind kind) { return kind == NumberKind::Real ? "number" : "integer"; }

// Why `text` is not a value of that kind, or "" when it is. Integers are read as CLI11 then converts them
// (strtoll, strtoull, base 0), which saturates on overflow and takes "-1" for the unsigned 2^64 - 1.
std::string number_error(const std::string& text, NumberKind kind) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  double real = 0.0;
  if (kind == NumberKind::Integer) std::strtoll(begin, &end, 0);
  if (kind == NumberKind::Unsigned) std::strtoull(begin, &end, 0);
  if (kind == NumberKind::Real) real = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size())
    return fmt::format("'{}' is not {}", text, kind == NumberKind::Real ? "a number" : "an integer");
  if (kind == NumberKind::Real) return std::isfinite(real) ? "" : fmt::format("{} is not a finite number", text);
  if (kind == NumberKind::Unsigned && text.find('-') != std::string::npos)
    return fmt::format("{} is not a non-negative integer", text);
  return errno == ERANGE ? fmt::format("{} does not fit in a 64-bit integer", text) : "";
}

// How a CLI11 range check reads when a value fails it ("outside [1, 1048576]"), or nullopt for a validator that
// is not one, known by its description: CLI::Range's names its bounds ("INT in [1 - 1048576]"), and
// NonNegativeNumber and PositiveNumber, ranges up to the largest double, have their own.
std::optional<std::string> range_failure(const CLI::Validator& validator, NumberKind kind) {
  const std::string description = validator.get_description();
  if (description == "NONNEGATIVE") return fmt::format("not a non-negative {}", noun(kind));
  if (description == "POSITIVE") return fmt::format("not a positive {}", noun(kind));
  static const std::regex kRangeDescription(R"(\w+ in \[(.+?) - (.+)\])");
  std::smatch bounds;
  if (!std::regex_match(description, bounds, kRangeDescription)) return std::nullopt;
  return fmt::format("outside [{}, {}]", bounds[1].str(), bounds[2].str());
}

struct RangeCheck {
  CLI::Validator validator;  // the option's own check (this copy stays active)
  std::string failure;       // what a value that fails it is: "outside [1, 1048576]"
};

// The check that replaces an option's range checks: first the number itself, then each range.
CLI::Validator strict_number_check(NumberKind kind, std::vector<RangeCheck> ranges) {
  return CLI::Validator(
      [kind, ranges = std::move(ranges)](std::string& value) {
        if (std::string error = number_error(value, kind); !error.empty()) return error;
        for (const RangeCheck& range : ranges) {
          std::string checked = value;
          if (!range.validator(checked).empty()) return fmt::format("{} is {}", value, range.failure);
        }
        return std::string();
      },
      /*validator_desc=*/"");
}

// CLI11 2.1 does not count an option's validators: get_validator(index) throws past the last one.
std::vector<CLI::Validator*> validators_of(CLI::Option& option) {
  std::vector<CLI::Validator*> validators;
  try {
    for (int index = 0;; ++index) validators.push_back(option.get_validator(index));
  } catch (const CLI::OptionNotFound&) {
  }
  return validators;
}

}  // namespace

void make_numeric_options_strict(CLI::App& command) {
  for (CLI::Option* option : command.get_options()) {
    const std::optional<NumberKind> kind = number_kind(*option);
    if (!kind) continue;
    std::vector<RangeCheck> ranges;
    for (CLI::Validator* validator : validators_of(*option)) {
      std::optional<std::string> failure = range_failure(*validator, *kind);
      if (!failure) continue;
      ranges.push_back({*validator, std::move(*failure)});
      validator->active(false);  // its description stays in the help
    }
    option->check(strict_number_check(*kind, std::move(ranges)));
  }
  for (CLI::App* subcommand : command.get_subcommands([](CLI::App*) { return true; }))
    make_numeric_options_strict(*subcommand);
}

namespace {

// Insertions, deletions, substitutions and swaps of neighbours that turn `a` into `b` (optimal string alignment).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> distance(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) distance[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) distance[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      distance[i][j] = std::min(
          {distance[i - 1][j] + 1, distance[i][j - 1] + 1, distance[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        distance[i][j] = std::min(distance[i][j], distance[i - 2][j - 2] + 1);
    }
  }
  return distance[a.size()][b.size()];
}

// The candidate `typed` most likely meant, or nullopt when none is close: at most two edits away, and fewer than
// half the length of the name (leading dashes apart), so that "--x" suggests no "--n".
std::optional<std::string> nearest_name(std::string_view typed, const std::vector<std::string>& candidates) {
  const size_t name_length = typed.size() - std::min(typed.size(), typed.find_first_not_of('-'));
  std::optional<std::string> nearest;
  size_t nearest_distance = 3;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(typed, candidate);
    if (distance < nearest_distance && 2 * distance < name_length) {
      nearest = candidate;
      nearest_distance = distance;
    }
  }
  return nearest;
}

std::string with_suggestion(std::string message, std::string_view typed, const std::vector<std::string>& candidates) {
  if (const std::optional<std::string> nearest = nearest_name(typed, candidates))
    message += fmt::format("; did you mean '{}'?", *nearest);
  return message;
}

bool is_option(const std::string& argument) { return argument.size() > 1 && argument[0] == '-'; }

std::vector<std::string> option_names(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options())
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  return names;
}

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* subcommand : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(subcommand->get_name());
  return names;
}

// What is wrong with the arguments `command` could not place, or nullopt when it placed them all.
std::optional<std::string> describe_leftovers(const CLI::App& command) {
  const std::vector<std::string> leftovers = command.remaining();
  if (leftovers.empty()) return std::nullopt;
  const bool at_top_without_subcommand = command.get_parent() == nullptr && command.get_subcommands().empty();
  if (at_top_without_subcommand && !is_option(leftovers.front()))
    return with_suggestion(fmt::format("unknown subcommand '{}'", leftovers.front()), leftovers.front(),
                           subcommand_names(command));
  const auto option = std::find_if(leftovers.begin(), leftovers.end(), is_option);
  if (option == leftovers.end()) return fmt::format("unexpected argument '{}'", leftovers.front());
  const std::string name = option->substr(0, option->find('='));  // --max-token=3 names --max-token
  return with_suggestion(fmt::format("unknown option '{}'", name), name, option_names(command));
}

}  // namespace

std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error) {
  for (const CLI::App* subcommand : app.get_subcommands())
    if (std::optional<std::string> leftovers = describe_leftovers(*subcommand)) return *leftovers;
  return describe_leftovers(app).value_or(error.what());
}

}  // namespace jambo::cli
