// deadline.hpp — the clock every bounded wait of the communicators measures with.
#pragma once

#include <chrono>

namespace piper::comm {

using Clock = std::chrono::steady_clock;

// The moment `seconds` from now.
inline Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Seconds from `t` to now.
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace piper::comm
