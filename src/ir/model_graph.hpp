// model_graph.hpp — the model as the IR sees it: an ordered list of units
// (embedding, one per block of the pattern, head) with their parameters'
// names, global shapes and optimiser treatment. Pure: derived from the
// ModelConfig alone, so every rank and the simulator agree on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "ir/grid.hpp"

namespace piper::ir {

// How a parameter's initial values are drawn (docs/model.md, "Initialisation").
enum class InitKind : uint8_t {
  INIT_NORMAL,        // normal(0, std)
  INIT_ONES,          // 1
  INIT_A_LOG,         // log(uniform[1, 16])
  INIT_DT_BIAS,       // inverse-softplus of dt, log-uniform in [1e-3, 1e-1]
  INIT_UNIFORM,       // uniform(-bound, bound)
};

// How a parameter splits along one axis of the rank grid: dimension `dim`
// of its shape into degree(axis) contiguous pieces, rank c holding piece c.
// A packed tensor (Mamba's in_proj: z | x | B | C | dt) lists the sizes of
// its parts along `dim`; each part splits on its own and rank c holds piece c
// of every part, in order. The same form says "experts along dimension 0 over
// ep" or "the sequence over cp".
struct Shard {
  int dim = -1;
  Axis axis = Axis::TP;
  std::vector<int64_t> parts;  // empty: the whole dimension is one part
  bool operator==(const Shard&) const = default;
};

struct ParamSpec {
  std::string name;            // exactly as docs/model.md, "Parameters", e.g. "layers.3.mixer.in_proj.weight"
  std::vector<int64_t> shape;  // global shape, [out, in] for matrices
  bool weight_decay = false;   // AdamW decay: 2-D and 3-D weights only
  InitKind init = InitKind::INIT_NORMAL;
  double init_scale = 0.0;     // std for INIT_NORMAL, bound for INIT_UNIFORM
  // Applied in order, each to the shape the earlier ones leave (its `parts`
  // are sizes of that shape); empty: whole on every rank. Megatron's tensor
  // parallelism is one Shard along tp.
  std::vector<Shard> shards;
  int64_t numel() const;
};

struct UnitSpec;
struct ModelGraph;

// ---- a parameter's pieces: every consumer derives them from ParamSpec::shards ----

// Whether the parameter is split along `a` (else every rank along `a` holds the same piece).
bool split_along(const ParamSpec& spec, Axis a);
// "" when every shard's dimension exists and every part divides by its
// degree; otherwise what is wrong, naming the parameter, the dimension, the
// part and the degree.
std::string shard_problem(const ParamSpec& spec, const Degrees& n);
// Throws std::invalid_argument with the first shard_problem of the model's parameters.
void check_shards(const ModelGraph& graph, const Degrees& n);
// The shape of every rank's piece (all pieces have one shape). Checked.
std::vector<int64_t> local_shape(const ParamSpec& spec, const Degrees& n);
int64_t local_numel(const ParamSpec& spec, const Degrees& n);
// A unit's local flat buffer: its parameters' pieces concatenated in spec order.
int64_t local_numel(const UnitSpec& unit, const Degrees& n);

// Where local flat (row-major) element `i` of the piece at coordinates `at`
// sits in the global tensor, and how many local elements from `i` on follow
// it contiguously there (within one part's piece of one outer index).
struct Stretch {
  int64_t global = 0, len = 0;
};
Stretch global_stretch(const ParamSpec& spec, const Degrees& n, const Coords& at, int64_t i);
// global_stretch for many local elements of one piece: the shape of each shard level worked out
// once. walk: the stretches that cover local elements [lo, hi) in order (the last cut at hi); a
// parameter split once is walked part after part without a division.
class PieceStretches {
 public:
  PieceStretches(const ParamSpec& spec, const Degrees& n, const Coords& at);
  Stretch at(int64_t i) const;
  void walk(int64_t lo, int64_t hi, std::vector<Stretch>& out) const;

 private:
  struct Level {  // one shard, innermost first: the shape it splits and the piece of this rank
    int degree = 1, coord = 0;
    int64_t numel = 1, inner = 1, n_global = 0, n_local = 0;
    std::vector<int64_t> parts;  // sizes along the split dimension (one part: the whole dimension)
  };
  std::vector<Level> levels_;
  int64_t numel_ = 0;
};
int64_t global_index(const ParamSpec& spec, const Degrees& n, const Coords& at, int64_t i);

// ---- ZeRO: a rank's shard of a unit's flat local buffer ----

// The state a ZeRO level shards over the data-parallel group: parameters at
// zero 3, gradients from zero 2, the optimiser moments from zero 1.
enum class ZeroState : uint8_t { ZERO_PARAMS, ZERO_GRADS, ZERO_MOMENTS };
bool zero_shards(int zero, ZeroState s);
// The buffer of `numel` elements is padded to len * dp; data-parallel rank d
// holds [d * len, (d + 1) * len), cut across parameter boundaries as it falls.
struct FlatShard {
  int64_t offset = 0, len = 0, padded = 0;
};
FlatShard flat_shard(int64_t numel, int dp, int dp_rank);

// A unit's flat local buffer in parts: each run of consecutive parameters that
// the same data-parallel ranks hold. A dense parameter is held by all dp ranks;
// an expert parameter (split along ep) by the dp / ep ranks of its
// expert-data-parallel group (ParallelDims::expert_data_group), which hold
// the same experts. Each part is padded and ZeRO-sharded over its own group:
// the unit's full buffer is the parts' padded buffers one after the other, its
// shard buffer their shards one after the other. A unit without experts is one
// part, its buffer as flat_shard gives it.
struct FlatPart {
  size_t first = 0, count = 0;  // its parameters, spec order
  int64_t numel = 0;            // local elements of those parameters
  bool experts = false;         // replicated over the expert-data-parallel group, not all of dp
  FlatShard zero;               // this rank's ZeRO shard of the part's padded buffer
  int64_t full_offset = 0;      // where the part starts in the unit's full buffer
  int64_t shard_offset = 0;     // where its shard starts in the unit's shard buffer
};
// `at`: the rank's coordinates (at.dp, with n.ep, places it in both groups).
std::vector<FlatPart> flat_parts(const UnitSpec& unit, const Degrees& n, const Coords& at);
// The part's replica group: its size and this rank's place in it.
int replica_degree(bool experts, const Degrees& n);
int replica_coord(bool experts, const Degrees& n, const Coords& at);

enum class UnitKind : uint8_t {
  UNIT_EMBED,      // token embedding
  UNIT_MAMBA,      // 'M'
  UNIT_ATTENTION,  // '*'
  UNIT_MLP,        // '-'
  UNIT_MOE,        // 'E'  
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
  // What the passes of a unit communicate depends on (ir::pass_shape).
  int64_t d_model = 0;
  int64_t top_k = 0, n_experts = 0;  // 0 without MoE blocks
  int64_t param_count() const;
};

char unit_symbol(UnitKind kind);           // 'e', 'M', '*', '-', 'E', 'h'
const char* unit_kind_name(UnitKind kind); // "embed", "mamba", "attention", ...

// The units and parameters of the model `m` describes. The config must be
// valid (config::validate).
ModelGraph make_model_graph(const config::ModelConfig& m);

}  // namespace piper::ir
