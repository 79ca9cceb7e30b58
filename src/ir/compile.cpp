// compile.cpp — config to verified global DAG.
#include "ir/compile.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace piper::ir {

Plan compile(const config::Config& cfg, int world_size) { return compile(cfg.model, expand(cfg, world_size)); }

Plan compile(const config::ModelConfig& model, Strategy s) {
  Plan p;
  p.model = make_model_graph(model);
  p.strategy = std::move(s);
  p.graph = build(p.model, p.strategy);
  try {
    // Every parameter's pieces exist under these degrees (config::validate states the same rules by key).
    check_shards(p.model, p.strategy.dims().degrees());
  } catch (const std::invalid_argument& e) {
    throw BuildError(std::string("shard: ") + e.what());
  }
  verify(p.graph, p.model);
  verify_play(p.graph, p.model, p.strategy.dims());
  p.hash = plan_hash(p.graph, p.model);
  p.devices_of_unit.resize(p.model.units.size());
  for (const Node& n : p.graph.nodes())
    if (n.kind == NodeKind::FWD && n.tags.microbatch == 0) p.devices_of_unit[static_cast<size_t>(n.tags.unit)] = n.devices;
  return p;
}

}  // namespace piper::ir
