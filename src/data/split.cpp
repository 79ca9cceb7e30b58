// split.cpp — the held-out sequences at the end of a token file (docs/data.md, "Held-out data").
#include "data/split.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace piper::data {

int64_t sequence_count(int64_t n, int64_t T) {
  if (T < 1) throw std::logic_error("sequence_count: seq_len " + std::to_string(T) + " is not at least 1");
  return n > T ? (n - 1) / T : 0;
}

Split split_tail(int64_t n, int64_t T, double fraction) {
  if (!(fraction >= 0.0 && fraction < 1.0))
    throw std::logic_error("split_tail: fraction " + std::to_string(fraction) + " is not in [0, 1)");
  Split s;
  s.sequences = sequence_count(n, T);
  s.train = {0, n};
  if (fraction == 0.0) return s;
  s.held = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(s.sequences)));
  const int64_t kept = s.sequences - s.held;
  s.train = {0, kept * T};
  s.held_out = {kept * T, s.held * T + 1};
  return s;
}

}  // namespace piper::data
