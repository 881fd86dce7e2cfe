#include "common/strict_parse.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>

namespace krug {
namespace {

// from_chars neither skips whitespace nor accepts a leading '+', which is the strictness we want;
// it only remains to insist that it consumed every character.
template <typename T>
std::optional<T> from_chars_whole(std::string_view text) {
  if (text.empty()) return std::nullopt;
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace

std::string to_lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

std::optional<int64_t> parse_int64_strict(std::string_view text) {
  return from_chars_whole<int64_t>(text);
}

std::optional<double> parse_double_strict(std::string_view text) {
  auto value = from_chars_whole<double>(text);
  if (!value || !std::isfinite(*value)) return std::nullopt;
  return value;
}

std::optional<bool> parse_bool_strict(std::string_view text) {
  const std::string lower = to_lower(text);
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

}  // namespace krug
