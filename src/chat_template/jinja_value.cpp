#include "chat_template/jinja_value.h"

#include "core/error.h"
#include "chat_template/jinja_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace jambo::chat_template {
namespace {

int deepest(const List& items) {
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth());
  return depth;
}

void require_depth(int depth) {
  JAMBO_REQUIRE(depth <= kMaxNesting, "a value nested deeper than {} levels", kMaxNesting);
}

std::string join_items(const List& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += to_repr(items[i]);
  }
  return out;
}

std::string dict_repr(const Dict& dict) {
  std::string out = "{";
  for (size_t i = 0; i < dict.entries.size(); ++i) {
    if (i > 0) out += ", ";
    out += text::repr(dict.entries[i].first) + ": " + to_repr(dict.entries[i].second);
  }
  return out + "}";
}

void write_json(std::string& out, const Value& value, const JsonFormat& format, int level) {
  const auto newline = [&](int at) {
    if (format.indent) {
      out += '\n';
      for (int i = 0; i < at; ++i) out += *format.indent;
    }
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(value.as_int());
      return;
    case Value::Kind::kFloat: {
      const double number = value.as_float();
      out += std::isnan(number)   ? "NaN"
             : std::isinf(number) ? (number > 0 ? "Infinity" : "-Infinity")
                                  : python_float(number);
      return;
    }
    case Value::Kind::kString:
      out += text::json_quote(value.as_string(), format.ensure_ascii);
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const List& items = value.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += format.item_separator;
        newline(level + 1);
        write_json(out, items[i], format, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : value.as_dict().entries) entries.push_back(&entry);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (format.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += format.item_separator;
        newline(level + 1);
        out += text::json_quote(entries[i]->first, format.ensure_ascii) + format.key_separator;
        write_json(out, entries[i]->second, format, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      fail("Object of type {} is not JSON serializable", type_name(value));
  }
}

Value from_json_at(const nlohmann::ordered_json& json, int depth) {
  require_depth(depth);
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto number = json.get<uint64_t>();
      JAMBO_REQUIRE(number <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "the integer {} is too large",
                    number);
      return Value::integer(static_cast<int64_t>(number));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::number(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : json) items.push_back(from_json_at(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : json.items()) dict.set(key, from_json_at(item, depth + 1));
      return Value::dict(std::move(dict));
    }
    default:
      fail("a JSON value of type {} cannot be used in a template", json.type_name());
  }
}

}  // namespace

const Value* Dict::find(std::string_view key) const {
  for (const auto& [name, value] : entries)
    if (name == key) return &value;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  for (auto& [name, existing] : entries) {
    if (name == key) {
      existing = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string reason) {
  Value value;
  value.string_ = std::make_shared<const std::string>(std::move(reason));
  return value;
}

Value Value::none() {
  Value value;
  value.kind_ = Kind::kNone;
  return value;
}

Value Value::boolean(bool b) {
  Value value;
  value.kind_ = Kind::kBool;
  value.bool_ = b;
  value.int_ = b ? 1 : 0;
  return value;
}

Value Value::integer(int64_t i) {
  Value value;
  value.kind_ = Kind::kInt;
  value.int_ = i;
  return value;
}

Value Value::number(double f) {
  Value value;
  value.kind_ = Kind::kFloat;
  value.float_ = f;
  return value;
}

Value Value::string(std::string s) {
  Value value;
  value.kind_ = Kind::kString;
  value.string_ = std::make_shared<const std::string>(std::move(s));
  return value;
}

Value Value::list(List items) {
  Value value;
  value.kind_ = Kind::kList;
  value.depth_ = deepest(items) + 1;
  require_depth(value.depth_);
  value.list_ = std::make_shared<const List>(std::move(items));
  return value;
}

Value Value::tuple(List items) {
  Value value = list(std::move(items));
  value.kind_ = Kind::kTuple;
  return value;
}

Value Value::dict(Dict dict) {
  Value value;
  value.kind_ = Kind::kDict;
  for (const auto& entry : dict.entries) value.depth_ = std::max(value.depth_, entry.second.depth());
  value.depth_ += 1;
  require_depth(value.depth_);
  value.dict_ = std::make_shared<Dict>(std::move(dict));
  return value;
}

Value Value::namespace_object(Dict attributes) {
  Value value;
  value.kind_ = Kind::kNamespace;
  value.depth_ = 1;
  value.dict_ = std::make_shared<Dict>(std::move(attributes));
  return value;
}

Value Value::function(std::string name, std::function<Value(Arguments&)> call) {
  Value value;
  value.kind_ = Kind::kFunction;
  value.function_ = std::make_shared<const Function>(Function{std::move(name), std::move(call)});
  return value;
}

double Value::as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }

const std::string& Value::undefined_reason() const {
  static const std::string unknown = "a value is undefined";
  return string_ ? *string_ : unknown;
}

std::string type_name(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
  }
  return "object";
}

bool truthy(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return value.as_bool();
    case Value::Kind::kInt:
      return value.as_int() != 0;
    case Value::Kind::kFloat:
      return value.as_float() != 0;
    case Value::Kind::kString:
      return !value.as_string().empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return !value.as_list().empty();
    case Value::Kind::kDict:
      return !value.as_dict().entries.empty();
    default:
      return true;
  }
}

std::string to_str(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return value.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(value.as_int());
    case Value::Kind::kFloat:
      return python_float(value.as_float());
    case Value::Kind::kString:
      return value.as_string();
    case Value::Kind::kList:
      return std::string("[").append(join_items(value.as_list())).append("]");
    case Value::Kind::kTuple:
      return std::string("(").append(join_items(value.as_list())).append(value.as_list().size() == 1 ? ",)" : ")");
    case Value::Kind::kDict:
      return dict_repr(value.as_dict());
    case Value::Kind::kNamespace:
      return "<Namespace " + dict_repr(value.namespace_attributes()) + ">";
    case Value::Kind::kFunction:
      return "<function " + value.as_function().name + ">";
  }
  return "";
}

std::string to_repr(const Value& value) {
  if (value.is_string()) return text::repr(value.as_string());
  if (value.is_undefined()) return "Undefined";
  return to_str(value);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return std::equal(a.as_list().begin(), a.as_list().end(), b.as_list().begin(), b.as_list().end(), equals);
    case Value::Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      return std::all_of(x.entries.begin(), x.entries.end(), [&](const auto& entry) {
        const Value* other = y.find(entry.first);
        return other && equals(entry.second, *other);
      });
    }
    case Value::Kind::kNamespace:
      return &a.namespace_attributes() == &b.namespace_attributes();
    case Value::Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat)
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.as_string().compare(b.as_string()) < 0 ? -1 : a.as_string() == b.as_string() ? 0 : 1;
  if (a.is_sequence() && a.kind() == b.kind()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (const int order = compare(x[i], y[i]); order != 0) return order;
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b));
}

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string_view shortest(buffer, result.ptr - buffer);  // "-d.ddde+XX": the shortest round trip
  std::string out;
  if (shortest.front() == '-') {
    out += '-';
    shortest.remove_prefix(1);
  }
  const size_t e = shortest.find('e');
  std::string digits;
  for (char c : shortest.substr(0, e))
    if (c != '.') digits += c;
  const int exponent = std::atoi(std::string(shortest.substr(e + 1)).c_str());
  const int point = exponent + 1;   // digits are 0.d1d2... * 10^point
  if (point > 16 || point <= -4) {  // Python's repr switches to exponent notation here
    out.append(digits, 0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (point <= 0) {
    out.append("0.").append(-point, '0').append(digits);
  } else if (point >= static_cast<int>(digits.size())) {
    out.append(digits).append(point - digits.size(), '0').append(".0");
  } else {
    out.append(digits, 0, point).append(".").append(digits, point);
  }
  return out;
}

List iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return value.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& entry : value.as_dict().entries) keys.push_back(Value::string(entry.first));
      return keys;
    }
    case Value::Kind::kString: {
      List characters;
      const std::string& s = value.as_string();
      const std::vector<size_t> offsets = text::code_point_offsets(s);
      for (size_t i = 0; i + 1 < offsets.size(); ++i)
        characters.push_back(Value::string(s.substr(offsets[i], offsets[i + 1] - offsets[i])));
      return characters;
    }
    default:
      fail("'{}' object is not iterable", type_name(value));
  }
}

std::string to_json(const Value& value, const JsonFormat& format) {
  std::string out;
  write_json(out, value, format, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& json) { return from_json_at(json, 0); }

void fail_undefined(const Value& value) { throw Error(value.undefined_reason()); }

}  // namespace jambo::chat_template
