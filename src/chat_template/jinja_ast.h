// The syntax tree of a parsed template. Every node keeps the byte offset it starts at, so that
// errors can name a line.
#pragma once

#include "chat_template/jinja_value.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace jambo::chat_template {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items: key, value, key, value...
    kAttribute,  // object.name
    kSubscript,  // object[index]
    kSlice,      // object[start:stop:step]; items: start, stop, step (null when left out)
    kCall,       // object(items..., keywords..., *star, **star_star)
    kFilter,     // object | name(items..., keywords...)
    kTest,       // object is [not] name(items...)
    kUnary,      // name: "-", "+" or "not"; object
    kBinary,     // name: an operator, "and", "or", "in" or "not in"; object, other
    kCompare,    // object, then names[i] applied to items[i], Python's chained comparison
    kCondition,  // other if object else third (third may be null)
  };

  Kind kind;
  size_t offset = 0;
  std::string name;
  Value value;
  ExprPtr object, other, third;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> names;
  ExprPtr star, star_star;
  bool negated = false;
  int height = 1;  // of the tree this node roots, bounded by the parser
};

// What a for loop or set assigns to: a name, a tuple of names, or a namespace attribute.
struct Target {
  std::vector<std::string> names;  // one name, or a tuple's names
  bool tuple = false;
  std::string attribute;  // set ns.attribute: names[0] is the namespace
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // conditions[i] selects bodies[i]; the last body is else when it has no condition
    kFor,     // for target in expr [if filter]: bodies[0], else: bodies[1]
    kSet,     // set target = expr, or with a body (set ... endset)
    kMacro,   // macro text(parameters): bodies[0]
    kBreak,
    kContinue,
    kScope,  // a block rendered in place (generation ... endgeneration)
  };

  Kind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr, filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Target target;
  std::vector<std::pair<std::string, ExprPtr>> parameters;  // a macro's, with defaults or null
};

}  // namespace jambo::chat_template
