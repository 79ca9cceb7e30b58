// model_graph.hpp — the model as the IR sees it: an ordered list of units
// (embedding, one per block of the pattern, head) with their parameters'
// names, global shapes and optimiser treatment. Pure: derived from the
// ModelConfig alone, so every rank and the simulator agree on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace piper::ir {

// How a parameter's initial values are drawn (spec/MODEL.md, "Initialisation").
enum class InitKind : uint8_t {
  INIT_NORMAL,        // normal(0, std)
  INIT_ONES,          // 1
  INIT_A_LOG,         // log(uniform[1, 16])
  INIT_DT_BIAS,       // inverse-softplus of dt, log-uniform in [1e-3, 1e-1]
  INIT_UNIFORM,       // uniform(-bound, bound)
};

struct ParamSpec {
  std::string name;            // exactly as spec/MODEL.md, e.g. "layers.3.mixer.in_proj.weight"
  std::vector<int64_t> shape;  // global shape, [out, in] for matrices
  bool weight_decay = false;   // AdamW decay: 2-D and 3-D weights only
  InitKind init = InitKind::INIT_NORMAL;
  double init_scale = 0.0;     // std for INIT_NORMAL, bound for INIT_UNIFORM
  // Tensor parallelism (Megatron style): the dimension split over the tp
  // ranks (-1: replicated on every tp rank) and, for packed tensors such as
  // Mamba's in_proj (z | x | B | C | dt), the sizes of the parts along it;
  // each part is split into tp contiguous pieces and rank r holds piece r of
  // every part, in order.
  int tp_dim = -1;
  std::vector<int64_t> tp_parts;  // empty: the whole dimension is one part
  int64_t numel() const;
};

// The shape of tensor-parallel rank `tp_rank`'s piece of `spec` (of `tp` ranks).
std::vector<int64_t> tp_local_shape(const ParamSpec& spec, int tp);
// The global flat (row-major) index of local flat element `i` on `tp_rank`.
int64_t tp_global_index(const ParamSpec& spec, int tp_rank, int tp, int64_t i);
// Whether every part along the split dimension divides by `tp`.
bool tp_divides(const ParamSpec& spec, int tp);

enum class UnitKind : uint8_t {
  UNIT_EMBED,      // token embedding
  UNIT_MAMBA,      // 'M'
  UNIT_ATTENTION,  // '*'
  UNIT_MLP,        // '-'
  UNIT_MOE,        // 'E' (not built yet)
  UNIT_HEAD,       // final norm + lm_head + cross-entropy
};

// One unit of the model: the granularity of FWD/BWD nodes and of stages.
struct UnitSpec {
  int index = 0;       // 0 = embed, 1..n_blocks = blocks, n_blocks + 1 = head
  UnitKind kind = UnitKind::UNIT_EMBED;
  int block = -1;      // global block index in the pattern; -1 for embed and head
  std::string name;    // "embed", "layers.3", "head"
  std::vector<ParamSpec> params;
  int64_t param_count() const;
};

struct ModelGraph {
  std::vector<UnitSpec> units;
  int64_t param_count() const;
};

char unit_symbol(UnitKind kind);           // 'e', 'M', '*', '-', 'E', 'h'
const char* unit_kind_name(UnitKind kind); // "embed", "mamba", "attention", ...

// The units and parameters of the model `m` describes. The config must be
// valid (config::validate).
ModelGraph make_model_graph(const config::ModelConfig& m);

}  // namespace piper::ir
