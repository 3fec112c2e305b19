// libFuzzer's custom mutator for the targets whose input is JSON or JSON lines: half of the mutations edit the
// parsed value (one node changes type or value, loses or gains a member, is wrapped or duplicated), which byte
// mutations rarely do while keeping the text valid JSON; the other half, and any input that does not parse, get
// libFuzzer's own byte mutations.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using nlohmann::ordered_json;
using Random = std::minstd_rand;

size_t pick(Random& random, size_t count) { return std::uniform_int_distribution<size_t>(0, count - 1)(random); }

// Every node of the value, the root first.
std::vector<ordered_json*> nodes_of(ordered_json& root) {
  std::vector<ordered_json*> nodes{&root};
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i]->is_structured())
      for (ordered_json& child : *nodes[i]) nodes.push_back(&child);
  return nodes;
}

// Values at the edges of what readers check: signs, integer and double limits, empty and odd strings, wrong types.
ordered_json edge_value(Random& random) {
  static const std::vector<ordered_json> values = ordered_json::parse(R"([
    0, 1, -1, 2, 255, 256, 65535, 65536, 2147483647, 2147483648, 4294967296, -2147483649, 9223372036854775807,
    18446744073709551615, -9223372036854775808, 0.5, -0.0, 1e-300, 1e300, 3.4e38, "", "x", "auto", "\u0000",
    "\ud83d\ude00", "<|endoftext|>", "{{ x }}", "../x", true, false, null, [], {}, [0], {"": 0}])");
  return values[pick(random, values.size())];
}

void mutate_node(ordered_json& node, ordered_json& root, Random& random) {
  switch (pick(random, 6)) {
    case 0:
      node = edge_value(random);
      return;
    case 1:  // one level deeper
      node = ordered_json::array({node});
      return;
    case 2: {  // a copy of another node
      const std::vector<ordered_json*> nodes = nodes_of(root);
      node = *nodes[pick(random, nodes.size())];
      return;
    }
    case 3:  // one member fewer
      if (node.is_object() && !node.empty())
        node.erase(std::next(node.begin(), std::ptrdiff_t(pick(random, node.size()))).key());
      if (node.is_array() && !node.empty()) node.erase(pick(random, node.size()));
      return;
    case 4:  // one member more: a copy of one it has, or an edge value under a key used elsewhere
      if (node.is_array()) node.push_back(node.empty() ? edge_value(random) : node[pick(random, node.size())]);
      if (node.is_object()) {
        std::vector<std::string> keys;
        for (ordered_json* other : nodes_of(root))
          if (other->is_object())
            for (const auto& item : other->items()) keys.push_back(item.key());
        node[keys.empty() ? std::string("x") : keys[pick(random, keys.size())]] = edge_value(random);
      }
      return;
    default: {  // an integer moved by one (wrapping, as the unsigned arithmetic does), or a string made longer
      const uint64_t step = pick(random, 2) == 0 ? 1 : uint64_t(-1);
      if (node.is_number_unsigned())
        node = node.get<uint64_t>() + step;
      else if (node.is_number_integer())
        node = int64_t(uint64_t(node.get<int64_t>()) + step);
      if (node.is_string()) node = node.get<std::string>() + node.get<std::string>() + "x";
      return;
    }
  }
}

// The text with one JSON value in it edited: the whole text when it parses, else one of its lines that does.
bool mutate_text(std::string& text, Random& random) {
  const auto edit = [&random](std::string_view json_text, std::string& out) {
    ordered_json root = ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) return false;
    const std::vector<ordered_json*> nodes = nodes_of(root);
    mutate_node(*nodes[pick(random, nodes.size())], root, random);
    out = root.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    return true;
  };
  std::string edited;
  if (edit(text, edited)) {
    text = edited;
    return true;
  }
  std::vector<size_t> line_starts{0};
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') line_starts.push_back(i + 1);
  const size_t begin = line_starts[pick(random, line_starts.size())];
  const size_t end = std::min(text.find('\n', begin), text.size());
  if (!edit(std::string_view(text).substr(begin, end - begin), edited)) return false;
  text.replace(begin, end - begin, edited);
  return true;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  Random random(seed);
  std::string text(reinterpret_cast<const char*>(data), size);
  if (pick(random, 2) == 0 && mutate_text(text, random) && text.size() <= max_size) {
    std::memcpy(data, text.data(), text.size());
    return text.size();
  }
  return LLVMFuzzerMutate(data, size, max_size);
}
