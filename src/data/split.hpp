// split.hpp — held-out data (docs/data.md, "Held-out data"): the whole sequences of a token file,
// and which of them the training order draws from and which it never sees.
#pragma once

#include <cstdint>

#include "data/token_file.hpp"

namespace piper::data {

// The whole sequences of n tokens at seq_len T: sequence k is tokens [k*T, k*T + T] (T + 1 tokens,
// a sample that does not wrap), so there are (n - 1) / T of them (0 when n <= T). T >= 1.
int64_t sequence_count(int64_t n, int64_t T);

// What the training order draws from, and the held-out sequences it never sees.
struct Split {
  TokenRange train;            // the training order's tokens (docs/model.md, "Data order")
  TokenRange held_out;         // held-out sequence k is sample k of this range (no wrap for k < held)
  int64_t sequences = 0;       // S, the whole sequences of the file (sequence_count)
  int64_t held = 0;            // E, how many of them are held out; 0 = none
};

// The last E = ceil(fraction x S) of the S whole sequences of a file of n tokens held out, the
// product rounded to a double first (Python's math.ceil(fraction * S)): held_out is tokens
// [(S - E) T, S T], train is tokens [0, (S - E) T). fraction 0 holds out nothing: train is every
// token, [0, n). 0 <= fraction < 1; E = S leaves train empty (count 0), which the caller refuses.
Split split_tail(int64_t n, int64_t T, double fraction);

}  // namespace piper::data
