// test_sizes.cpp — the IR's size arithmetic is checked: a config that skipped validate() with
// sizes whose products leave 64 bits gets a ConfigError naming what overflowed, not a wrapped
// number (validate() refuses such configs first; tests/unit/config/test_bounds.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "config/config.hpp"
#include "ir/compile.hpp"
#include "ir/model_graph.hpp"
#include "ir/strategy.hpp"
#include "unit/test_configs.hpp"

namespace piper::ir {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(IrSizes, ParameterCountsOfHugeSizesThrowNamingTheParameter) {
  config::ModelConfig m = testing::small_model("-");
  m.vocab_size = int64_t{1} << 40;
  m.d_model = int64_t{1} << 30;  // the embedding is 2^70 elements
  const ModelGraph g = make_model_graph(m);
  const std::string msg = error_of([&] { (void)g.param_count(); });
  EXPECT_NE(msg.find("parameter embed.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1099511627776 x 1073741824"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not fit 64-bit arithmetic"), std::string::npos) << msg;
}

TEST(IrSizes, ASumOfParameterCountsThatOverflowsThrows) {
  config::ModelConfig m = testing::small_model(std::string(8, '-'));
  m.d_model = int64_t{1} << 31;
  m.ffn_hidden = int64_t{1} << 31;  // each MLP matrix 2^62 elements: one fits, their sum does not
  m.vocab_size = 1;
  const ModelGraph g = make_model_graph(m);
  const std::string msg = error_of([&] { (void)g.param_count(); });
  EXPECT_NE(msg.find("parameter count does not fit 64-bit arithmetic"), std::string::npos) << msg;
}

TEST(IrSizes, ActivationBytesOfHugeBatchesThrowNamingTheKeys) {
  config::Config c;
  c.model = testing::small_model("-");
  c.train.global_batch = int64_t{1} << 40;
  c.train.seq_len = int64_t{1} << 30;
  const std::string msg = error_of([&] { (void)expand(c, 1); });
  EXPECT_NE(msg.find("train.global_batch / (dp x microbatches) x train.seq_len x model.d_model"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("does not fit 64-bit arithmetic"), std::string::npos) << msg;
}

TEST(IrSizes, ValidSizesKeepTheirExactCounts) {
  config::ModelConfig m = testing::small_model("-");
  m.vocab_size = 2147483647;  // the largest vocabulary: V x D = 34359738352 embedding elements
  const ModelGraph g = make_model_graph(m);
  EXPECT_EQ(g.units.front().params.front().numel(), int64_t{2147483647} * 16);
  config::Config c;
  c.model = m;
  c.train.global_batch = 8;
  c.train.seq_len = 256;
  EXPECT_EQ(expand(c, 1).activation_bytes, int64_t{8} * 256 * 16 * 4);
}

}  // namespace
}  // namespace piper::ir
