// Strict text-to-value parsing for configuration: the whole text must be consumed, so "12x",
// "" and " 12" are rejected instead of silently read as 12 or 0. Returns nullopt on any error
// (the caller knows which knob it is and words the message).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace krug {

// Decimal integer with an optional leading '-'; nullopt on trailing text or overflow.
std::optional<int64_t> parse_int64_strict(std::string_view text);
// Finite decimal floating-point number ("1.5", "2e-3"); nullopt on trailing text, overflow
// ("1e400"), "inf" and "nan".
std::optional<double> parse_double_strict(std::string_view text);
// 1/0/true/false/yes/no/on/off, case-insensitive.
std::optional<bool> parse_bool_strict(std::string_view text);

std::string to_lower(std::string_view text);

}  // namespace krug
