// test_groups.cpp — every communication instruction runs on the communicator of its group: a
// message on the world, a data-parallel bucket or gather on the dp group, a tensor-parallel
// collective between two segments on the tp group, the gradient norm on the world; and each
// communicator sees its collectives in program order (messages may go in any order). The executor plays rank 0's program of
// tp 2 x dp 2 (ZeRO-1) and tp 2 x pp 2 plans over communicators that record every call and
// complete at once (the values are not checked here; the parity tests check them).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/comm.hpp"
#include "ir/compile.hpp"
#include "ir/grid.hpp"
#include "model/model.hpp"
#include "runtime/executor.hpp"
#include "unit/test_configs.hpp"

namespace piper::runtime {
namespace {

using Log = std::vector<std::pair<std::string, std::string>>;  // (communicator, operation)

class RecordingComm final : public comm::Communicator {
 public:
  RecordingComm(std::string name, int size, Log& log) : name_(std::move(name)), size_(size), log_(log) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  int world_rank(int i) const override { return i; }
  const std::string& name() const override { return name_; }
  const comm::CommOptions& options() const override { return options_; }
  comm::Request isend(const void*, size_t, backend::DType, int, int) override { return note("send"); }
  comm::Request irecv(void*, size_t, backend::DType, int, int) override { return note("recv"); }
  comm::Request iallreduce(float*, size_t) override { return note("allreduce"); }
  comm::Request ireduce_scatter(const float*, float*, size_t) override { return note("reduce_scatter"); }
  comm::Request iallgather(const void*, void*, size_t, backend::DType) override { return note("allgather"); }
  comm::Request ialltoall(const void*, void*, size_t, backend::DType) override { return note("alltoall"); }
  comm::Request ialltoallv(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                           backend::DType) override {
    return note("alltoallv");
  }
  comm::Request iallreduce_double(double*, size_t) override { return note("allreduce_double"); }
  void barrier() override { note("barrier"); }

 protected:
  std::unique_ptr<Communicator> split_impl(const std::vector<int>&, const std::string&) override { return nullptr; }

 private:
  comm::Request note(const char* op) {
    log_.emplace_back(name_, op);
    return {};  // complete
  }
  std::string name_;
  int size_;
  Log& log_;
  comm::CommOptions options_;
};

// What rank 0's program should ask of each communicator, in program order.
Log expected(const ir::Program& p) {
  Log want;
  for (const ir::Instr& c : p.comm) {
    const std::string group = ir::is_p2p(c.kind) ? "world" : ir::group_name(c.group);
    const char* op = c.kind == ir::NodeKind::SEND             ? "send"
                     : c.kind == ir::NodeKind::RECV           ? "recv"
                     : c.kind == ir::NodeKind::REDUCE_SCATTER ? "reduce_scatter"
                     : c.kind == ir::NodeKind::ALLGATHER      ? "allgather"
                     : c.payload == ir::Payload::PAYLOAD_NORM ? "allreduce_double"
                                                              : "allreduce";
    // A data-parallel bucket is one call per unit it holds.
    const size_t calls = c.units.empty() ? 1 : c.units.size();
    for (size_t i = 0; i < calls; ++i) want.emplace_back(group, op);
  }
  return want;
}

// The collectives of one communicator, in order.
Log collectives(const Log& log, const std::string& comm) {
  Log out;
  for (const auto& e : log)
    if (e.first == comm && e.second != "send" && e.second != "recv") out.push_back(e);
  return out;
}

// The messages, which go in any order (matched by tag).
Log messages(const Log& log) {
  Log out;
  for (const auto& e : log)
    if (e.second == "send" || e.second == "recv") out.push_back(e);
  std::sort(out.begin(), out.end());
  return out;
}

void play_rank0(int tp, int dp, int pp, int zero) {
  config::Config cfg;
  cfg.model = testing::small_model("M*-M");
  cfg.parallel.tp = tp, cfg.parallel.dp = dp, cfg.parallel.pp = pp, cfg.parallel.zero = zero;
  cfg.parallel.microbatches = 2;
  cfg.train.global_batch = 2 * dp;
  cfg.train.seq_len = 4;
  const int world = tp * dp * pp;
  const ir::Plan plan = ir::compile(cfg, world);
  ir::Program program = ir::lower(plan.graph, 0);
  const Log want = expected(program);
  size_t tp_points = 0;
  for (const ir::Instr& c : program.comm) tp_points += c.payload == ir::Payload::PAYLOAD_UNIT;
  EXPECT_GT(tp_points, 0u) << "the plan has no tensor-parallel collective";

  Log log;
  RecordingComm w("world", world, log), d("dp", dp, log), t("tp", tp, log);
  const Groups groups{&w, dp > 1 ? &d : nullptr, &t};
  std::vector<int> held;
  for (const ir::Instr& in : program.compute)
    if (in.unit >= 0 && std::find(held.begin(), held.end(), in.unit) == held.end()) held.push_back(in.unit);
  std::sort(held.begin(), held.end());
  model::Model m(cfg.model, plan.model, held, backend::cpu(), {0, dp, plan.strategy.replicate.zero_of_unit, 0, tp}, &t);
  m.params().init(cfg.train.seed);
  Optimizer opt(m, cfg.train);
  Executor exec(m, opt, std::move(program), groups);
  const int64_t rows = plan.strategy.microbatch_rows;
  std::vector<int32_t> tokens(static_cast<size_t>(rows), 1);
  std::vector<model::MicroBatch> mbs(2, model::MicroBatch{tokens.data(), tokens.data(), rows / cfg.train.seq_len,
                                                          cfg.train.seq_len, 1.0f});
  exec.run_step(0, mbs);
  for (const char* comm : {"world", "dp", "tp"}) {
    SCOPED_TRACE(comm);
    EXPECT_EQ(collectives(log, comm), collectives(want, comm));
  }
  EXPECT_EQ(messages(log), messages(want));
  EXPECT_EQ(log.size(), want.size());
}

TEST(Groups, EveryInstructionRunsOnTheCommunicatorOfItsGroup) {
  {
    SCOPED_TRACE("tp 2 x dp 2, ZeRO-1");
    play_rank0(2, 2, 1, 1);
  }
  {
    SCOPED_TRACE("tp 2 x pp 2");
    play_rank0(2, 1, 2, 0);
  }
}

TEST(Groups, ACollectiveWithoutItsCommunicatorIsRefused) {
  config::Config cfg;
  cfg.model = testing::small_model("M*-M");
  cfg.parallel.tp = 2;
  cfg.train.global_batch = 1;
  cfg.train.seq_len = 4;
  const ir::Plan plan = ir::compile(cfg, 2);
  ir::Program program = ir::lower(plan.graph, 0);
  Log log;
  RecordingComm w("world", 2, log);
  model::Model m(cfg.model, plan.model, {}, backend::cpu(), {0, 1, {}, 0, 2}, nullptr);
  Optimizer opt(m, cfg.train);
  try {
    Executor exec(m, opt, std::move(program), Groups{&w, nullptr, nullptr});
    FAIL() << "an executor without its tp communicator was built";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("tp group"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace piper::runtime
