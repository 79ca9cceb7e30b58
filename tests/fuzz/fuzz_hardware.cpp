// fuzz_hardware.cpp — the hardware file reader (src/sim/hardware.cpp): a user's accelerator and links as
// JSON, optionally starting from a table entry ("base"), as `piper simulate --hardware FILE` reads it
// (docs/hardware.md).
//
// Input: the JSON text. Refusal: std::invalid_argument (naming the file and the key). On accepted
// hardware: hardware_to_json() reads back, and the analytic cost model of a small model on it is built
// (analytic_cost documents std::invalid_argument too).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz.hpp"
#include "sim/hardware.hpp"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  sim::Hardware hw;
  try {
    hw = sim::parse_hardware(text, "fuzz.json");
  } catch (const std::invalid_argument&) {
    ++fuzz::refused;
    return 0;
  }
  ++fuzz::accepted;
  try {
    (void)sim::parse_hardware(sim::hardware_to_json(hw), "fuzz-roundtrip.json");
  } catch (const std::invalid_argument& e) {
    fuzz::require(false, "hardware_to_json() of accepted hardware is refused: " + std::string(e.what()));
  }
  config::ModelConfig m;
  m.pattern = "M*-";
  m.vocab_size = 32;
  m.d_model = 16;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 24;
  m.d_state = 8;
  m.head_dim = 8;
  m.n_groups = 2;
  try {
    const sim::CostModel c = sim::analytic_cost(m, 16, 4, hw, {1, 2}, {2, 4, 16});
    (void)c.comm_ms(sim::CommOp::COMM_ALLREDUCE, 4, 1 << 20);
    (void)c.compute_ms('M', ir::Pass::PASS_F, 1, 64);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
