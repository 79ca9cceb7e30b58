// compile.cpp — config to verified global DAG.
#include "ir/compile.hpp"

namespace piper::ir {

Plan compile(const config::Config& cfg, int world_size) {
  Plan p;
  p.model = make_model_graph(cfg.model);
  p.strategy = expand(cfg, world_size);
  p.graph = build(p.model, p.strategy);
  verify(p.graph, p.model);
  p.hash = plan_hash(p.graph, p.model);
  return p;
}

}  // namespace piper::ir
