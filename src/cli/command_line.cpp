#include "cli/command_line.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <vector>

namespace jambo::cli {
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
