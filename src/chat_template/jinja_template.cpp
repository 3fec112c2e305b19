#include "chat_template/jinja_template.h"

#include "core/error.h"
#include "chat_template/jinja_ast.h"
#include "chat_template/jinja_builtins.h"
#include "chat_template/jinja_lexer.h"
#include "chat_template/jinja_parser.h"
#include "chat_template/jinja_text.h"

#include <algorithm>
#include <cmath>

namespace jambo::chat_template {

struct Template::Program {
  std::string source;  // normalized, for line numbers
  Body body;
};

namespace {

struct Position {
  int line;
  int column;
};

Position position_of(std::string_view source, size_t offset) {
  offset = std::min(offset, source.size());
  const size_t line_start = source.rfind('\n', offset == 0 ? 0 : offset - 1);
  const size_t start = line_start == std::string_view::npos || offset == 0 ? 0 : line_start + 1;
  return {1 + static_cast<int>(std::count(source.begin(), source.begin() + offset, '\n')),
          1 + static_cast<int>(text::code_point_count(source.substr(start, offset - start)))};
}

// A render failure with the offset of the statement it happened in.
class LocatedError : public Error {
 public:
  LocatedError(size_t offset, const std::string& message) : Error(message), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

// Jinja's scopes: the globals, the template's top level, one per loop iteration and macro call.
struct Scope {
  std::shared_ptr<Scope> parent;
  Dict variables;

  const Value* find(std::string_view name) const {
    for (const Scope* scope = this; scope; scope = scope->parent.get())
      if (const Value* value = scope->variables.find(name)) return value;
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child_of(const ScopePtr& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

enum class Flow { kNormal, kBreak, kContinue };

bool holds_namespace(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kNamespace:
      return true;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return std::any_of(value.as_list().begin(), value.as_list().end(), holds_namespace);
    case Value::Kind::kDict:
      return std::any_of(value.as_dict().entries.begin(), value.as_dict().entries.end(),
                         [](const auto& entry) { return holds_namespace(entry.second); });
    default:
      return false;
  }
}

bool is_integral(const Value& v) { return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool; }

[[noreturn]] void fail_operands(std::string_view op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

int64_t add(int64_t x, int64_t y) {
  int64_t result = 0;
  JAMBO_REQUIRE(!__builtin_add_overflow(x, y, &result), "integer overflow");
  return result;
}

int64_t subtract(int64_t x, int64_t y) {
  int64_t result = 0;
  JAMBO_REQUIRE(!__builtin_sub_overflow(x, y, &result), "integer overflow");
  return result;
}

int64_t multiply(int64_t x, int64_t y) {
  int64_t result = 0;
  JAMBO_REQUIRE(!__builtin_mul_overflow(x, y, &result), "integer overflow");
  return result;
}

int64_t power(int64_t base, int64_t exponent) {
  if (base == 0 || base == 1) return exponent == 0 ? 1 : base;
  if (base == -1) return exponent % 2 == 0 ? 1 : -1;
  int64_t result = 1;
  for (int64_t i = 0; i < exponent; ++i) result = multiply(result, base);  // overflows within 63 rounds
  return result;
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) fail_operands(op, a, b);
  const bool integers = is_integral(a) && is_integral(b);
  const int64_t x = a.as_int(), y = b.as_int();
  if (op == "+") return integers ? Value::integer(add(x, y)) : Value::number(a.as_float() + b.as_float());
  if (op == "-") return integers ? Value::integer(subtract(x, y)) : Value::number(a.as_float() - b.as_float());
  if (op == "*") return integers ? Value::integer(multiply(x, y)) : Value::number(a.as_float() * b.as_float());
  if (op == "**") {
    if (integers && y >= 0) return Value::integer(power(x, y));
    return Value::number(std::pow(a.as_float(), b.as_float()));
  }
  JAMBO_REQUIRE(b.as_float() != 0, "division by zero");
  if (op == "/") return Value::number(a.as_float() / b.as_float());
  if (integers) {  // Python rounds // toward minus infinity and gives % the divisor's sign
    JAMBO_REQUIRE(!(x == INT64_MIN && y == -1), "integer overflow");
    int64_t quotient = x / y, remainder = x % y;
    if (remainder != 0 && ((remainder < 0) != (y < 0))) {
      --quotient;
      remainder += y;
    }
    return Value::integer(op == "//" ? quotient : remainder);
  }
  const double quotient = std::floor(a.as_float() / b.as_float());
  return Value::number(op == "//" ? quotient : a.as_float() - quotient * b.as_float());
}

class Renderer {
 public:
  Renderer(const Template::Program& program, const RenderLimits& limits) : program_(program), limits_(limits) {}

  std::string run(const Dict& variables) {
    auto globals = std::make_shared<Scope>();
    globals->variables = global_functions();
    for (const auto& [name, value] : variables.entries) globals->variables.set(name, value);
    std::string out;
    exec_body(program_.body, child_of(globals), out);
    return out;
  }

 private:
  void step() {
    if (++steps_ > limits_.max_steps) fail("the template ran for more than {} steps", limits_.max_steps);
  }

  void charge(size_t bytes) {
    built_ += bytes;
    if (built_ > limits_.max_built_bytes) fail("the template built more than {} bytes", limits_.max_built_bytes);
  }

  void charge(const Value& value) {
    if (value.is_string()) charge(value.as_string().size());
    if (value.is_sequence()) charge(value.as_list().size() * sizeof(Value));
  }

  void emit(std::string& out, std::string_view text) {
    charge(text.size());
    if (out.size() + text.size() > limits_.max_output_bytes)
      fail("the output is larger than {} bytes", limits_.max_output_bytes);
    out += text;
  }

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& stmt : body)
      if (const Flow flow = exec(*stmt, scope, out); flow != Flow::kNormal) return flow;
    return Flow::kNormal;
  }

  Flow exec(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    try {
      return exec_here(stmt, scope, out);
    } catch (const LocatedError&) {
      throw;
    } catch (const RaisedException&) {
      throw;
    } catch (const Error& error) {
      throw LocatedError(stmt.offset, error.what());
    }
  }

  Flow exec_here(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        emit(out, stmt.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        emit(out, to_str(eval(*stmt.expr, scope)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < stmt.conditions.size(); ++i)
          if (truthy(eval(*stmt.conditions[i], scope))) return exec_body(stmt.bodies[i], scope, out);
        if (stmt.bodies.size() > stmt.conditions.size()) return exec_body(stmt.bodies.back(), scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(stmt, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet: {
        Value value;
        if (stmt.expr) {
          value = eval(*stmt.expr, scope);
        } else {
          std::string text;
          exec_body(stmt.bodies[0], scope, text);
          value = Value::string(std::move(text));
        }
        assign(stmt.target, value, *scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        define_macro(stmt, scope);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope:
        exec_body(stmt.bodies[0], child_of(scope), out);
        return Flow::kNormal;
    }
    return Flow::kNormal;
  }

  void assign(const Target& target, const Value& value, Scope& scope) {
    if (!target.attribute.empty()) {
      const Value* object = scope.find(target.names[0]);
      JAMBO_REQUIRE(object && object->kind() == Value::Kind::kNamespace,
                    "cannot assign attribute on non-namespace object '{}'", target.names[0]);
      JAMBO_REQUIRE(!holds_namespace(value), "a namespace cannot hold a namespace");
      object->namespace_attributes().set(target.attribute, value);
      return;
    }
    if (!target.tuple) {
      scope.variables.set(target.names[0], value);
      return;
    }
    const List items = iterate(value);
    JAMBO_REQUIRE(items.size() == target.names.size(), "cannot unpack {} values into {} names", items.size(),
                  target.names.size());
    for (size_t i = 0; i < items.size(); ++i) scope.variables.set(target.names[i], items[i]);
  }

  void exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    List items = iterate(eval(*stmt.expr, scope));
    if (stmt.filter) {
      List kept;
      for (Value& item : items) {
        step();
        const ScopePtr iteration = child_of(scope);
        assign(stmt.target, item, *iteration);
        if (truthy(eval(*stmt.filter, iteration))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (stmt.bodies.size() > 1) exec_body(stmt.bodies[1], child_of(scope), out);
      return;
    }
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      step();
      const ScopePtr iteration = child_of(scope);
      assign(stmt.target, items[i], *iteration);
      iteration->variables.set("loop", loop_object(items, i));
      if (exec_body(stmt.bodies[0], iteration, out) == Flow::kBreak) break;
    }
  }

  static Value loop_object(const List& items, int64_t i) {
    const auto length = static_cast<int64_t>(items.size());
    Dict loop;
    loop.set("index", Value::integer(i + 1));
    loop.set("index0", Value::integer(i));
    loop.set("revindex", Value::integer(length - i));
    loop.set("revindex0", Value::integer(length - i - 1));
    loop.set("first", Value::boolean(i == 0));
    loop.set("last", Value::boolean(i == length - 1));
    loop.set("length", Value::integer(length));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < length ? items[i + 1] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("cycle", [i](Arguments& arguments) {
               JAMBO_REQUIRE(!arguments.positional.empty(), "loop.cycle() needs at least one value");
               return arguments.positional[i % arguments.positional.size()];
             }));
    return Value::dict(std::move(loop));
  }

  void define_macro(const Stmt& stmt, const ScopePtr& scope) {
    // The macro sees its defining scope when called, without keeping it alive (no cycle).
    std::weak_ptr<Scope> defining = scope;
    scope->variables.set(stmt.text, Value::function(stmt.text, [this, &stmt, defining](Arguments& arguments) {
                           return call_macro(stmt, defining.lock(), arguments);
                         }));
  }

  Value call_macro(const Stmt& macro, const ScopePtr& defining, Arguments& arguments) {
    JAMBO_REQUIRE(defining, "the macro '{}' is called after its scope ended", macro.text);
    JAMBO_REQUIRE(depth_ < limits_.max_call_depth, "macro calls nested deeper than {} levels", limits_.max_call_depth);
    const auto& parameters = macro.parameters;
    JAMBO_REQUIRE(arguments.positional.size() <= parameters.size(), "macro '{}' takes not more than {} argument(s)",
                  macro.text, parameters.size());
    const ScopePtr scope = child_of(defining);
    std::vector<bool> bound(parameters.size(), false);
    for (size_t i = 0; i < arguments.positional.size(); ++i) {
      scope->variables.set(parameters[i].first, arguments.positional[i]);
      bound[i] = true;
    }
    for (auto& [name, value] : arguments.keyword) {
      const auto found =
          std::find_if(parameters.begin(), parameters.end(), [&key = name](const auto& p) { return p.first == key; });
      JAMBO_REQUIRE(found != parameters.end(), "macro '{}' takes no keyword argument '{}'", macro.text, name);
      const size_t i = found - parameters.begin();
      JAMBO_REQUIRE(!bound[i], "macro '{}' got multiple values for argument '{}'", macro.text, name);
      scope->variables.set(name, value);
      bound[i] = true;
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (bound[i]) continue;
      const auto& [name, default_value] = parameters[i];
      scope->variables.set(name, default_value
                                     ? eval(*default_value, scope)
                                     : Value::undefined(fmt::format("parameter '{}' was not provided", name)));
    }
    ++depth_;
    std::string out;
    try {
      exec_body(macro.bodies[0], scope, out);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    return Value::string(std::move(out));
  }

  Arguments eval_arguments(const Expr& expr, const ScopePtr& scope) {
    Arguments arguments;
    for (const auto& item : expr.items) arguments.positional.push_back(eval(*item, scope));
    if (expr.star) {
      const List extra = iterate(eval(*expr.star, scope));
      arguments.positional.insert(arguments.positional.end(), extra.begin(), extra.end());
    }
    for (const auto& [name, value] : expr.keywords) arguments.keyword.emplace_back(name, eval(*value, scope));
    if (expr.star_star) {
      const Value extra = eval(*expr.star_star, scope);
      JAMBO_REQUIRE(extra.kind() == Value::Kind::kDict, "** needs a dict, not '{}'", type_name(extra));
      for (const auto& entry : extra.as_dict().entries) arguments.keyword.push_back(entry);
    }
    return arguments;
  }

  Value eval(const Expr& expr, const ScopePtr& scope) {
    step();
    switch (expr.kind) {
      case Expr::Kind::kLiteral:
        return expr.value;
      case Expr::Kind::kName:
        if (const Value* value = scope->find(expr.name)) return *value;
        return Value::undefined(fmt::format("'{}' is undefined", expr.name));
      case Expr::Kind::kAttribute:
        return get_attribute(eval(*expr.object, scope), expr.name);
      case Expr::Kind::kSubscript:
        return get_item(eval(*expr.object, scope), eval(*expr.other, scope));
      case Expr::Kind::kTest: {
        const Value input = eval(*expr.object, scope);
        Arguments arguments = eval_arguments(expr, scope);
        return Value::boolean(apply_test(expr.name, input, arguments) != expr.negated);
      }
      case Expr::Kind::kUnary:
        return unary(expr.name, eval(*expr.object, scope));
      case Expr::Kind::kCompare: {
        Value left = eval(*expr.object, scope);
        for (size_t i = 0; i < expr.items.size(); ++i) {
          Value right = eval(*expr.items[i], scope);
          if (!compare_values(expr.names[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCondition:
        if (truthy(eval(*expr.object, scope))) return eval(*expr.other, scope);
        if (expr.third) return eval(*expr.third, scope);
        return Value::undefined("the inline if-expression evaluated to false and has no else section");
      case Expr::Kind::kBinary:
        if (expr.name == "and" || expr.name == "or") {  // Python's: the deciding operand itself
          Value left = eval(*expr.object, scope);
          return truthy(left) == (expr.name == "or") ? left : eval(*expr.other, scope);
        }
        break;
      default:
        break;
    }
    // The rest build new values, charged against the render's budget.
    Value built = build(expr, scope);
    charge(built);
    return built;
  }

  Value build(const Expr& expr, const ScopePtr& scope) {
    switch (expr.kind) {
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& item : expr.items) items.push_back(eval(*item, scope));
        return expr.kind == Expr::Kind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
          const Value key = eval(*expr.items[i], scope);
          JAMBO_REQUIRE(key.is_string(), "dict keys must be strings here, not '{}'", type_name(key));
          dict.set(key.as_string(), eval(*expr.items[i + 1], scope));
        }
        return Value::dict(std::move(dict));
      }
      case Expr::Kind::kSlice: {
        const Value object = eval(*expr.object, scope);
        const auto bound = [&](size_t i) { return expr.items[i] ? eval(*expr.items[i], scope) : Value::none(); };
        return slice(object, bound(0), bound(1), bound(2));
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*expr.object, scope);
        Arguments arguments = eval_arguments(expr, scope);
        if (callee.is_undefined()) fail_undefined(callee);
        JAMBO_REQUIRE(callee.kind() == Value::Kind::kFunction, "'{}' object is not callable", type_name(callee));
        return callee.as_function().call(arguments);
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*expr.object, scope);
        Arguments arguments = eval_arguments(expr, scope);
        return apply_filter(expr.name, input, arguments);
      }
      case Expr::Kind::kBinary:
        return binary(expr.name, eval(*expr.object, scope), eval(*expr.other, scope));
      default:
        fail_internal("internal error: unknown expression");
    }
  }

  static Value unary(std::string_view op, const Value& value) {
    if (op == "not") return Value::boolean(!truthy(value));
    if (value.is_undefined()) fail_undefined(value);
    JAMBO_REQUIRE(value.is_number(), "bad operand type for unary {}: '{}'", op, type_name(value));
    if (op == "+") return value.kind() == Value::Kind::kBool ? Value::integer(value.as_int()) : value;
    if (value.kind() == Value::Kind::kFloat) return Value::number(-value.as_float());
    JAMBO_REQUIRE(value.as_int() != INT64_MIN, "integer overflow");
    return Value::integer(-value.as_int());
  }

  static bool compare_values(std::string_view op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    const int order = compare(a, b);
    return op == "<" ? order < 0 : op == "<=" ? order <= 0 : op == ">" ? order > 0 : order >= 0;
  }

  Value binary(std::string_view op, const Value& a, const Value& b) {
    if (op == "~") {
      const std::string left = to_str(a);
      const std::string right = to_str(b);
      require_size(left.size() + right.size());
      return Value::string(left + right);
    }
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (op == "+" && a.is_string() && b.is_string()) {
      require_size(a.as_string().size() + b.as_string().size());
      return Value::string(a.as_string() + b.as_string());
    }
    if (op == "+" && a.is_sequence() && a.kind() == b.kind()) {
      require_length(a.as_list().size() + b.as_list().size());
      List items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return a.kind() == Value::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (op == "*" && (is_integral(a) || is_integral(b)) &&
        (a.is_string() || a.is_sequence() || b.is_string() || b.is_sequence()))
      return repeat(is_integral(a) ? b : a, is_integral(a) ? a.as_int() : b.as_int());
    if (op == "%" && a.is_string()) fail("printf-style '%' formatting of strings is not supported");
    return arithmetic(op, a, b);
  }

  Value repeat(const Value& value, int64_t times) {
    times = std::max<int64_t>(times, 0);
    if (value.is_string()) {
      require_size(value.as_string().size() * static_cast<double>(times));
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += value.as_string();
      return Value::string(std::move(out));
    }
    require_length(value.as_list().size() * static_cast<double>(times));
    List items;
    for (int64_t i = 0; i < times; ++i) items.insert(items.end(), value.as_list().begin(), value.as_list().end());
    return value.kind() == Value::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }

  void require_size(double bytes) const {
    JAMBO_REQUIRE(bytes <= limits_.max_output_bytes, "a string longer than {} bytes", limits_.max_output_bytes);
  }
  static void require_length(double items) {
    JAMBO_REQUIRE(items <= kMaxListLength, "a list longer than {} items", kMaxListLength);
  }

  const Template::Program& program_;
  const RenderLimits& limits_;
  uint64_t steps_ = 0;
  size_t built_ = 0;
  int depth_ = 0;
};

}  // namespace

Template Template::parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->source = normalize_newlines(source);
  try {
    program->body = parse_template(program->source);
  } catch (const SyntaxError& error) {
    const Position at = position_of(program->source, error.offset());
    fail("line {}, column {}: {}", at.line, at.column, error.what());
  }
  return Template(std::move(program));
}

std::string Template::render(const Dict& variables, const RenderLimits& limits) const {
  try {
    return Renderer(*program_, limits).run(variables);
  } catch (const LocatedError& error) {
    fail("line {}: {}", position_of(program_->source, error.offset()).line, error.what());
  }
}

}  // namespace jambo::chat_template
