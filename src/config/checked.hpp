// checked.hpp — size arithmetic on config values in checked 64-bit integers.
// Every product of sizes that comes from a config (parameter counts, tokens per
// step, activation bytes) goes through these, so a value that passed parsing
// can never wrap around: validate() refuses configs whose products leave the
// documented bounds (docs/config.md, "Bounds"), and code that sizes things
// from a config built without validate() gets a ConfigError instead of a
// wrapped number.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "config/config.hpp"

namespace piper::config {

// a * b, or std::nullopt when the product does not fit int64_t.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or std::nullopt when the sum does not fit int64_t.
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of `factors` (1 for none), or std::nullopt when it, or any
// partial product on the way, does not fit int64_t.
template <class Range>
std::optional<int64_t> checked_product(const Range& factors) {
  int64_t r = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  return checked_product<std::initializer_list<int64_t>>(factors);
}

// The product of `factors`; throws ConfigError naming `what` (e.g. "the
// parameter layers.0.mixer.in_proj.weight") and the factors when it does not
// fit int64_t.
template <class Range>
int64_t size_product(const Range& factors, const std::string& what) {
  if (std::optional<int64_t> r = checked_product(factors)) return *r;
  std::string text;
  for (int64_t f : factors) text += (text.empty() ? "" : " x ") + std::to_string(f);
  throw ConfigError(what + ": the size " + text +
                    " does not fit 64-bit arithmetic; use smaller sizes (docs/config.md, Bounds)");
}
inline int64_t size_product(std::initializer_list<int64_t> factors, const std::string& what) {
  return size_product<std::initializer_list<int64_t>>(factors, what);
}

}  // namespace piper::config
