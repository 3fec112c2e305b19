#include "chat_template/jinja_builtins.h"

#include "chat_template/jinja_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <initializer_list>
#include <numeric>
#include <unordered_map>

namespace jambo::chat_template {
namespace {

// A function's arguments bound to its parameter names, as Python binds them.
class Parameters {
 public:
  Parameters(std::string_view function, Arguments& arguments, std::initializer_list<std::string_view> names)
      : values_(names.size()), given_(names.size(), false) {
    JAMBO_REQUIRE(arguments.positional.size() <= names.size(), "{}() takes at most {} argument(s), {} given", function,
                  names.size(), arguments.positional.size());
    for (size_t i = 0; i < arguments.positional.size(); ++i) bind(i, arguments.positional[i]);
    for (auto& [name, value] : arguments.keyword) {
      const auto found = std::find(names.begin(), names.end(), name);
      JAMBO_REQUIRE(found != names.end(), "{}() got an unexpected keyword argument '{}'", function, name);
      const size_t i = found - names.begin();
      JAMBO_REQUIRE(!given_[i], "{}() got multiple values for argument '{}'", function, name);
      bind(i, value);
    }
  }

  bool provided(size_t i) const { return given_[i]; }
  bool given(size_t i) const { return given_[i] && !values_[i].is_none(); }  // and not None
  const Value& operator[](size_t i) const { return values_[i]; }
  bool flag(size_t i) const { return given_[i] && truthy(values_[i]); }
  std::optional<std::string> text(size_t i) const {
    if (!given(i)) return std::nullopt;
    JAMBO_REQUIRE(values_[i].is_string(), "expected a string argument, got '{}'", type_name(values_[i]));
    return values_[i].as_string();
  }
  int64_t integer(size_t i, int64_t fallback) const {
    if (!given(i)) return fallback;
    JAMBO_REQUIRE(values_[i].is_int() || values_[i].kind() == Value::Kind::kBool,
                  "expected an integer argument, got '{}'", type_name(values_[i]));
    return values_[i].as_int();
  }

 private:
  void bind(size_t i, const Value& value) {
    values_[i] = value;
    given_[i] = true;
  }

  std::vector<Value> values_;
  std::vector<bool> given_;
};

const std::string& require_string(const Value& value, std::string_view what) {
  if (value.is_undefined()) fail_undefined(value);
  JAMBO_REQUIRE(value.is_string(), "{} must be a string, not '{}'", what, type_name(value));
  return value.as_string();
}

int64_t length_of(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(text::code_point_count(value.as_string()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(value.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(value.as_dict().entries.size());
    default:
      fail("object of type '{}' has no len()", type_name(value));
  }
}

// jinja2's attribute getter: "a.b.0" looks up a, then b, then index 0.
Value attribute_of(const Value& item, const std::string& path) {
  Value current = item;
  for (const std::string& part : text::split(path, std::string("."), -1)) {
    int64_t index = 0;
    const auto parsed = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool is_index = !part.empty() && parsed.ec == std::errc() && parsed.ptr == part.data() + part.size();
    current = get_item(current, is_index ? Value::integer(index) : Value::string(part));
  }
  return current;
}

Value string_result(std::string s) { return Value::string(std::move(s)); }

// ---- filters

Value filter_abs(const Value& input, Arguments& arguments) {
  Parameters("abs", arguments, {});
  if (input.kind() == Value::Kind::kFloat) return Value::number(std::fabs(input.as_float()));
  JAMBO_REQUIRE(input.is_number(), "bad operand type for abs(): '{}'", type_name(input));
  JAMBO_REQUIRE(input.as_int() != INT64_MIN, "integer overflow");
  return Value::integer(std::llabs(input.as_int()));
}

Value filter_capitalize(const Value& input, Arguments& arguments) {
  Parameters("capitalize", arguments, {});
  return string_result(text::capitalize(to_str(input)));
}

Value filter_default(const Value& input, Arguments& arguments) {
  Parameters p("default", arguments, {"default_value", "boolean"});
  if (input.is_undefined() || (p.flag(1) && !truthy(input))) return p.given(0) ? p[0] : Value::string("");
  return input;
}

Value filter_first(const Value& input, Arguments& arguments) {
  Parameters("first", arguments, {});
  const List items = iterate(input);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value filter_last(const Value& input, Arguments& arguments) {
  Parameters("last", arguments, {});
  const List items = iterate(input);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

std::optional<double> parse_float(std::string s) {
  s = text::strip(s, std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return value;
}

Value filter_float(const Value& input, Arguments& arguments) {
  Parameters p("float", arguments, {"default"});
  if (input.is_number()) return Value::number(input.as_float());
  if (input.is_string())
    if (const auto value = parse_float(input.as_string())) return Value::number(*value);
  return p.given(0) ? p[0] : Value::number(0.0);
}

Value filter_int(const Value& input, Arguments& arguments) {
  Parameters p("int", arguments, {"default", "base"});
  const Value fallback = p.given(0) ? p[0] : Value::integer(0);
  if (input.kind() == Value::Kind::kFloat) {
    const double value = std::trunc(input.as_float());
    if (!std::isfinite(value) || std::fabs(value) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(value));
  }
  if (input.is_number()) return Value::integer(input.as_int());
  if (!input.is_string()) return fallback;
  std::string s = text::strip(input.as_string(), std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  try {
    size_t used = 0;
    const int64_t value = std::stoll(s, &used, static_cast<int>(p.integer(1, 10)));
    if (used == s.size()) return Value::integer(value);
  } catch (const std::exception&) {
  }
  if (const auto value = parse_float(s); value && std::fabs(*value) < 9.2e18)
    return Value::integer(static_cast<int64_t>(std::trunc(*value)));
  return fallback;
}

Value filter_items(const Value& input, Arguments& arguments) {
  Parameters("items", arguments, {});
  if (input.is_undefined()) return Value::list({});
  JAMBO_REQUIRE(input.kind() == Value::Kind::kDict, "can only get item pairs from a mapping, not '{}'",
                type_name(input));
  List pairs;
  for (const auto& [key, value] : input.as_dict().entries) pairs.push_back(Value::tuple({Value::string(key), value}));
  return Value::list(std::move(pairs));
}

Value filter_indent(const Value& input, Arguments& arguments) {
  Parameters p("indent", arguments, {"width", "first", "blank"});
  const std::string indentation = p.given(0) && p[0].is_string() ? p[0].as_string() : std::string(p.integer(0, 4), ' ');
  std::vector<std::string> lines = text::split(to_str(input), std::string("\n"), -1);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if ((i > 0 || p.flag(1)) && (p.flag(2) || !lines[i].empty())) out += indentation;
    out += lines[i];
  }
  return string_result(std::move(out));
}

Value filter_join(const Value& input, Arguments& arguments) {
  Parameters p("join", arguments, {"d", "attribute"});
  const std::string separator = p.given(0) ? to_str(p[0]) : "";
  std::string out;
  const List items = iterate(input);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += to_str(p.given(1) ? attribute_of(items[i], to_str(p[1])) : items[i]);
  }
  return string_result(std::move(out));
}

Value filter_length(const Value& input, Arguments& arguments) {
  Parameters("length", arguments, {});
  return Value::integer(length_of(input));
}

Value filter_list(const Value& input, Arguments& arguments) {
  Parameters("list", arguments, {});
  return Value::list(iterate(input));
}

Value filter_lower(const Value& input, Arguments& arguments) {
  Parameters("lower", arguments, {});
  return string_result(text::lower(to_str(input)));
}

Value filter_upper(const Value& input, Arguments& arguments) {
  Parameters("upper", arguments, {});
  return string_result(text::upper(to_str(input)));
}

Value filter_map(const Value& input, Arguments& arguments) {
  List out;
  const auto keyword = [&](std::string_view name) -> const Value* {
    for (const auto& [key, value] : arguments.keyword)
      if (key == name) return &value;
    return nullptr;
  };
  if (const Value* attribute = keyword("attribute")) {
    const Value* fallback = keyword("default");
    for (const Value& item : iterate(input)) {
      Value value = attribute_of(item, to_str(*attribute));
      out.push_back(value.is_undefined() && fallback ? *fallback : value);
    }
    return Value::list(std::move(out));
  }
  JAMBO_REQUIRE(!arguments.positional.empty(), "map() needs a filter name or attribute=");
  const std::string name = require_string(arguments.positional[0], "map()'s filter name");
  JAMBO_REQUIRE(has_filter(name), "no filter named '{}'", name);
  const Arguments rest{{arguments.positional.begin() + 1, arguments.positional.end()}, arguments.keyword};
  for (const Value& item : iterate(input)) {
    Arguments call = rest;
    out.push_back(apply_filter(name, item, call));
  }
  return Value::list(std::move(out));
}

// select, reject, selectattr and rejectattr.
Value select_items(const Value& input, Arguments& arguments, bool keep, bool by_attribute) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    JAMBO_REQUIRE(!arguments.positional.empty(), "selectattr() needs an attribute name");
    attribute = require_string(arguments.positional[next++], "the attribute name");
  }
  std::optional<std::string> test;
  if (arguments.positional.size() > next) test = require_string(arguments.positional[next++], "the test name");
  JAMBO_REQUIRE(!test || has_test(*test), "no test named '{}'", *test);
  const Arguments test_arguments{{arguments.positional.begin() + next, arguments.positional.end()}, arguments.keyword};
  List out;
  for (const Value& item : iterate(input)) {
    const Value value = by_attribute ? attribute_of(item, attribute) : item;
    Arguments call = test_arguments;
    if ((test ? apply_test(*test, value, call) : truthy(value)) == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_select(const Value& input, Arguments& arguments) { return select_items(input, arguments, true, false); }
Value filter_reject(const Value& input, Arguments& arguments) { return select_items(input, arguments, false, false); }
Value filter_selectattr(const Value& input, Arguments& arguments) { return select_items(input, arguments, true, true); }
Value filter_rejectattr(const Value& input, Arguments& arguments) {
  return select_items(input, arguments, false, true);
}

Value filter_replace(const Value& input, Arguments& arguments) {
  Parameters p("replace", arguments, {"old", "new", "count"});
  return string_result(text::replace(to_str(input), require_string(p[0], "replace()'s old"),
                                     require_string(p[1], "replace()'s new"), p.integer(2, -1)));
}

Value filter_reverse(const Value& input, Arguments& arguments) {
  Parameters("reverse", arguments, {});
  List items = iterate(input);
  std::reverse(items.begin(), items.end());
  if (!input.is_string()) return Value::list(std::move(items));
  std::string out;
  for (const Value& character : items) out += character.as_string();
  return string_result(std::move(out));
}

Value filter_round(const Value& input, Arguments& arguments) {
  Parameters p("round", arguments, {"precision", "method"});
  JAMBO_REQUIRE(input.is_number(), "round() needs a number, not '{}'", type_name(input));
  const std::string method = p.text(1).value_or("common");
  JAMBO_REQUIRE(method == "common" || method == "ceil" || method == "floor",
                "round()'s method must be 'common', 'ceil' or 'floor'");
  if (method == "common" && input.kind() != Value::Kind::kFloat) return Value::integer(input.as_int());
  const double scale = std::pow(10.0, static_cast<double>(p.integer(0, 0)));
  const double scaled = input.as_float() * scale;
  const double rounded = method == "ceil"    ? std::ceil(scaled)
                         : method == "floor" ? std::floor(scaled)
                                             : std::nearbyint(scaled);
  return Value::number(rounded / scale);
}

Value filter_string(const Value& input, Arguments& arguments) {
  Parameters("string", arguments, {});
  return input.is_string() ? input : string_result(to_str(input));
}

// The sort, unique, min and max key: an attribute, lower-cased unless case_sensitive.
std::vector<Value> keys_of(const List& items, const Parameters& p, size_t case_sensitive, size_t attribute) {
  std::vector<Value> keys;
  for (const Value& item : items) {
    Value key = p.given(attribute) ? attribute_of(item, to_str(p[attribute])) : item;
    if (!p.flag(case_sensitive) && key.is_string()) key = Value::string(text::lower(key.as_string()));
    keys.push_back(std::move(key));
  }
  return keys;
}

Value filter_sort(const Value& input, Arguments& arguments) {
  Parameters p("sort", arguments, {"reverse", "case_sensitive", "attribute"});
  const List items = iterate(input);
  const std::vector<Value> keys = keys_of(items, p, 1, 2);
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  const bool descending = p.flag(0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int c = compare(keys[a], keys[b]);
    return descending ? c > 0 : c < 0;
  });
  List sorted;
  for (size_t i : order) sorted.push_back(items[i]);
  return Value::list(std::move(sorted));
}

Value filter_unique(const Value& input, Arguments& arguments) {
  Parameters p("unique", arguments, {"case_sensitive", "attribute"});
  const List items = iterate(input);
  const std::vector<Value> keys = keys_of(items, p, 0, 1);
  List out;
  for (size_t i = 0; i < items.size(); ++i)
    if (std::none_of(keys.begin(), keys.begin() + i, [&](const Value& key) { return equals(key, keys[i]); }))
      out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value extreme(const Value& input, Arguments& arguments, bool maximum) {
  Parameters p(maximum ? "max" : "min", arguments, {"case_sensitive", "attribute"});
  const List items = iterate(input);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const std::vector<Value> keys = keys_of(items, p, 0, 1);
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i)
    if (maximum ? compare(keys[i], keys[best]) > 0 : compare(keys[i], keys[best]) < 0) best = i;
  return items[best];
}

Value filter_max(const Value& input, Arguments& arguments) { return extreme(input, arguments, true); }
Value filter_min(const Value& input, Arguments& arguments) { return extreme(input, arguments, false); }

Value filter_sum(const Value& input, Arguments& arguments) {
  Parameters p("sum", arguments, {"attribute", "start"});
  Value total = p.given(1) ? p[1] : Value::integer(0);
  for (const Value& item : iterate(input)) {
    const Value value = p.given(0) ? attribute_of(item, to_str(p[0])) : item;
    JAMBO_REQUIRE(total.is_number() && value.is_number(), "sum() adds numbers, not '{}'", type_name(value));
    if (total.kind() == Value::Kind::kFloat || value.kind() == Value::Kind::kFloat) {
      total = Value::number(total.as_float() + value.as_float());
    } else {
      int64_t sum = 0;
      JAMBO_REQUIRE(!__builtin_add_overflow(total.as_int(), value.as_int(), &sum), "integer overflow");
      total = Value::integer(sum);
    }
  }
  return total;
}

Value filter_title(const Value& input, Arguments& arguments) {
  Parameters("title", arguments, {});
  return string_result(text::title(to_str(input)));
}

// transformers replaces jinja2's tojson with json.dumps(x, ensure_ascii, indent, separators,
// sort_keys): no HTML escaping, and positional arguments in that order.
Value filter_tojson(const Value& input, Arguments& arguments) {
  Parameters p("tojson", arguments, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat format;
  format.ensure_ascii = p.flag(0);
  if (p.given(1)) {
    format.indent = p[1].is_string() ? p[1].as_string() : std::string(std::max<int64_t>(p.integer(1, 0), 0), ' ');
    format.item_separator.assign(1, ',');
  }
  if (p.given(2)) {
    JAMBO_REQUIRE(p[2].is_sequence() && p[2].as_list().size() == 2, "tojson()'s separators must be a pair of strings");
    format.item_separator = require_string(p[2].as_list()[0], "a separator");
    format.key_separator = require_string(p[2].as_list()[1], "a separator");
  }
  format.sort_keys = p.flag(3);
  return string_result(to_json(input, format));
}

Value filter_trim(const Value& input, Arguments& arguments) {
  Parameters p("trim", arguments, {"chars"});
  return string_result(text::strip(to_str(input), p.text(0), true, true));
}

using Filter = Value (*)(const Value&, Arguments&);

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"abs", filter_abs},         {"capitalize", filter_capitalize},
      {"count", filter_length},    {"d", filter_default},
      {"default", filter_default}, {"first", filter_first},
      {"float", filter_float},     {"indent", filter_indent},
      {"int", filter_int},         {"items", filter_items},
      {"join", filter_join},       {"last", filter_last},
      {"length", filter_length},   {"list", filter_list},
      {"lower", filter_lower},     {"map", filter_map},
      {"max", filter_max},         {"min", filter_min},
      {"reject", filter_reject},   {"rejectattr", filter_rejectattr},
      {"replace", filter_replace}, {"reverse", filter_reverse},
      {"round", filter_round},     {"safe", filter_string},
      {"select", filter_select},   {"selectattr", filter_selectattr},
      {"sort", filter_sort},       {"string", filter_string},
      {"sum", filter_sum},         {"title", filter_title},
      {"tojson", filter_tojson},   {"trim", filter_trim},
      {"unique", filter_unique},   {"upper", filter_upper},
  };
  return table;
}

// ---- tests

bool has_cased(const std::string& s, bool upper) {
  bool any = false;
  for (char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      if ((c >= 'A' && c <= 'Z') != upper) return false;
      any = true;
    }
  }
  return any;
}

bool is_same(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return &a.as_list() == &b.as_list();
    case Value::Kind::kDict:
      return &a.as_dict() == &b.as_dict();
    case Value::Kind::kFloat:
    case Value::Kind::kString:
      return false;  // Python's identity of two equal strings is an accident
    default:
      return equals(a, b);
  }
}

bool run_test(std::string_view name, const Value& v, const Parameters& p) {
  using Kind = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "true") return v.kind() == Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Kind::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == Kind::kDict;
  if (name == "iterable" || name == "sequence")
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind() == Kind::kDict;
  if (name == "callable") return v.kind() == Kind::kFunction;
  if (name == "lower") return v.is_string() && has_cased(v.as_string(), false);
  if (name == "upper") return v.is_string() && has_cased(v.as_string(), true);
  if (name == "filter") return v.is_string() && has_filter(v.as_string());
  if (name == "test") return v.is_string() && has_test(v.as_string());
  if (name == "escaped") return false;
  if (name == "even" || name == "odd") {
    JAMBO_REQUIRE(v.is_number() && v.kind() != Kind::kFloat, "'{}' needs an integer, not '{}'", name, type_name(v));
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const int64_t divisor = p.integer(0, 0);
    JAMBO_REQUIRE(divisor != 0 && v.is_number() && v.kind() != Kind::kFloat, "'divisibleby' needs integers, not zero");
    return v.as_int() % divisor == 0;
  }
  if (name == "sameas") return is_same(v, p[0]);
  if (name == "in") return contains(p[0], v);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, p[0]);
  if (name == "ne" || name == "!=") return !equals(v, p[0]);
  if (v.is_undefined()) fail_undefined(v);
  if (p[0].is_undefined()) fail_undefined(p[0]);
  const int order = compare(v, p[0]);
  if (name == "lt" || name == "lessthan" || name == "<") return order < 0;
  if (name == "le" || name == "<=") return order <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return order > 0;
  return order >= 0;  // ge, >=
}

constexpr std::string_view kTests[] = {
    "defined",  "undefined",   "none",     "boolean",  "true",  "false",       "integer", "float", "number",  "string",
    "mapping",  "iterable",    "sequence", "callable", "lower", "upper",       "filter",  "test",  "escaped", "even",
    "odd",      "divisibleby", "sameas",   "in",       "eq",    "equalto",     "==",      "ne",    "!=",      "lt",
    "lessthan", "<",           "le",       "<=",       "gt",    "greaterthan", ">",       "ge",    ">="};

constexpr std::string_view kNoArgumentTests[] = {"defined",  "undefined", "none",   "boolean", "true",    "false",
                                                 "integer",  "float",     "number", "string",  "mapping", "iterable",
                                                 "sequence", "callable",  "lower",  "upper",   "filter",  "test",
                                                 "escaped",  "even",      "odd"};

// ---- methods of str and dict

Value method(const Value& self, const std::string& name, Value (*body)(const Value&, Arguments&)) {
  return Value::function(name, [self, body](Arguments& arguments) { return body(self, arguments); });
}

Value strip_method(const Value& s, Arguments& arguments, std::string_view name, bool left, bool right) {
  Parameters p(name, arguments, {"chars"});
  return string_result(text::strip(s.as_string(), p.text(0), left, right));
}

// str.startswith and str.endswith: the argument is a string or a tuple of strings.
Value affix_method(const Value& s, Arguments& arguments, bool prefix) {
  Parameters p(prefix ? "startswith" : "endswith", arguments, {prefix ? "prefix" : "suffix"});
  const List affixes = p[0].is_sequence() ? p[0].as_list() : List{p[0]};
  return Value::boolean(std::any_of(affixes.begin(), affixes.end(), [&](const Value& affix) {
    const std::string& text = require_string(affix, prefix ? "startswith()'s prefix" : "endswith()'s suffix");
    return prefix ? s.as_string().starts_with(text) : s.as_string().ends_with(text);
  }));
}

using Method = Value (*)(const Value&, Arguments&);

const std::unordered_map<std::string_view, Method>& string_methods() {
  static const std::unordered_map<std::string_view, Method> table = {
      {"strip", [](const Value& s, Arguments& a) { return strip_method(s, a, "strip", true, true); }},
      {"lstrip", [](const Value& s, Arguments& a) { return strip_method(s, a, "lstrip", true, false); }},
      {"rstrip", [](const Value& s, Arguments& a) { return strip_method(s, a, "rstrip", false, true); }},
      {"startswith", [](const Value& s, Arguments& a) { return affix_method(s, a, true); }},
      {"endswith", [](const Value& s, Arguments& a) { return affix_method(s, a, false); }},
      {"split",
       [](const Value& s, Arguments& a) {
         Parameters p("split", a, {"sep", "maxsplit"});
         List parts;
         for (std::string& part : text::split(s.as_string(), p.text(0), p.integer(1, -1)))
           parts.push_back(Value::string(std::move(part)));
         return Value::list(std::move(parts));
       }},
      {"upper", filter_upper},
      {"lower", filter_lower},
      {"title",
       [](const Value& s, Arguments& a) {
         Parameters("title", a, {});
         return string_result(text::python_title(s.as_string()));
       }},
      {"capitalize", filter_capitalize},
      {"replace", filter_replace},
      {"find",
       [](const Value& s, Arguments& a) {
         Parameters p("find", a, {"sub"});
         const size_t found = s.as_string().find(require_string(p[0], "find()'s argument"));
         return Value::integer(found == std::string::npos
                                   ? -1
                                   : static_cast<int64_t>(text::code_point_count(s.as_string().substr(0, found))));
       }},
      {"count",
       [](const Value& s, Arguments& a) {
         Parameters p("count", a, {"sub"});
         const std::string& sub = require_string(p[0], "count()'s argument");
         if (sub.empty()) return Value::integer(static_cast<int64_t>(text::code_point_count(s.as_string())) + 1);
         int64_t count = 0;
         for (size_t at = s.as_string().find(sub); at != std::string::npos;
              at = s.as_string().find(sub, at + sub.size()))
           ++count;
         return Value::integer(count);
       }},
      {"join",
       [](const Value& s, Arguments& a) {
         Parameters p("join", a, {"iterable"});
         std::string out;
         const List items = iterate(p[0]);
         for (size_t i = 0; i < items.size(); ++i) {
           if (i > 0) out += s.as_string();
           out += require_string(items[i], "join()'s items");
         }
         return string_result(std::move(out));
       }},
  };
  return table;
}

const std::unordered_map<std::string_view, Method>& dict_methods() {
  static const std::unordered_map<std::string_view, Method> table = {
      {"items", [](const Value& d, Arguments& a) { return filter_items(d, a); }},
      {"keys",
       [](const Value& d, Arguments& a) {
         Parameters("keys", a, {});
         return Value::list(iterate(d));
       }},
      {"values",
       [](const Value& d, Arguments& a) {
         Parameters("values", a, {});
         List values;
         for (const auto& entry : d.as_dict().entries) values.push_back(entry.second);
         return Value::list(std::move(values));
       }},
      {"get",
       [](const Value& d, Arguments& a) {
         Parameters p("get", a, {"key", "default"});
         const Value* found = p[0].is_string() ? d.as_dict().find(p[0].as_string()) : nullptr;
         return found ? *found : p.given(1) ? p[1] : Value::none();
       }},
  };
  return table;
}

std::string object_description(const Value& value) {
  return value.is_none() ? "'None'" : fmt::format("'{} object'", type_name(value));
}

// Python's slice index rules: negative from the end, clamped to the sequence.
std::vector<size_t> slice_indices(int64_t length, const Value& start, const Value& stop, const Value& step) {
  const auto bound = [](const Value& v, std::string_view what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    JAMBO_REQUIRE(v.is_int() || v.kind() == Value::Kind::kBool, "slice {} must be an integer, not '{}'", what,
                  type_name(v));
    return v.as_int();
  };
  const int64_t stride = bound(step, "step").value_or(1);
  JAMBO_REQUIRE(stride != 0, "slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> index, int64_t fallback) {
    if (!index) return fallback;
    int64_t i = *index < 0 ? *index + length : *index;
    if (i < 0) return stride < 0 ? int64_t{-1} : int64_t{0};
    if (i >= length) return stride < 0 ? length - 1 : length;
    return i;
  };
  const int64_t first = clamp(bound(start, "start"), stride < 0 ? length - 1 : 0);
  const int64_t last = clamp(bound(stop, "stop"), stride < 0 ? -1 : length);
  std::vector<size_t> indices;
  for (int64_t i = first; stride > 0 ? i < last : i > last; i += stride) indices.push_back(static_cast<size_t>(i));
  return indices;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().contains(name); }

bool has_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

Value apply_filter(std::string_view name, const Value& input, Arguments& arguments) {
  const auto found = filters().find(name);
  JAMBO_REQUIRE(found != filters().end(), "no filter named '{}'", name);
  return found->second(input, arguments);
}

bool apply_test(std::string_view name, const Value& input, Arguments& arguments) {
  JAMBO_REQUIRE(has_test(name), "no test named '{}'", name);
  const bool no_argument =
      std::find(std::begin(kNoArgumentTests), std::end(kNoArgumentTests), name) != std::end(kNoArgumentTests);
  if (no_argument) return run_test(name, input, Parameters(name, arguments, {}));
  Parameters p(name, arguments, {"other"});
  JAMBO_REQUIRE(p.provided(0), "the test '{}' needs an argument", name);
  return run_test(name, input, p);
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(object);
    case Value::Kind::kDict: {
      if (const auto found = dict_methods().find(name); found != dict_methods().end())
        return method(object, name, found->second);
      if (const Value* value = object.as_dict().find(name)) return *value;
      break;
    }
    case Value::Kind::kNamespace:
      if (const Value* value = object.namespace_attributes().find(name)) return *value;
      break;
    case Value::Kind::kString:
      if (const auto found = string_methods().find(name); found != string_methods().end())
        return method(object, name, found->second);
      break;
    default:
      break;
  }
  return Value::undefined(fmt::format("{} has no attribute '{}'", object_description(object), name));
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  if (key.is_undefined()) fail_undefined(key);
  const bool integer_key = key.is_int() || key.kind() == Value::Kind::kBool;
  if (integer_key && (object.is_sequence() || object.is_string())) {
    const std::vector<size_t> offsets =
        object.is_string() ? text::code_point_offsets(object.as_string()) : std::vector<size_t>{};
    const int64_t length =
        object.is_string() ? static_cast<int64_t>(offsets.size()) - 1 : static_cast<int64_t>(object.as_list().size());
    const int64_t index = key.as_int() < 0 ? key.as_int() + length : key.as_int();
    if (index < 0 || index >= length)
      return Value::undefined(fmt::format("{} has no element {}", object_description(object), key.as_int()));
    if (object.is_sequence()) return object.as_list()[index];
    return Value::string(object.as_string().substr(offsets[index], offsets[index + 1] - offsets[index]));
  }
  if (object.kind() == Value::Kind::kDict && key.is_string())
    if (const Value* value = object.as_dict().find(key.as_string())) return *value;
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(fmt::format("{} has no element {}", object_description(object), to_repr(key)));
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_string()) {
    const std::string& s = object.as_string();
    const std::vector<size_t> offsets = text::code_point_offsets(s);
    std::string out;
    for (size_t i : slice_indices(static_cast<int64_t>(offsets.size()) - 1, start, stop, step))
      out += s.substr(offsets[i], offsets[i + 1] - offsets[i]);
    return Value::string(std::move(out));
  }
  JAMBO_REQUIRE(object.is_sequence(), "'{}' object is not subscriptable with a slice", type_name(object));
  const List& items = object.as_list();
  List out;
  for (size_t i : slice_indices(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[i]);
  return object.kind() == Value::Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      JAMBO_REQUIRE(item.is_string(), "'in <string>' requires a string as left operand, not '{}'", type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& element) { return equals(element, item); });
    case Value::Kind::kDict:
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      fail("argument of type '{}' is not iterable", type_name(container));
  }
}

Dict global_functions() {
  Dict globals;
  globals.set(
      "range", Value::function("range", [](Arguments& arguments) {
        JAMBO_REQUIRE(arguments.keyword.empty() && !arguments.positional.empty() && arguments.positional.size() <= 3,
                      "range() takes 1 to 3 integer arguments");
        std::vector<int64_t> bounds;
        for (const Value& v : arguments.positional) {
          JAMBO_REQUIRE(v.is_int() || v.kind() == Value::Kind::kBool, "range() needs integers, not '{}'", type_name(v));
          bounds.push_back(v.as_int());
        }
        const int64_t start = bounds.size() > 1 ? bounds[0] : 0;
        const int64_t stop = bounds.size() > 1 ? bounds[1] : bounds[0];
        const int64_t step = bounds.size() > 2 ? bounds[2] : 1;
        JAMBO_REQUIRE(step != 0, "range() arg 3 must not be zero");
        const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - start) / step));
        JAMBO_REQUIRE(count <= kMaxListLength, "range() of {:.0f} items is beyond the limit of {}", count,
                      kMaxListLength);
        List items;
        for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) items.push_back(Value::integer(start + i * step));
        return Value::list(std::move(items));
      }));
  const auto keyword_dict = [](std::string_view function, Arguments& arguments) {
    JAMBO_REQUIRE(arguments.positional.size() <= 1, "{}() takes at most 1 positional argument", function);
    Dict dict;
    if (!arguments.positional.empty()) {
      JAMBO_REQUIRE(arguments.positional[0].kind() == Value::Kind::kDict, "{}() takes a dict, not '{}'", function,
                    type_name(arguments.positional[0]));
      dict = arguments.positional[0].as_dict();
    }
    for (auto& [key, value] : arguments.keyword) dict.set(key, value);
    return dict;
  };
  globals.set("namespace", Value::function("namespace", [keyword_dict](Arguments& arguments) {
                return Value::namespace_object(keyword_dict("namespace", arguments));
              }));
  globals.set("dict", Value::function("dict", [keyword_dict](Arguments& arguments) {
                return Value::dict(keyword_dict("dict", arguments));
              }));
  globals.set("raise_exception", Value::function("raise_exception", [](Arguments& arguments) -> Value {
                Parameters p("raise_exception", arguments, {"message"});
                throw RaisedException(to_str(p[0]));
              }));
  globals.set("strftime_now", Value::function("strftime_now", [](Arguments& arguments) {
                Parameters p("strftime_now", arguments, {"format"});
                const std::string format = require_string(p[0], "strftime_now()'s format");
                const std::time_t now = std::time(nullptr);
                std::tm local{};
                localtime_r(&now, &local);
                char buffer[256];
                const size_t length = std::strftime(buffer, sizeof buffer, format.c_str(), &local);
                return Value::string(std::string(buffer, length));
              }));
  return globals;
}

}  // namespace jambo::chat_template
