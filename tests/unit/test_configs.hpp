// test_configs.hpp — the small model configuration shared by the IR and model unit tests
// (tests/unit/ir/test_ir.cpp, test_build_parallel.cpp, tests/unit/model/test_model.cpp) and, as YAML,
// by the tests of directive and rule positions (tests/unit/config/test_directives.cpp,
// tests/unit/ir/test_schedule_rules.cpp).
#pragma once

#include <string>

#include "config/config.hpp"

namespace piper::testing {

// A small model with every block kind cheap to build and run: D 16, H 4 (attention hd 4), KV 2,
// F 24, N 8, P 8, expand 2 (d_inner 32, Hm 4), G 2, K 4, V 32, and for E blocks 4 experts, top 2,
// expert F 12. Every other field (rope_theta, ssd_chunk, moe_aux_coef, ...) keeps its
// config::ModelConfig default.
inline config::ModelConfig small_model(const std::string& pattern) {
  config::ModelConfig m;
  m.pattern = pattern;
  m.vocab_size = 32;
  m.d_model = 16;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 24;
  m.d_state = 8;
  m.head_dim = 8;
  m.expand = 2;
  m.n_groups = 2;
  m.d_conv = 4;
  m.n_experts = 4;
  m.top_k = 2;
  m.moe_ffn_hidden = 12;
  return m;
}

// The small model with `pattern` and a global batch of `batch` sequences of `seq` tokens.
inline config::Config small_config(const std::string& pattern, int64_t batch, int64_t seq) {
  config::Config cfg;
  cfg.model = small_model(pattern);
  cfg.train.global_batch = batch;
  cfg.train.seq_len = seq;
  return cfg;
}

// A model big enough that the matrix products dominate: D 512, H 8, KV 4 (hd 64), F 1536,
// d_inner 1024 (Hm 32 of P 32), G 4, N 32, V 1024; for E blocks 8 experts of hidden 1536, top 1.
inline config::ModelConfig mid_model(const std::string& pattern) {
  config::ModelConfig m;
  m.pattern = pattern;
  m.vocab_size = 1024;
  m.d_model = 512;
  m.n_heads = 8;
  m.n_kv_heads = 4;
  m.ffn_hidden = 1536;
  m.d_state = 32;
  m.head_dim = 32;
  m.expand = 2;
  m.n_groups = 4;
  m.d_conv = 4;
  m.ssd_chunk = 32;
  m.n_experts = 8;
  m.top_k = 1;
  m.moe_ffn_hidden = 1536;
  return m;
}

// The same small hybrid model as YAML, for tests of file positions (blocks 0..4: M * - M -; units
// embed, layers.0..4, head): lines 1..8, so a directives section appended to it starts on line 9.
inline const std::string kSmallModelYaml =
    "model:\n"
    "  pattern: \"M*-M-\"\n"
    "  d_model: 64\n"
    "  n_heads: 4\n"
    "  n_kv_heads: 2\n"
    "  head_dim: 16\n"
    "train:\n"
    "  global_batch: 8\n";

}  // namespace piper::testing
