// fuzz_config.cpp — the config reader (src/config): YAML text with file positions into a Config, the
// --set overrides, validation for several world sizes, the strategy the directives give, and the
// `switch:` entries applied and checked in turn.
//
// Input: YAML text; after the first NUL byte, one `section.key=value` override per line.
// Refusal: config::ConfigError. Invariants on an accepted config: to_yaml() reads back (parse) to the same
// text — the resolved config is a fixed point of parse ∘ to_yaml, as config.hpp documents.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "fuzz.hpp"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string text = all.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    size_t at = nul + 1;
    while (at <= all.size()) {
      const size_t end = std::min(all.find('\n', at), all.size());
      overrides.push_back(all.substr(at, end - at));
      at = end + 1;
    }
  }
  config::Config cfg;
  try {
    cfg = config::parse(text, "fuzz.yaml", overrides);
  } catch (const config::ConfigError&) {
    ++fuzz::refused;
    return 0;
  }
  ++fuzz::accepted;
  // What parse accepted, to_yaml writes and parse reads back unchanged.
  config::Config again;
  try {
    again = config::parse(cfg.yaml_text, "fuzz-roundtrip.yaml");
  } catch (const config::ConfigError& e) {
    fuzz::require(false, std::string("to_yaml() of an accepted config is refused: ") + e.what());
  }
  fuzz::require(again.yaml_text == cfg.yaml_text, "parse(to_yaml(cfg)) differs from cfg");
  for (int world : {1, 2, 4, 8}) {
    try {
      config::validate(cfg, world);
      (void)config::effective_strategy(cfg);
    } catch (const config::ConfigError&) {
    }
  }
  // Each `switch:` entry applied over the one before, and checked at a few worlds.
  config::Config current = cfg;
  for (const config::SwitchTarget& t : cfg.switches) {
    for (int world : {1, 2, 4}) {
      try {
        config::validate_switch(current, t, world);
      } catch (const config::ConfigError&) {
      }
    }
    current = config::apply_switch(current, t);
  }
  return 0;
}
