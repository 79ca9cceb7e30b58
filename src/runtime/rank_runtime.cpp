// rank_runtime.cpp — a rank's plan, groups, model, optimiser, executor and data position.
#include "runtime/rank_runtime.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ir/world_play.hpp"

namespace piper::runtime {

namespace {

backend::Backend& backend_named(config::Device device) {
  switch (device) {
    case config::Device::DEVICE_CPU:
      return backend::cpu();
    case config::Device::DEVICE_CPU_DETACHED:
      return backend::cpu_detached();
    case config::Device::DEVICE_CUDA:
      break;
  }
  std::string why;
  if (backend::Backend* gpu = backend::cuda(&why)) return *gpu;
  throw std::runtime_error(std::string("device ") + config::device_name(device) + ": " + why +
                           "; run on a machine with an NVIDIA GPU, or with device " +
                           config::device_name(config::Device::DEVICE_CPU));
}

}  // namespace

std::optional<std::string> model_uncomputable(const config::ModelConfig& model, const std::vector<int64_t>& head_dims,
                                              const char* device) {
  const int64_t hd = model.attn_head_dim();
  if (!model.has_attention() || head_dims.empty() ||
      std::find(head_dims.begin(), head_dims.end(), hd) != head_dims.end())
    return std::nullopt;
  std::string dims, heads;
  for (int64_t d : head_dims) {
    dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    if (model.d_model % d == 0 && (model.d_model / d) % model.n_kv_heads == 0)
      heads += (heads.empty() ? "" : ", ") + std::to_string(model.d_model / d);
  }
  std::string msg = "model.n_heads: the attention head dim model.d_model/model.n_heads = " +
                    std::to_string(model.d_model) + "/" + std::to_string(model.n_heads) + " = " + std::to_string(hd) +
                    " is not one device " + device + "'s attention kernels take (" + dims + "); ";
  if (heads.empty())
    return msg + "change model.d_model to a multiple of one of them, or run on another device";
  return msg + "use n_heads " + heads + " (a multiple of model.n_kv_heads = " + std::to_string(model.n_kv_heads) +
         "), or run on another device";
}

backend::Backend& backend_of(const config::Config& cfg) {
  const config::Device device = config::device_of(cfg.train);
  backend::Backend& b = backend_named(device);
  if (std::optional<std::string> why = model_uncomputable(cfg.model, b.attention_head_dims(), config::device_name(device)))
    throw std::runtime_error(*why);
  return b;
}

comm::DeviceComm device_comm_of(config::DeviceComm how) {
  switch (how) {
    case config::DeviceComm::DEVICE_COMM_NCCL:
      return comm::DeviceComm::DEVICE_COMM_NCCL;
    case config::DeviceComm::DEVICE_COMM_MPI:
      return comm::DeviceComm::DEVICE_COMM_MPI;
    case config::DeviceComm::DEVICE_COMM_AUTO:
      break;
  }
  return comm::DeviceComm::DEVICE_COMM_AUTO;
}

namespace {

// The units a rank's program computes, ascending: the ones it holds (NORM has no unit).
std::vector<int> units_of(const ir::Program& program) {
  std::vector<int> held;
  for (const auto& in : program.compute)
    if (in.unit >= 0 && std::find(held.begin(), held.end(), in.unit) == held.end()) held.push_back(in.unit);
  std::sort(held.begin(), held.end());
  return held;
}

// The samples of one step, each microbatch a view into them on the rank's device.
struct StepBatch {
  std::vector<int32_t> host;  // inputs [share, T], then targets [share, T]: this replica's share of the global batch
  backend::Tensor ids;        // the same on the device
  std::vector<model::MicroBatch> mbs;
};

// Samples g = first + j of the global batch (docs/model.md, "Data order") from `range`:
// replica `replica` of `replicas` takes the contiguous share [replica * GB /
// replicas, (replica + 1) * GB / replicas), split into `n_mb` equal
// microbatches in sample order.
void load_batch(const data::TokenFile& tf, const data::TokenRange& range, const config::TrainConfig& train,
                int64_t first, int n_mb, int replica, int replicas, backend::Backend& be, StepBatch& b) {
  const int64_t GB = train.global_batch, T = train.seq_len, share = GB / replicas, n = share * T;
  b.host.resize(static_cast<size_t>(2 * n));
  std::vector<int32_t> seq(static_cast<size_t>(T + 1));
  for (int64_t j = 0; j < share; ++j) {
    tf.sample(range, first + replica * share + j, T, seq.data());
    std::copy(seq.begin(), seq.end() - 1, b.host.begin() + j * T);
    std::copy(seq.begin() + 1, seq.end(), b.host.begin() + n + j * T);
  }
  if (b.ids.numel() != 2 * n)
    b.ids = backend::Tensor(be, backend::Shape{2 * n}, backend::MemCategory::MEM_BUFFERS, backend::DType::DTYPE_I32);
  be.to_device(b.ids.view().ptr, b.host.data(), b.host.size() * sizeof(int32_t));
  const auto* ids = static_cast<const int32_t*>(b.ids.view().ptr);
  const int64_t per = share / n_mb;
  const float scale = static_cast<float>(1.0 / static_cast<double>(GB * T));
  b.mbs.clear();
  for (int i = 0; i < n_mb; ++i) b.mbs.push_back({ids + i * per * T, ids + n + i * per * T, per, T, scale});
}


// A group of the plan's ranks as the world ranks Communicator::split takes.
std::vector<int> in_world(const comm::Communicator& world, std::vector<int> ranks) {
  for (int& r : ranks) r = world.world_rank(r);
  return ranks;
}

}  // namespace

RankRuntime::RankRuntime(const config::Config& cfg, ir::Plan plan, comm::Communicator& world, StateStart start)
    : RankRuntime(cfg, std::move(plan), ir::lower(plan.graph, world.rank()), world, start) {}

RankRuntime::RankRuntime(const config::Config& cfg, ir::Plan&& plan, ir::Program program, comm::Communicator& world,
                         StateStart start)
    : cfg_(cfg),
      plan_(std::move(plan)),
      rank_(world.rank()),
      grid_(plan_.strategy.dims()),
      device_(backend_of(cfg)),
      host_world_(world),
      device_world_(comm::for_device(world, device_, device_comm_of(config::device_comm_of(cfg.train)))),
      world_(device_world_ ? *device_world_ : world),
      dp_(world_.split(in_world(world_, ir::group_members(grid_, rank_, ir::GroupDim::GROUP_DP)), "dp")),
      tp_(world_.split(in_world(world_, ir::group_members(grid_, rank_, ir::GroupDim::GROUP_TP)), "tp")),
      ep_(world_.split(in_world(world_, ir::group_members(grid_, rank_, ir::GroupDim::GROUP_EP)), "ep")),
      edp_(world_.split(in_world(world_, grid_.expert_data_group(rank_)), "edp")),
      groups_{&world_, dp_.get(), tp_.get(), ep_.get(), edp_.get()},
      held_units_(units_of(program)),
      model_(cfg.model, plan_.model, held_units_, device_,
             {replica(), replicas(), plan_.strategy.replicate.zero_of_unit, grid_.coord(rank_, ir::Axis::TP),
              grid_.degree(ir::Axis::TP), grid_.coord(rank_, ir::Axis::EP), grid_.degree(ir::Axis::EP)},
             tp_.get(), ep_.get(), start == StateStart::INITIALISED),
      optimizer_(model_, cfg.train, start == StateStart::INITIALISED),
      instructions_per_step_(program.compute.size() + program.comm.size()),
      evaluator_(model_, optimizer_, ir::forward_program(program), groups_, Passes::FORWARD),
      executor_(model_, optimizer_, std::move(program), groups_) {
  model_.set_precision(model::precision_of(config::precision_of(cfg.train)));
  if (start == StateStart::INITIALISED) model_.params().init(cfg.train.seed);
}

StepStats RankRuntime::step(const data::TokenFile& tokens, const data::TokenRange& range) {
  StepBatch batch;
  load_batch(tokens, range, cfg_.train, position_.data_position, plan_.strategy.split.microbatches, replica(),
             replicas(), device_, batch);
  model_.backend().reset_peak();
  StepStats st = executor_.run_step(position_.step, batch.mbs);
  ++position_.step;
  position_.data_position += cfg_.train.global_batch;
  position_.tokens_seen += cfg_.train.global_batch * cfg_.train.seq_len;
  return st;
}

backend::Tensor RankRuntime::gathered_values(int u) {
  model::ParamStore& ps = model_.params();
  if (ps.sharding().zero(u) < 3)
    throw std::logic_error("unit " + std::to_string(u) + ": its values are not ZeRO-3 shards; read them whole");
  backend::Tensor full(device_, ps.padded_numel(u), backend::MemCategory::MEM_PARAMS);
  for (const ir::FlatPart& p : ps.parts(u)) {
    comm::Communicator* group = p.experts ? groups_.edp : groups_.dp;
    const auto n = static_cast<size_t>(p.zero.len);
    if (group)
      group->allgather(ps.shard_values(u, p), full.data() + p.full_offset, n, backend::DType::DTYPE_F32);
    else  // a group of one: the shard is the whole part
      device_.copy(full.data() + p.full_offset, ps.shard_values(u, p), n * sizeof(float));
  }
  return full;
}

void RankRuntime::with_compute_values(const std::function<void()>& use) {
  model::ParamStore& ps = model_.params();
  const backend::DType storage = model_.storage_dtype();
  std::vector<std::pair<int, backend::Tensor>> bound;
  struct Unbind {
    model::ParamStore& ps;
    const std::vector<std::pair<int, backend::Tensor>>& bound;
    ~Unbind() {
      for (const auto& [u, values] : bound) ps.unbind_compute_values(u);
    }
  } unbind{ps, bound};
  for (int u : held_units_) {
    backend::Tensor values;
    if (ps.sharding().zero(u) >= 3) values = gathered_values(u);
    if (storage != backend::DType::DTYPE_F32)
      values = values.empty() ? ps.rounded_values(u, storage)
                              : backend::converted(values.view(), storage, backend::MemCategory::MEM_PARAMS);
    if (values.empty()) continue;
    ps.bind_compute_values(u, values.view());
    bound.emplace_back(u, std::move(values));
  }
  use();
}

double RankRuntime::evaluate(const data::TokenFile& tokens, const data::TokenRange& held_out, int64_t batches) {
  double loss_sum = 0.0;
  StepBatch batch;
  for (int64_t k = 0; k < batches; ++k) {
    load_batch(tokens, held_out, cfg_.train, k * cfg_.train.global_batch, plan_.strategy.split.microbatches,
               replica(), replicas(), device_, batch);
    loss_sum += evaluator_.run_step(position_.step, batch.mbs).loss_sum;
  }
  for (int u : held_units_) model_.unit(u).take_routing();  // the routing statistics report training steps only
  return loss_sum;
}

void RankRuntime::resume_at(const DataPosition& at) {
  position_ = at;
  optimizer_.set_steps(at.step);  // one AdamW step per optimiser step
}

float* RankRuntime::state_buffer(const state::Piece& p) {
  model::ParamStore& ps = model_.params();
  switch (p.kind) {
    case state::StateKind::STATE_PARAM:
      return ps.sharding().zero(p.unit) >= 3 ? ps.shard_values(p.unit) : ps.values(p.unit);
    case state::StateKind::STATE_EXP_AVG:
      return optimizer_.moment(p.unit, 0);
    case state::StateKind::STATE_EXP_AVG_SQ:
      return optimizer_.moment(p.unit, 1);
  }
  return nullptr;
}

void RankRuntime::allocate_block(int unit, state::StateKind kind) {
  if (kind == state::StateKind::STATE_PARAM)
    model_.params().allocate_values(unit);
  else
    optimizer_.allocate_moment(unit, kind == state::StateKind::STATE_EXP_AVG ? 0 : 1);
}

void RankRuntime::release_block(int unit, state::StateKind kind) {
  if (kind == state::StateKind::STATE_PARAM)
    model_.params().release_values(unit);
  else
    optimizer_.release_moment(unit, kind == state::StateKind::STATE_EXP_AVG ? 0 : 1);
}

}  // namespace piper::runtime
