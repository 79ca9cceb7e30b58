// model_graph.cpp — units and parameter specs of the hybrid model (spec/MODEL.md).
#include "ir/model_graph.hpp"

#include <cmath>
#include <stdexcept>

namespace piper::ir {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t UnitSpec::param_count() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

int64_t ModelGraph::param_count() const {
  int64_t n = 0;
  for (const auto& u : units) n += u.param_count();
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
  return {std::move(name), {rows, cols}, true, InitKind::INIT_NORMAL, std_dev};
}
ParamSpec ones(std::string name, int64_t n) {
  return {std::move(name), {n}, false, InitKind::INIT_ONES, 0.0};
}

}  // namespace

ModelGraph make_model_graph(const config::ModelConfig& m) {
  const int64_t D = m.d_model, V = m.vocab_size;
  // Residual-output projections are scaled down by depth (GPT-2 / Megatron).
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(m.n_blocks()));
  ModelGraph g;
  g.units.push_back({0, UnitKind::UNIT_EMBED, -1, "embed", {matrix("embed.weight", V, D, kInitStd)}});
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
        u.params.push_back(matrix(mix + "in_proj.weight", m.in_proj_rows(), D, kInitStd));
        // conv1d: uniform(+-1/sqrt(K)), torch's default for a depthwise conv
        u.params.push_back({mix + "conv1d.weight", {c, m.d_conv}, true, InitKind::INIT_UNIFORM,
                            1.0 / std::sqrt(static_cast<double>(m.d_conv))});
        u.params.push_back({mix + "conv1d.bias", {c}, false, InitKind::INIT_UNIFORM,
                            1.0 / std::sqrt(static_cast<double>(m.d_conv))});
        u.params.push_back({mix + "dt_bias", {hm}, false, InitKind::INIT_DT_BIAS, 0.0});
        u.params.push_back({mix + "A_log", {hm}, false, InitKind::INIT_A_LOG, 0.0});
        u.params.push_back(ones(mix + "D", hm));
        u.params.push_back(ones(mix + "norm.weight", di));
        u.params.push_back(matrix(mix + "out_proj.weight", D, di, out_std));
        break;
      }
      case '*': {
        const int64_t hd = m.attn_head_dim();
        u.kind = UnitKind::UNIT_ATTENTION;
        u.params.push_back(matrix(mix + "q_proj.weight", m.n_heads * hd, D, kInitStd));
        u.params.push_back(matrix(mix + "k_proj.weight", m.n_kv_heads * hd, D, kInitStd));
        u.params.push_back(matrix(mix + "v_proj.weight", m.n_kv_heads * hd, D, kInitStd));
        u.params.push_back(matrix(mix + "o_proj.weight", D, m.n_heads * hd, out_std));
        break;
      }
      case '-': {
        u.kind = UnitKind::UNIT_MLP;
        u.params.push_back(matrix(mix + "gate_proj.weight", m.ffn_hidden, D, kInitStd));
        u.params.push_back(matrix(mix + "up_proj.weight", m.ffn_hidden, D, kInitStd));
        u.params.push_back(matrix(mix + "down_proj.weight", D, m.ffn_hidden, out_std));
        break;
      }
      default:
        throw std::invalid_argument("model.pattern: block " + std::to_string(i) + " is '" +
                                    m.pattern[static_cast<size_t>(i)] +
                                    "', which this build cannot construct (M, * and - are supported)");
    }
    g.units.push_back(std::move(u));
  }
  const int head = static_cast<int>(m.n_blocks()) + 1;
  g.units.push_back({head, UnitKind::UNIT_HEAD, -1, "head",
                     {ones("final_norm.weight", D), matrix("lm_head.weight", V, D, kInitStd)}});
  return g;
}

}  // namespace piper::ir
