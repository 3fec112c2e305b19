// The SVG plots of jambo's reports (`jambo compare --report`, `jambo bench --plot`): one frame geometry, its
// ticks and axis labels, and a labelled bar chart. Self-contained markup: no script, nothing fetched.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>

namespace jambo::forensics {

// Text made safe for HTML and SVG element content and attribute values.
std::string html_escape(std::string_view text);

namespace svg {

// Every plot is kWidth x kHeight; its data area is [kLeft, kRight] x [kTop, kBottom].
constexpr double kWidth = 900, kHeight = 320;
constexpr double kLeft = 80, kRight = 880, kTop = 20, kBottom = 260;

template <typename... Args>
void append(std::string& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
}

// A tick step of 1, 2 or 5 times a power of ten that puts fewer than max_ticks ticks on [0, span].
int64_t tick_step(int64_t span, int64_t max_ticks);

// Opens the <svg> element (its title for screen readers and tooltips) and frames the data area.
void open(std::string& out, std::string_view title);
void axis_labels(std::string& out, std::string_view x_label, std::string_view y_label);
void y_tick(std::string& out, double y, std::string_view label);  // a grid line across the data area
void x_tick(std::string& out, double x, std::string_view label);

struct Bar {
  std::string label;  // under the bar
  double value = 0;   // its height, from zero
  std::string note;   // over the bar (and in its tooltip)
};

// Bars from zero on a linear axis with ticks; a closed <svg> element.
std::string bar_chart(std::string_view title, std::string_view x_label, std::string_view y_label,
                      std::span<const Bar> bars);

}  // namespace svg
}  // namespace jambo::forensics
