// fuzz_directives.cpp — the directive reader: the `directives:` section of a config (src/config reads it,
// config::effective_strategy applies it onto the shorthand, ir::validate checks the IR's rules on it,
// ir::expand resolves the stage filters and the filters of subsets of units, and ir::compile turns it into the
// global DAG for a world size).
//
// Input: the body of a `directives:` list, appended to a fixed small config (every block kind, global
// batch 8). For each world size 1, 2, 4 and 8 that ir::validate accepts, the plan is compiled.
// Refusals: config::ConfigError (parse, validate, filters), ir::BuildError and ir::VerifyError (compile).
// Invariant: the directives `piper plan --directives` prints for a compiled plan (ir::directives_yaml)
// are accepted again and compile to the same plan hash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "fuzz.hpp"
#include "ir/compile.hpp"
#include "ir/validate.hpp"
#include "ir/strategy.hpp"

using namespace piper;

namespace {

const char* const kBase =
    "model: {pattern: \"M*-M-\", vocab_size: 32, d_model: 16, n_heads: 4, n_kv_heads: 2, ffn_hidden: 24,\n"
    "        d_state: 8, head_dim: 8, expand: 2, n_groups: 2, d_conv: 4}\n"
    "train: {global_batch: 8, seq_len: 16, steps: 2}\n";

// The plan for `world` ranks, or nullopt-like false when the config is refused there.
bool plan(const config::Config& cfg, int world, ir::Plan& out) {
  try {
    ir::validate(cfg, world);
  } catch (const config::ConfigError&) {
    return false;
  }
  try {
    out = ir::compile(cfg, world);
  } catch (const config::ConfigError&) {
    return false;
  } catch (const ir::BuildError&) {
    return false;
  } catch (const ir::VerifyError&) {
    return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  config::Config cfg;
  try {
    cfg = config::parse(std::string(kBase) + "directives:\n" + body, "fuzz.yaml");
  } catch (const config::ConfigError&) {
    ++fuzz::refused;
    return 0;
  }
  bool any = false;
  for (int world : {1, 2, 4, 8}) {
    ir::Plan p;
    if (!plan(cfg, world, p)) continue;
    any = true;
    // The expanded directives read back and plan the same DAG.
    const std::string written = ir::directives_yaml(p.strategy, p.model);
    config::Config again;
    try {
      again = config::parse(std::string(kBase) + written, "fuzz-directives.yaml");
    } catch (const config::ConfigError& e) {
      fuzz::require(false, "directives_yaml() of a compiled plan is refused: " + std::string(e.what()) + "\n" + written);
    }
    ir::Plan q;
    fuzz::require(plan(again, world, q), "directives_yaml() of a compiled plan does not compile:\n" + written);
    fuzz::require(q.hash == p.hash, "directives_yaml() of a compiled plan compiles to another plan:\n" + written);
  }
  ++(any ? fuzz::accepted : fuzz::refused);
  return 0;
}
