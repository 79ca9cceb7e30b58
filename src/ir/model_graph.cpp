// model_graph.cpp — units and parameter specs of the hybrid model (docs/model.md).
#include "ir/model_graph.hpp"

#include <cmath>
#include <optional>
#include <stdexcept>

#include "config/checked.hpp"

namespace piper::ir {

int64_t ParamSpec::numel() const {
  if (std::optional<int64_t> n = config::checked_product(shape)) return *n;
  return config::size_product(shape, "parameter " + name);  // throws, naming the parameter
}

namespace {
// a + b for parameter counts; ConfigError naming `what` when the sum leaves 64 bits.
int64_t add_count(int64_t a, int64_t b, const char* what, const std::string& name) {
  if (std::optional<int64_t> r = config::checked_add(a, b)) return *r;
  throw config::ConfigError(std::string(what) + name + ": the parameter count does not fit 64-bit arithmetic; use "
                            "smaller sizes (docs/config.md, Bounds)");
}
}  // namespace

int64_t UnitSpec::param_count() const {
  int64_t n = 0;
  for (const auto& p : params) n = add_count(n, p.numel(), "unit ", name);
  return n;
}

int64_t ModelGraph::param_count() const {
  int64_t n = 0;
  for (const auto& u : units) n = add_count(n, u.param_count(), "the model", "");
  return n;
}

char unit_symbol(UnitKind kind) {
  switch (kind) {
    case UnitKind::UNIT_EMBED: return 'e';
    case UnitKind::UNIT_MAMBA: return 'M';
    case UnitKind::UNIT_ATTENTION: return '*';
    case UnitKind::UNIT_MLP: return '-';
    case UnitKind::UNIT_MOE: return 'E';
    case UnitKind::UNIT_HEAD: return 'h';
  }
  return '?';
}

const char* unit_kind_name(UnitKind kind) {
  switch (kind) {
    case UnitKind::UNIT_EMBED: return "embed";
    case UnitKind::UNIT_MAMBA: return "mamba";
    case UnitKind::UNIT_ATTENTION: return "attention";
    case UnitKind::UNIT_MLP: return "mlp";
    case UnitKind::UNIT_MOE: return "moe";
    case UnitKind::UNIT_HEAD: return "head";
  }
  return "?";
}

namespace {

constexpr double kInitStd = 0.02;

ParamSpec matrix(std::string name, int64_t rows, int64_t cols, double std_dev) {
  return {std::move(name), {rows, cols}, true, InitKind::INIT_NORMAL, std_dev, {}};
}
ParamSpec ones(std::string name, int64_t n) {
  return {std::move(name), {n}, false, InitKind::INIT_ONES, 0.0, {}};
}

// Megatron's column-parallel (output rows split) and row-parallel (input columns split) over tp.
ParamSpec split(ParamSpec p, int dim, std::vector<int64_t> parts = {}) {
  p.shards = {{dim, Axis::TP, std::move(parts)}};
  return p;
}

// Stacked experts [E, ...]: whole experts over ep, and each expert's matrix split over tp at `tp_dim`.
ParamSpec experts(std::string name, std::vector<int64_t> shape, double std_dev, int tp_dim) {
  return {std::move(name), std::move(shape), true, InitKind::INIT_NORMAL, std_dev,
          {{0, Axis::EP, {}}, {tp_dim, Axis::TP, {}}}};
}

}  // namespace

ModelGraph make_model_graph(const config::ModelConfig& m) {
  const int64_t D = m.d_model, V = m.vocab_size;
  // Residual-output projections are scaled down by depth (GPT-2 / Megatron).
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(m.n_blocks()));
  ModelGraph g;
  g.d_model = D;
  if (m.pattern.find('E') != std::string::npos) g.n_experts = m.n_experts, g.top_k = m.top_k;
  g.units.push_back({0, UnitKind::UNIT_EMBED, -1, "embed", {split(matrix("embed.weight", V, D, kInitStd), 0)}});
  for (int i = 0; i < m.n_blocks(); ++i) {
    const std::string pre = "layers." + std::to_string(i) + ".";
    const std::string mix = pre + "mixer.";
    UnitSpec u;
    u.index = i + 1;
    u.block = i;
    u.name = "layers." + std::to_string(i);
    u.params.push_back(ones(pre + "norm.weight", D));
    switch (m.pattern[static_cast<size_t>(i)]) {
      case 'M': {
        const int64_t di = m.d_inner(), hm = m.mamba_heads(), c = m.conv_channels();
        u.kind = UnitKind::UNIT_MAMBA;
        const int64_t gn = m.n_groups * m.d_state;
        // Heads and groups split over tp; in_proj packs z | x | B | C | dt, conv1d x | B | C.
        u.params.push_back(split(matrix(mix + "in_proj.weight", m.in_proj_rows(), D, kInitStd), 0, {di, di, gn, gn, hm}));
        // conv1d: uniform(+-1/sqrt(K)), torch's default for a depthwise conv
        u.params.push_back(split({mix + "conv1d.weight", {c, m.d_conv}, true, InitKind::INIT_UNIFORM,
                                  1.0 / std::sqrt(static_cast<double>(m.d_conv)), {}}, 0, {di, gn, gn}));
        u.params.push_back(split({mix + "conv1d.bias", {c}, false, InitKind::INIT_UNIFORM,
                                  1.0 / std::sqrt(static_cast<double>(m.d_conv)), {}}, 0, {di, gn, gn}));
        u.params.push_back(split({mix + "dt_bias", {hm}, false, InitKind::INIT_DT_BIAS, 0.0, {}}, 0));
        u.params.push_back(split({mix + "A_log", {hm}, false, InitKind::INIT_A_LOG, 0.0, {}}, 0));
        u.params.push_back(split(ones(mix + "D", hm), 0));
        u.params.push_back(split(ones(mix + "norm.weight", di), 0));
        u.params.push_back(split(matrix(mix + "out_proj.weight", D, di, out_std), 1));
        break;
      }
      case '*': {
        const int64_t hd = m.attn_head_dim();
        u.kind = UnitKind::UNIT_ATTENTION;
        u.params.push_back(split(matrix(mix + "q_proj.weight", m.n_heads * hd, D, kInitStd), 0));
        u.params.push_back(split(matrix(mix + "k_proj.weight", m.n_kv_heads * hd, D, kInitStd), 0));
        u.params.push_back(split(matrix(mix + "v_proj.weight", m.n_kv_heads * hd, D, kInitStd), 0));
        u.params.push_back(split(matrix(mix + "o_proj.weight", D, m.n_heads * hd, out_std), 1));
        break;
      }
      case '-': {
        u.kind = UnitKind::UNIT_MLP;
        u.params.push_back(split(matrix(mix + "gate_proj.weight", m.ffn_hidden, D, kInitStd), 0));
        u.params.push_back(split(matrix(mix + "up_proj.weight", m.ffn_hidden, D, kInitStd), 0));
        u.params.push_back(split(matrix(mix + "down_proj.weight", D, m.ffn_hidden, out_std), 1));
        break;
      }
      case 'E': {
        // The router is replicated (every rank routes its own tokens); experts go whole to ep ranks.
        const int64_t E = m.n_experts, F = m.moe_ffn_hidden;
        u.kind = UnitKind::UNIT_MOE;
        u.params.push_back(matrix(mix + "router.weight", E, D, kInitStd));
        u.params.push_back(experts(mix + "experts.gate_proj", {E, F, D}, kInitStd, 1));
        u.params.push_back(experts(mix + "experts.up_proj", {E, F, D}, kInitStd, 1));
        u.params.push_back(experts(mix + "experts.down_proj", {E, D, F}, out_std, 2));
        break;
      }
      default:
        throw std::invalid_argument("model.pattern: block " + std::to_string(i) + " is '" +
                                    m.pattern[static_cast<size_t>(i)] +
                                    "', which this build cannot construct (M, *, - and E are supported)");
    }
    g.units.push_back(std::move(u));
  }
  const int head = static_cast<int>(m.n_blocks()) + 1;
  g.units.push_back({head, UnitKind::UNIT_HEAD, -1, "head",
                     {ones("final_norm.weight", D), split(matrix("lm_head.weight", V, D, kInitStd), 0)}});
  return g;
}

}  // namespace piper::ir
