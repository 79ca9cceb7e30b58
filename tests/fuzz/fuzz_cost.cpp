// fuzz_cost.cpp — the cost file reader (src/sim/cost_model.cpp): piper-cost-1 JSON, as `piper calibrate`
// writes it or a person writes it by hand (docs/calibration.md).
//
// Input: the JSON text. Refusal: std::invalid_argument (the simulator's documented error, naming the file
// and the key). On an accepted model: to_json() reads back to the same JSON, and the queries the simulator
// makes (compute time of every entry, every collective at several group sizes and byte counts, the host
// sharing factor) return or throw only the documented std::out_of_range of a missing entry.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "fuzz.hpp"
#include "sim/cost_model.hpp"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  sim::CostModel m;
  try {
    m = sim::parse_cost(text, "fuzz.json");
  } catch (const std::invalid_argument&) {
    ++fuzz::refused;
    return 0;
  }
  ++fuzz::accepted;
  const std::string json = sim::to_json(m);
  sim::CostModel again;
  try {
    again = sim::parse_cost(json, "fuzz-roundtrip.json");
  } catch (const std::invalid_argument& e) {
    fuzz::require(false, "to_json() of an accepted cost model is refused: " + std::string(e.what()));
  }
  fuzz::require(sim::to_json(again) == json, "parse_cost(to_json(m)) differs from m");
  // compute_ms and comm_ms throw std::out_of_range for a kind or op the file has no entry for (documented).
  auto query = [](auto f) {
    try {
      (void)f();
    } catch (const std::out_of_range&) {
    }
  };
  for (const sim::OpCost& op : m.ops)
    for (ir::Pass pass : {ir::Pass::PASS_F, ir::Pass::PASS_B, ir::Pass::PASS_BI, ir::Pass::PASS_BW})
      for (int tp : {1, op.tp, 2})
        for (int64_t rows : {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{1} << 40})
          query([&] { return m.compute_ms(op.kind, pass, tp, rows); });
  for (sim::CommOp op : {sim::CommOp::COMM_P2P, sim::CommOp::COMM_ALLREDUCE, sim::CommOp::COMM_REDUCE_SCATTER,
                         sim::CommOp::COMM_ALLGATHER, sim::CommOp::COMM_ALLTOALL})
    for (int ranks : {1, 2, 3, 8, 1024})
      for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1} << 20, int64_t{1} << 40})
        query([&] { return m.comm_ms(op, ranks, bytes); });
  for (double busy : {0.0, 0.5, 1.0, 3.0, 1000.0}) (void)m.sharing(busy);
  return 0;
}
