#include "chat_template/jinja_parser.h"

#include "chat_template/jinja_builtins.h"
#include "chat_template/jinja_lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

namespace jambo::chat_template {
namespace {

// Deeper nesting of expressions or blocks is refused: the parser, the renderer and the tree's destructor recurse
// on it.
constexpr int kMaxParseDepth = 100;

using Names = std::initializer_list<std::string_view>;

bool contains(Names names, std::string_view name) { return std::find(names.begin(), names.end(), name) != names.end(); }

std::string quoted_list(Names names) {
  std::string out;
  size_t i = 0;
  for (std::string_view name : names) {
    out += i == 0 ? "" : i + 1 == names.size() ? " or " : ", ";
    out += fmt::format("'{}'", name);
    ++i;
  }
  return out;
}

ExprPtr make(Expr::Kind kind, size_t offset) {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->offset = offset;
  return expr;
}

// A node whose children are all in place: its height, refused past kMaxParseDepth. Operator chains such as
// `a ~ b ~ c` or `x.y.z` deepen the tree without deepening the parser's recursion, so the tree is measured too.
ExprPtr finished(ExprPtr node) {
  int below = 0;
  const auto measure = [&below](const ExprPtr& child) {
    if (child) below = std::max(below, child->height);
  };
  for (const ExprPtr* child : {&node->object, &node->other, &node->third, &node->star, &node->star_star})
    measure(*child);
  for (const ExprPtr& item : node->items) measure(item);
  for (const auto& [name, value] : node->keywords) measure(value);
  node->height = below + 1;
  if (node->height > kMaxParseDepth)
    throw SyntaxError(node->offset, fmt::format("an expression nested deeper than {} levels", kMaxParseDepth));
  return node;
}

ExprPtr make_binary(std::string op, ExprPtr left, ExprPtr right) {
  ExprPtr expr = make(Expr::Kind::kBinary, left->offset);
  expr->name = std::move(op);
  expr->object = std::move(left);
  expr->other = std::move(right);
  return finished(std::move(expr));
}

std::unique_ptr<Stmt> make_stmt(Stmt::Kind kind, size_t offset) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = kind;
  stmt->offset = offset;
  return stmt;
}

class Parser {
 public:
  Parser(std::string_view source, std::vector<Token> tokens) : source_(source), tokens_(std::move(tokens)) {}

  Body parse() { return parse_body({}, "", 0).first; }

 private:
  class DepthGuard {
   public:
    DepthGuard(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxParseDepth)
        throw SyntaxError(parser_.current().offset, fmt::format("nested deeper than {} levels", kMaxParseDepth));
    }
    ~DepthGuard() { --parser_.depth_; }

   private:
    Parser& parser_;
  };

  const Token& current() const { return tokens_[index_]; }
  const Token& peek() const { return tokens_[std::min(index_ + 1, tokens_.size() - 1)]; }
  const Token& advance() { return tokens_[index_ + 1 < tokens_.size() ? index_++ : index_]; }
  bool at_operator(std::string_view op) const {
    return current().type == TokenType::kOperator && current().value == op;
  }
  bool at_name(std::string_view name) const { return current().type == TokenType::kName && current().value == name; }
  bool skip_operator(std::string_view op) { return at_operator(op) && (advance(), true); }
  bool skip_name(std::string_view name) { return at_name(name) && (advance(), true); }

  [[noreturn]] void fail_expected(std::string_view what) const {
    throw SyntaxError(current().offset, fmt::format("expected {}, found {}", what, describe(current())));
  }
  void expect_operator(std::string_view op) {
    if (!skip_operator(op)) fail_expected(fmt::format("'{}'", op));
  }
  void expect_block_end() {
    if (current().type != TokenType::kBlockEnd) fail_expected("'%}'");
    advance();
  }
  std::string expect_name(std::string_view what) {
    if (current().type != TokenType::kName) fail_expected(what);
    return advance().value;
  }
  int line_of(size_t offset) const {
    return 1 + static_cast<int>(std::count(source_.begin(), source_.begin() + offset, '\n'));
  }

  // Statements up to one of end_tags; returns them and the end tag found (its '%}' not consumed).
  std::pair<Body, std::string> parse_body(Names end_tags, std::string_view opener, size_t opener_offset) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& token = current();
      switch (token.type) {
        case TokenType::kData: {
          auto text = make_stmt(Stmt::Kind::kText, token.offset);
          text->text = token.value;
          body.push_back(std::move(text));
          advance();
          break;
        }
        case TokenType::kVariableBegin: {
          auto output = make_stmt(Stmt::Kind::kOutput, token.offset);
          advance();
          output->expr = parse_tuple(true);
          if (current().type != TokenType::kVariableEnd) fail_expected("'}}'");
          advance();
          body.push_back(std::move(output));
          break;
        }
        case TokenType::kBlockBegin: {
          if (peek().type == TokenType::kName && contains(end_tags, peek().value)) {
            advance();
            return {std::move(body), advance().value};
          }
          advance();
          body.push_back(parse_statement(end_tags));
          break;
        }
        case TokenType::kEnd:
          if (end_tags.size() == 0) return {std::move(body), ""};
          throw SyntaxError(token.offset,
                            fmt::format("expected {} to close the '{}' at line {}, found the end of the template",
                                        quoted_list(end_tags), opener, line_of(opener_offset)));
        default:
          fail_expected("template text or a tag");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement(Names open_end_tags) {
    const size_t offset = current().offset;
    const std::string tag = expect_name("a tag name");
    if (tag == "if") return parse_if(offset);
    if (tag == "for") return parse_for(offset);
    if (tag == "set") return parse_set(offset);
    if (tag == "macro") return parse_macro(offset);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) throw SyntaxError(offset, fmt::format("'{}' outside of a for loop", tag));
      expect_block_end();
      return make_stmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, offset);
    }
    if (tag == "generation") {  // transformers' assistant-mask marker renders its body in place
      expect_block_end();
      auto scope = make_stmt(Stmt::Kind::kScope, offset);
      scope->bodies.push_back(parse_body({"endgeneration"}, tag, offset).first);
      expect_block_end();
      return scope;
    }
    if (contains({"elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration"}, tag)) {
      if (open_end_tags.size() == 0) throw SyntaxError(offset, fmt::format("unexpected '{}'", tag));
      throw SyntaxError(offset, fmt::format("unexpected '{}', expected {}", tag, quoted_list(open_end_tags)));
    }
    if (contains({"include", "import", "from", "extends", "block", "call", "filter", "with", "do", "autoescape"}, tag))
      throw SyntaxError(offset, fmt::format("the '{}' tag is not supported in chat templates", tag));
    throw SyntaxError(offset, fmt::format("unknown tag '{}'", tag));
  }

  std::unique_ptr<Stmt> parse_if(size_t offset) {
    auto stmt = make_stmt(Stmt::Kind::kIf, offset);
    stmt->conditions.push_back(parse_tuple(false));
    expect_block_end();
    while (true) {
      auto [body, end] = parse_body({"elif", "else", "endif"}, "if", offset);
      stmt->bodies.push_back(std::move(body));
      if (end == "elif") {
        stmt->conditions.push_back(parse_tuple(false));
        expect_block_end();
        continue;
      }
      expect_block_end();
      if (end == "else") {
        stmt->bodies.push_back(parse_body({"endif"}, "if", offset).first);
        expect_block_end();
      }
      return stmt;
    }
  }

  std::unique_ptr<Stmt> parse_for(size_t offset) {
    auto stmt = make_stmt(Stmt::Kind::kFor, offset);
    stmt->target = parse_target(false);
    if (!skip_name("in")) fail_expected("'in'");
    stmt->expr = parse_tuple(false, {"if", "recursive"});
    if (skip_name("if")) stmt->filter = parse_expression(true);
    if (at_name("recursive")) throw SyntaxError(current().offset, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    auto [body, end] = parse_body({"else", "endfor"}, "for", offset);
    --loop_depth_;
    stmt->bodies.push_back(std::move(body));
    expect_block_end();
    if (end == "else") {
      stmt->bodies.push_back(parse_body({"endfor"}, "for", offset).first);
      expect_block_end();
    }
    return stmt;
  }

  std::unique_ptr<Stmt> parse_set(size_t offset) {
    auto stmt = make_stmt(Stmt::Kind::kSet, offset);
    stmt->target = parse_target(true);
    if (skip_operator("=")) {
      stmt->expr = parse_tuple(true);
      expect_block_end();
      return stmt;
    }
    expect_block_end();
    stmt->bodies.push_back(parse_body({"endset"}, "set", offset).first);
    expect_block_end();
    return stmt;
  }

  std::unique_ptr<Stmt> parse_macro(size_t offset) {
    auto stmt = make_stmt(Stmt::Kind::kMacro, offset);
    stmt->text = expect_name("a macro name");
    expect_operator("(");
    bool has_default = false;
    while (!at_operator(")")) {
      if (!stmt->parameters.empty()) expect_operator(",");
      std::string name = expect_name("a parameter name");
      ExprPtr default_value;
      if (skip_operator("=")) {
        default_value = parse_expression(true);
        has_default = true;
      } else if (has_default) {
        throw SyntaxError(current().offset, "a parameter without a default follows one with a default");
      }
      stmt->parameters.emplace_back(std::move(name), std::move(default_value));
    }
    advance();
    expect_block_end();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    stmt->bodies.push_back(parse_body({"endmacro"}, "macro", offset).first);
    loop_depth_ = saved_loop_depth;
    expect_block_end();
    return stmt;
  }

  // A name, names separated by commas (optionally in parentheses), or, for set, namespace.attribute.
  Target parse_target(bool allow_attribute) {
    Target target;
    if (allow_attribute && current().type == TokenType::kName && peek().type == TokenType::kOperator &&
        peek().value == ".") {
      target.names.push_back(advance().value);
      advance();
      target.attribute = expect_name("an attribute name");
      return target;
    }
    const bool parenthesized = skip_operator("(");
    do {
      target.names.push_back(expect_name("a variable name"));
    } while (skip_operator(",") && current().type == TokenType::kName);
    if (parenthesized) expect_operator(")");
    target.tuple = target.names.size() > 1 || parenthesized;
    return target;
  }

  bool at_tuple_end(Names extra_end_names) const {
    const Token& token = current();
    return token.type == TokenType::kVariableEnd || token.type == TokenType::kBlockEnd ||
           token.type == TokenType::kEnd || at_operator(")") ||
           (token.type == TokenType::kName && contains(extra_end_names, token.value));
  }

  // Comma-separated expressions make a tuple, as in `{{ a, b }}` or `set x = 1, 2`.
  ExprPtr parse_tuple(bool with_condition, Names extra_end_names = {}, bool parenthesized = false) {
    const size_t offset = current().offset;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_operator(",");
      if (at_tuple_end(extra_end_names)) break;
      items.push_back(parse_expression(with_condition));
      if (!at_operator(",")) break;
      is_tuple = true;
    }
    if (!is_tuple && !items.empty()) return std::move(items[0]);
    if (!is_tuple && !parenthesized) fail_expected("an expression");
    ExprPtr tuple = make(Expr::Kind::kTuple, offset);
    tuple->items = std::move(items);
    return finished(std::move(tuple));
  }

  ExprPtr parse_expression(bool with_condition) {
    DepthGuard guard(*this);
    if (!with_condition) return parse_or();
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      ExprPtr condition = make(Expr::Kind::kCondition, expr->offset);
      condition->object = parse_or();
      condition->other = std::move(expr);
      if (skip_name("else")) condition->third = parse_expression(true);
      expr = finished(std::move(condition));
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (skip_name("or")) left = make_binary("or", std::move(left), parse_and());
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (skip_name("and")) left = make_binary("and", std::move(left), parse_not());
    return left;
  }

  ExprPtr parse_not() {
    if (!at_name("not")) return parse_compare();
    DepthGuard guard(*this);
    ExprPtr expr = make(Expr::Kind::kUnary, advance().offset);
    expr->name = "not";
    expr->object = parse_not();
    return finished(std::move(expr));
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr compare;
    while (true) {
      std::string op;
      if (current().type == TokenType::kOperator && contains({"==", "!=", "<", "<=", ">", ">="}, current().value)) {
        op = advance().value;
      } else if (skip_name("in")) {
        op = "in";
      } else if (at_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        break;
      }
      if (!compare) {
        compare = make(Expr::Kind::kCompare, first->offset);
        compare->object = std::move(first);
      }
      compare->names.push_back(op);
      compare->items.push_back(parse_math1());
    }
    return compare ? finished(std::move(compare)) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      std::string op = advance().value;
      left = make_binary(op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (skip_operator("~")) left = make_binary("~", std::move(left), parse_math2());
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      std::string op = advance().value;
      left = make_binary(op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (skip_operator("**")) left = make_binary("**", std::move(left), parse_unary(true));
    return left;
  }

  // A unary minus binds looser than postfix operators and tighter than filters: -x.y|abs is
  // (-(x.y))|abs, as in jinja2.
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      node = make(Expr::Kind::kUnary, current().offset);
      node->name = advance().value;
      node->object = parse_unary(false);
      node = finished(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    return with_filter ? parse_filter_expr(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    ExprPtr node = make(Expr::Kind::kLiteral, token.offset);
    switch (token.type) {
      case TokenType::kName:
        if (token.value == "true" || token.value == "True") {
          node->value = Value::boolean(true);
        } else if (token.value == "false" || token.value == "False") {
          node->value = Value::boolean(false);
        } else if (token.value == "none" || token.value == "None") {
          node->value = Value::none();
        } else {
          node->kind = Expr::Kind::kName;
          node->name = token.value;
        }
        advance();
        return node;
      case TokenType::kString: {
        std::string text;
        while (current().type == TokenType::kString) text += advance().value;
        node->value = Value::string(std::move(text));
        return node;
      }
      case TokenType::kInteger: {
        int64_t number = 0;
        std::from_chars(token.value.data(), token.value.data() + token.value.size(), number);
        node->value = Value::integer(number);
        advance();
        return node;
      }
      case TokenType::kFloat:
        node->value = Value::number(std::strtod(token.value.c_str(), nullptr));
        advance();
        return node;
      default:
        break;
    }
    if (skip_operator("(")) {
      node = parse_tuple(true, {}, true);
      expect_operator(")");
      return node;
    }
    if (at_operator("[") || at_operator("{")) return parse_collection();
    fail_expected("an expression");
  }

  // [a, b] or {k: v}; a trailing comma is allowed.
  ExprPtr parse_collection() {
    const bool is_list = at_operator("[");
    ExprPtr node = make(is_list ? Expr::Kind::kList : Expr::Kind::kDict, advance().offset);
    const std::string_view close = is_list ? "]" : "}";
    while (!at_operator(close)) {
      if (!node->items.empty()) {
        expect_operator(",");
        if (at_operator(close)) break;
      }
      node->items.push_back(parse_expression(true));
      if (!is_list) {
        expect_operator(":");
        node->items.push_back(parse_expression(true));
      }
    }
    advance();
    return finished(std::move(node));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_operator(".")) {
        advance();
        if (current().type == TokenType::kInteger) {  // foo.0 is foo[0]
          ExprPtr subscript = make(Expr::Kind::kSubscript, node->offset);
          subscript->object = std::move(node);
          subscript->other = parse_primary();
          node = finished(std::move(subscript));
          continue;
        }
        ExprPtr attribute = make(Expr::Kind::kAttribute, node->offset);
        attribute->name = expect_name("an attribute name");
        attribute->object = std::move(node);
        node = finished(std::move(attribute));
      } else if (at_operator("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    advance();
    ExprPtr start;
    if (!at_operator(":")) {
      start = parse_expression(true);
      if (skip_operator("]")) {
        ExprPtr subscript = make(Expr::Kind::kSubscript, object->offset);
        subscript->object = std::move(object);
        subscript->other = std::move(start);
        return finished(std::move(subscript));
      }
    }
    expect_operator(":");
    ExprPtr slice = make(Expr::Kind::kSlice, object->offset);
    slice->object = std::move(object);
    slice->items.push_back(std::move(start));
    slice->items.push_back(at_operator("]") || at_operator(":") ? nullptr : parse_expression(true));
    slice->items.push_back(skip_operator(":") && !at_operator("]") ? parse_expression(true) : nullptr);
    expect_operator("]");
    return finished(std::move(slice));
  }

  // Call arguments into node: positional, name=value, *sequence and **mapping.
  void parse_arguments(Expr& node) {
    expect_operator("(");
    bool first = true;
    while (!at_operator(")")) {
      if (!first) {
        expect_operator(",");
        if (at_operator(")")) break;
      }
      first = false;
      if (skip_operator("*")) {
        node.star = parse_expression(true);
      } else if (skip_operator("**")) {
        node.star_star = parse_expression(true);
      } else if (current().type == TokenType::kName && peek().type == TokenType::kOperator && peek().value == "=") {
        std::string name = advance().value;
        advance();
        node.keywords.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!node.keywords.empty() || node.star || node.star_star)
          throw SyntaxError(current().offset, "a positional argument follows keyword arguments");
        node.items.push_back(parse_expression(true));
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr call = make(Expr::Kind::kCall, callee->offset);
    call->object = std::move(callee);
    parse_arguments(*call);
    return finished(std::move(call));
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (at_operator("|")) {
        node = parse_filter(std::move(node));
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter(ExprPtr object) {
    advance();
    ExprPtr filter = make(Expr::Kind::kFilter, current().offset);
    filter->name = expect_name("a filter name");
    while (skip_operator(".")) filter->name.append(".").append(expect_name("a filter name"));
    if (!has_filter(filter->name)) throw SyntaxError(filter->offset, fmt::format("no filter named '{}'", filter->name));
    filter->object = std::move(object);
    if (at_operator("(")) parse_arguments(*filter);
    return finished(std::move(filter));
  }

  ExprPtr parse_test(ExprPtr object) {
    advance();
    ExprPtr test = make(Expr::Kind::kTest, current().offset);
    test->negated = skip_name("not");
    test->offset = current().offset;
    test->name = expect_name("a test name");
    while (skip_operator(".")) test->name.append(".").append(expect_name("a test name"));
    if (!has_test(test->name)) throw SyntaxError(test->offset, fmt::format("no test named '{}'", test->name));
    test->object = std::move(object);
    const Token& next = current();
    const bool value_follows = next.type == TokenType::kString || next.type == TokenType::kInteger ||
                               next.type == TokenType::kFloat ||
                               (next.type == TokenType::kName && !contains({"else", "or", "and"}, next.value)) ||
                               at_operator("[") || at_operator("{");
    if (at_operator("(")) {
      parse_arguments(*test);
    } else if (value_follows) {  // `is divisibleby 3`, `is sameas false`
      if (at_name("is")) throw SyntaxError(next.offset, "tests cannot be chained with 'is'");
      test->items.push_back(parse_postfix(parse_primary()));
    }
    return finished(std::move(test));
  }

  std::string_view source_;
  std::vector<Token> tokens_;
  size_t index_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(source, tokenize(source)).parse(); }

}  // namespace jambo::chat_template
