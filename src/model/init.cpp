// init.cpp — counter-based initialisation (splitmix64 of seed, name hash, index).
#include "model/init.hpp"

#include <cmath>

namespace piper::model {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Uniform in (0, 1) from 53 random bits, never exactly 0.
double unit_uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

double draw(uint64_t key, const ir::ParamSpec& spec) {
  const uint64_t r1 = splitmix64(key), r2 = splitmix64(key ^ 0xd1b54a32d192ed03ull);
  const double u1 = unit_uniform(r1), u2 = unit_uniform(r2);
  switch (spec.init) {
    case ir::InitKind::INIT_NORMAL:  // Box-Muller
      return spec.init_scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    case ir::InitKind::INIT_ONES:
      return 1.0;
    case ir::InitKind::INIT_UNIFORM:
      return spec.init_scale * (2.0 * u1 - 1.0);
    case ir::InitKind::INIT_A_LOG:  // A in uniform[1, 16]
      return std::log(1.0 + 15.0 * u1);
    case ir::InitKind::INIT_DT_BIAS: {  // dt log-uniform in [1e-3, 1e-1]; bias = softplus^-1(dt)
      const double dt = std::exp(std::log(1e-3) + u1 * (std::log(1e-1) - std::log(1e-3)));
      return dt + std::log(-std::expm1(-dt));
    }
  }
  return 0.0;
}

}  // namespace

float init_value(uint64_t seed, const ir::ParamSpec& spec, int64_t index) {
  const uint64_t base = splitmix64(seed ^ splitmix64(name_hash(spec.name)));
  return static_cast<float>(draw(base ^ splitmix64(static_cast<uint64_t>(index)), spec));
}

void init_range(uint64_t seed, const ir::ParamSpec& spec, int64_t first, int64_t count, float* out) {
  const uint64_t base = splitmix64(seed ^ splitmix64(name_hash(spec.name)));
#pragma omp parallel for schedule(static) if (count > 65536)
  for (int64_t i = 0; i < count; ++i)
    out[i] = static_cast<float>(draw(base ^ splitmix64(static_cast<uint64_t>(first + i)), spec));
}

}  // namespace piper::model
