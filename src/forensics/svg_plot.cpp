#include "forensics/svg_plot.h"

#include <algorithm>
#include <cmath>

namespace jambo::forensics {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace svg {

int64_t tick_step(int64_t span, int64_t max_ticks) {
  for (int64_t power = 1;; power *= 10)
    for (int64_t multiple : {1, 2, 5})
      if (span / (multiple * power) < max_ticks) return multiple * power;
}

void open(std::string& out, std::string_view title) {
  append(out, R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" role="img"><title>{}</title>)", kWidth,
         kHeight, html_escape(title));
  append(out, R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)", kLeft, kTop, kRight - kLeft,
         kBottom - kTop);
}

void axis_labels(std::string& out, std::string_view x_label, std::string_view y_label) {
  append(out, R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", (kLeft + kRight) / 2, kHeight - 15,
         html_escape(x_label));
  append(out, R"svg(<text transform="translate(20 {}) rotate(-90)" text-anchor="middle">{}</text>)svg",
         (kTop + kBottom) / 2, html_escape(y_label));
}

void y_tick(std::string& out, double y, std::string_view label) {
  append(out, R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", kLeft, y, kRight, y);
  append(out, R"(<text x="{}" y="{:.1f}" text-anchor="end" dominant-baseline="middle">{}</text>)", kLeft - 6, y,
         html_escape(label));
}

void x_tick(std::string& out, double x, std::string_view label) {
  append(out, R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#333"/>)", x, kBottom, x, kBottom + 5);
  append(out, R"(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)", x, kBottom + 18, html_escape(label));
}

std::string bar_chart(std::string_view title, std::string_view x_label, std::string_view y_label,
                      std::span<const Bar> bars) {
  double top = 0.0;
  for (const Bar& bar : bars) top = std::max(top, bar.value);
  const int64_t step = tick_step(std::max<int64_t>(1, int64_t(std::ceil(top))), 6);
  const double axis_top = double(step) * std::ceil(std::max(top, 1e-9) / double(step));  // a whole tick above all
  const auto height = [&](double value) { return std::max(0.0, value) / axis_top * (kBottom - kTop); };
  const double bar_width = (kRight - kLeft) / double(std::max<size_t>(1, bars.size()));
  std::string out;
  open(out, title);
  append(out, R"(<text x="{}" y="{}">{}</text>)", kLeft, kTop - 8, html_escape(title));
  for (double value = 0; value <= axis_top; value += double(step))
    y_tick(out, kBottom - height(value), fmt::format("{}", int64_t(value)));
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& bar = bars[i];
    const double left = kLeft + double(i) * bar_width + bar_width * 0.15, width = bar_width * 0.7;
    append(out, R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#4a78b5"><title>{}: {}</title></rect>)",
           left, kBottom - height(bar.value), width, height(bar.value), html_escape(bar.label), html_escape(bar.note));
    append(out, R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", left + width / 2,
           kBottom - height(bar.value) - 4, html_escape(bar.note));
    x_tick(out, left + width / 2, bar.label);
  }
  axis_labels(out, x_label, y_label);
  out += "</svg>\n";
  return out;
}

}  // namespace svg
}  // namespace jambo::forensics
