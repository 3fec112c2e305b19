// Values of the Jinja subset: the Python types chat templates see (None, bool, int, float, str, list,
// tuple, dict), jinja2's Undefined and namespace(), and callables. Renders must match transformers
// byte for byte, so str(), repr(), ==, < and json.dumps() follow Python here, not C++ or nlohmann.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jambo::chat_template {

class Value;
using List = std::vector<Value>;

// Insertion-ordered, as Python dicts are; keys are strings (all that JSON and the templates need).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(Arguments&)> call;
};

// Lists and dicts deeper than this are refused, so that every recursive walk over a value (repr,
// tojson, ==, destruction) stays far from the stack's end, whatever the template or the request.
inline constexpr int kMaxNesting = 128;
// The longest list a template may build (range(), list * n, concatenation).
inline constexpr size_t kMaxListLength = 1 << 20;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kFunction };

  Value() = default;  // undefined
  // An undefined value remembers why it is undefined, for the error raised when it is used.
  static Value undefined(std::string reason);
  static Value none();
  static Value boolean(bool value);
  static Value integer(int64_t value);
  static Value number(double value);
  static Value string(std::string value);
  static Value list(List items);
  static Value tuple(List items);
  static Value dict(Dict dict);
  // jinja2's namespace(): the one mutable object, shared by every copy of the value.
  static Value namespace_object(Dict attributes);
  static Value function(std::string name, std::function<Value(Arguments&)> call);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return int_; }
  double as_float() const;  // of a bool, int or float
  const std::string& as_string() const { return *string_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& namespace_attributes() const { return *dict_; }
  const Function& as_function() const { return *function_; }
  const std::string& undefined_reason() const;
  int depth() const { return depth_; }

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  int depth_ = 0;
  std::shared_ptr<const std::string> string_;  // the string, or why an undefined is undefined
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> function_;
};

// Python's type name, for error messages ("unsupported operand type(s) for +: 'int' and 'str'").
std::string type_name(const Value& value);
bool truthy(const Value& value);
std::string to_str(const Value& value);   // Python str(); an undefined is ""
std::string to_repr(const Value& value);  // Python repr()
bool equals(const Value& a, const Value& b);
// Python's ordering (numbers, strings, sequences); other pairs throw as Python's TypeError does.
int compare(const Value& a, const Value& b);
std::string python_float(double value);  // Python repr() of a float: 1.0, 1e+16, 0.1

// The items a for loop visits: a list's items, a dict's keys, a string's characters.
List iterate(const Value& value);

struct JsonFormat {
  std::optional<std::string> indent;  // newline and this per level, as json.dumps(indent=...)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
std::string to_json(const Value& value, const JsonFormat& format);
Value from_json(const nlohmann::ordered_json& json);

// An undefined value used as an object: jinja2's UndefinedError.
[[noreturn]] void fail_undefined(const Value& value);

}  // namespace jambo::chat_template
