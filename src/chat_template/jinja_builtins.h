// The filters, tests, methods and global functions of the subset, with the semantics of jinja2's
// sandboxed environment as transformers configures it (its tojson, raise_exception, strftime_now).
#pragma once

#include "core/error.h"
#include "chat_template/jinja_value.h"

#include <string>
#include <string_view>

namespace jambo::chat_template {

// raise_exception('...') from a template: the message is the template author's, for the client.
class RaisedException : public Error {
 public:
  using Error::Error;
};

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(std::string_view name, const Value& input, Arguments& arguments);
bool apply_test(std::string_view name, const Value& input, Arguments& arguments);

// object.name and object[key] as jinja2 resolves them: a missing attribute, key or index is an
// undefined value, and an undefined object raises. Strings and dicts have Python's methods.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);
bool contains(const Value& container, const Value& item);  // item in container

// range, namespace, dict, raise_exception and strftime_now.
Dict global_functions();

}  // namespace jambo::chat_template
