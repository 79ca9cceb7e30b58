// checkpointing.cpp — a rank's state to and from HDF5 checkpoints.
#include "runtime/checkpointing.hpp"

#include <fcntl.h>
#include <mpi.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <stdexcept>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/files.hpp"
#include "comm/agreement.hpp"
#include "runtime/trainer.hpp"
#include "state/layout.hpp"

namespace piper::runtime {

namespace {
namespace fs = std::filesystem;

// Every dataset of the model, the same list on every rank.
std::vector<checkpoint::DatasetSpec> all_datasets(const ir::ModelGraph& g) {
  std::vector<checkpoint::DatasetSpec> all;
  for (const auto& u : g.units)
    for (const auto& p : u.params)
      for (auto kind : {state::StateKind::STATE_PARAM, state::StateKind::STATE_EXP_AVG,
                        state::StateKind::STATE_EXP_AVG_SQ})
        all.push_back({state::dataset_name(kind, p.name), p.shape});
  return all;
}

// Calls f(first run, end run, local offset) for each stretch of a piece's runs that lies back to back in its
// local buffer: one checkpoint piece or request each, read or written in place.
template <class F>
void for_each_stretch(const state::Piece& p, F&& f) {
  size_t a = 0;
  for (size_t r = 1; r <= p.runs.size(); ++r)
    if (r == p.runs.size() || p.local_offsets[r] != p.local_offsets[r - 1] + p.runs[r - 1].size()) {
      f(a, r, p.local_offsets[a]);
      a = r;
    }
}

// Calls f(local offset, position in the staging buffer, length) for each run of a piece: a staging buffer holds
// the runs back to back, in order.
template <class F>
void for_each_staged_run(const state::Piece& p, F&& f) {
  size_t at = 0;
  for (size_t r = 0; r < p.runs.size(); ++r) {
    const auto n = static_cast<size_t>(p.runs[r].size());
    f(p.local_offsets[r], at, n);
    at += n;
  }
}

std::vector<checkpoint::Run> runs_of(const std::vector<state::Run>& runs, size_t a, size_t b) {
  std::vector<checkpoint::Run> out;
  for (size_t r = a; r < b; ++r) out.push_back({runs[r].begin, runs[r].end});
  return out;
}

}  // namespace

Checkpointer::Checkpointer(const config::Config& cfg, RankRuntime& runtime, const MpiEnv& env,
                           const data::Tokenizer& tokenizer)
    : cfg_(cfg), rt_(runtime), env_(env), tokenizer_(tokenizer) {
  MPI_Comm_dup(env.comm(), &comm_);
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();  // bounded: every wait of a save is
  MPI_Comm_free(&comm_);
}

checkpoint::Meta Checkpointer::meta() const {
  const DataPosition& at = rt_.position();
  checkpoint::Meta meta;
  meta.step = at.step;
  meta.tokens_seen = at.tokens_seen;
  meta.data_position = at.data_position;
  meta.seed = cfg_.train.seed;
  meta.config_yaml = cfg_.yaml_text;
  meta.strategy = ir::directives_yaml(rt_.plan().strategy, rt_.plan().model);
  meta.tokenizer = data::kind_name(tokenizer_.kind());
  meta.tokenizer_model = tokenizer_.model();
  return meta;
}

void Checkpointer::preflight() {
  const std::string& dir = cfg_.checkpoint.dir;
  if (dir.empty()) return;
  const double timeout = cfg_.parallel.comm_timeout_s;
  const std::string where = " (world rank " + std::to_string(env_.rank()) + ", host " + env_.host() + ")";
  const std::string key = "checkpoint.dir '" + dir + "': ";
  // Every rank: the folder, and a probe file written, flushed and removed in it.
  std::string err;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    err = key + "cannot create it: " + ec.message() + where;
  } else if (!fs::is_directory(dir, ec)) {
    err = key + "it is not a folder" + where;
  } else {
    const std::string probe = (fs::path(dir) / (".piper-probe-" + std::to_string(env_.rank()) + "-" +
                                                std::to_string(::getpid()))).string();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const std::vector<char> page(4096, 'p');
    if (fd < 0) {
      err = key + "cannot create a file in it: " + std::strerror(errno) + where;
    } else {
      if (::write(fd, page.data(), page.size()) != static_cast<ssize_t>(page.size()) || ::fsync(fd) != 0)
        err = key + "cannot write a file in it: " + std::strerror(errno) + where;
      ::close(fd);
      if (::unlink(probe.c_str()) != 0 && err.empty())
        err = key + "cannot remove a file in it: " + std::strerror(errno) + where;
    }
  }
  if (!err.empty())
    err += "; checkpoint.dir must be a folder that every rank can create and write files in (or leave it empty "
           "for no checkpoints)";
  std::string first = comm::agree(comm_, err, timeout, "the check of checkpoint.dir");
  if (!first.empty()) throw UserError(first);
  // Rank 0: room for a checkpoint and the temporary of the next; one checkpoint less when one is there to be
  // replaced.
  if (env_.rank() == 0) {
    const int64_t one = checkpoint::estimated_bytes(all_datasets(rt_.plan().model), meta());
    bool has_one = false;
    for (const auto& e : fs::directory_iterator(dir, ec))
      has_one = has_one || checkpoint::step_of(e.path().string()) >= 0;
    const int64_t needed = has_one ? one : 2 * one;
    struct statvfs vfs {};
    if (::statvfs(dir.c_str(), &vfs) != 0) {
      err = key + "cannot read its free space: " + std::strerror(errno);
    } else {
      const int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
      if (free_bytes < needed)
        err = key + human_bytes(free_bytes) + " free, but a checkpoint of this model takes up to " + human_bytes(one) +
              (has_one ? "" : " and the temporary of the next save as much again") +
              "; free space there or choose a folder on a larger file system";
    }
  }
  first = comm::agree(comm_, err, timeout, "the check of checkpoint.dir's free space");
  if (!first.empty()) throw UserError(first);
}

void Checkpointer::report(const std::string& path, const std::string& error, double ms) {
  if (error.empty()) {
    if (env_.rank() == 0) {
      if (cfg_.checkpoint.async)
        std::printf("piper: saved %s (written in the background in %.1f ms)\n", path.c_str(), ms);
      else
        std::printf("piper: saved %s (step loop stalled %.1f ms)\n", path.c_str(), ms);
      std::fflush(stdout);
    }
    return;
  }
  if (cfg_.checkpoint.on_error == "stop") throw checkpoint::SaveError(error);
  if (env_.rank() == 0) {
    std::string kept;
    try {
      kept = "; the newest checkpoint is still " + checkpoint::resolve(cfg_.checkpoint.dir);
    } catch (const checkpoint::CheckpointError&) {
      kept = "; there is no earlier checkpoint";
    }
    std::fprintf(stderr, "piper: warning: checkpoint %s not saved: %s%s; training goes on (checkpoint.on_error: "
                 "continue)\n", path.c_str(), error.c_str(), kept.c_str());
    std::fflush(stderr);
  }
}

void Checkpointer::poll() {
  if (!writer_.joinable()) return;
  if (env_.any(!finished_.load())) return;  // every rank's writer has agreed before it finishes
  wait();
}

void Checkpointer::wait() {
  if (!writer_.joinable()) return;
  writer_.join();
  const std::string error = std::exchange(error_, std::string());
  report(pending_path_, error,
         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started_).count());
}

std::vector<checkpoint::Piece> Checkpointer::pieces_to_write() {
  // This rank's owned elements. A synchronous save from a host-addressable device writes them straight from
  // the live buffers (nothing changes them before it returns); a background one, or one from a device the host
  // cannot address, from a copy, run after run per dataset, in staging buffers kept from one save to the next.
  const auto owned = state::owned_for_write(rt_.plan().model, rt_.layout(), env_.rank());
  backend::Backend& device = rt_.device();
  const bool copy = cfg_.checkpoint.async || !device.host_addressable();
  std::vector<checkpoint::Piece> mine;
  if (copy) staged_.resize(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    const state::Piece& p = owned[i];
    const float* base = rt_.state_buffer(p);
    const std::string name = state::dataset_name(p.kind, p.param);
    if (!copy) {
      for_each_stretch(p, [&](size_t a, size_t b, int64_t at) {
        mine.push_back({name, runs_of(p.runs, a, b), base + at});
      });
      continue;
    }
    backend::HostBuffer& data = staged_[i];
    if (data.size() != static_cast<size_t>(state::total(p.runs)))
      data = backend::HostBuffer(device, static_cast<size_t>(state::total(p.runs)));
    for_each_staged_run(p, [&](int64_t local, size_t at, size_t n) {
      device.to_host(data.data() + at, base + local, n * sizeof(float));
    });
    mine.push_back({name, runs_of(p.runs, 0, p.runs.size()), data.data()});
  }
  return mine;
}

// The write (every rank), then (rank 0) the `latest` pointer and the clean-up, agreed like the write. The job
// returns the failure every rank agreed on, or "".
std::function<std::string()> Checkpointer::write_job(const std::string& path, std::vector<checkpoint::Piece> mine) {
  const checkpoint::SaveOptions options{cfg_.checkpoint.direct_io, cfg_.parallel.comm_timeout_s};
  return [this, path, options, meta = meta(), mine = std::move(mine), all = all_datasets(rt_.plan().model),
          dir = cfg_.checkpoint.dir]() -> std::string {
    try {
      checkpoint::save(path, comm_, meta, all, mine, options);
    } catch (const checkpoint::SaveError& e) {
      return e.what();
    }
    std::string err;
    if (env_.rank() == 0) {
      try {
        checkpoint::update_latest(dir, path);
        checkpoint::keep_last(dir, static_cast<int>(cfg_.checkpoint.keep));
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    return comm::agree(comm_, err, options.timeout_s, "the update of checkpoint.dir's latest");
  };
}

void Checkpointer::save() {
  wait();  // one save at a time
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = checkpoint::checkpoint_path(cfg_.checkpoint.dir, rt_.position().step);
  std::function<std::string()> write = write_job(path, pieces_to_write());
  if (cfg_.checkpoint.async) {
    write_in_background(path, std::move(write), t0);
    return;
  }
  const std::string error = write();
  report(path, error, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

void Checkpointer::write_in_background(const std::string& path, std::function<std::string()> write,
                                       std::chrono::steady_clock::time_point t0) {
  if (env_.rank() == 0) {
    std::printf("piper: saving %s in the background (step loop stalled %.1f ms)\n", path.c_str(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  pending_path_ = path;
  started_ = t0;
  finished_ = false;
  writer_ = std::thread([this, write = std::move(write)]() {
    try {
      error_ = write();
    } catch (const comm::StallError& e) {
      // A rank stopped answering: nothing can finish the job in order.
      std::fprintf(stderr, "piper: communication failure on rank %d (%s) in a background checkpoint save: %s\n",
                   env_.rank(), env_.host().c_str(), e.what());
      std::fflush(stderr);
      env_.abort(3);
    } catch (const std::exception& e) {
      error_ = std::string("background checkpoint save: ") + e.what();
    }
    finished_ = true;
  });
}

std::string Checkpointer::resolve(const std::string& where) const {
  try {
    return checkpoint::resolve(where == "latest" ? cfg_.checkpoint.dir + "/latest" : where);
  } catch (const checkpoint::CheckpointError& e) {
    if (where == "latest") return "";  // nothing saved yet: start fresh
    throw UserError(std::string("--resume: ") + e.what());
  }
}

// Straight into the model's and the optimiser's buffers on a host-addressable device (a failed load ends the
// run); otherwise into host staging buffers, one per piece, that land() copies to the device.
std::vector<checkpoint::Request> Checkpointer::read_requests() {
  std::vector<checkpoint::Request> mine;
  const auto held = state::held(rt_.plan().model, rt_.layout(), env_.rank());
  const bool direct = rt_.device().host_addressable();
  reads_.clear();
  reads_.resize(direct ? 0 : held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    const state::Piece& p = held[i];
    const std::string name = state::dataset_name(p.kind, p.param);
    if (!direct) {
      reads_[i] = backend::HostBuffer(rt_.device(), static_cast<size_t>(state::total(p.runs)));
      mine.push_back({name, runs_of(p.runs, 0, p.runs.size()), reads_[i].data()});
      continue;
    }
    float* base = rt_.state_buffer(p);
    for_each_stretch(p, [&](size_t a, size_t b, int64_t at) {
      mine.push_back({name, runs_of(p.runs, a, b), base + at});
    });
  }
  return mine;
}

void Checkpointer::land_read() {
  if (reads_.empty()) return;
  const auto held = state::held(rt_.plan().model, rt_.layout(), env_.rank());
  for (size_t i = 0; i < held.size(); ++i) {
    const state::Piece& p = held[i];
    float* base = rt_.state_buffer(p);
    for_each_staged_run(p, [&](int64_t local, size_t at, size_t n) {
      rt_.device().to_device(base + local, reads_[i].data() + at, n * sizeof(float));
    });
  }
  reads_.clear();
}

// The data order continues from the checkpoint's position only with the batch and sequence it was made with.
void Checkpointer::check_position(const std::string& path, const checkpoint::Meta& meta) const {
  const int64_t gb = cfg_.train.global_batch, T = cfg_.train.seq_len;
  if (meta.step > 0 && (meta.data_position != meta.step * gb || meta.tokens_seen != meta.data_position * T))
    throw UserError("--resume: checkpoint " + path + " records " + std::to_string(meta.step) + " steps over " +
                    std::to_string(meta.data_position) + " sequences and " + std::to_string(meta.tokens_seen) +
                    " tokens, which train.global_batch = " + std::to_string(gb) + " and train.seq_len = " +
                    std::to_string(T) + " do not give (" + std::to_string(meta.step * gb) + " and " +
                    std::to_string(meta.step * gb * T) + "); resume with the global_batch and seq_len it was " +
                    "written with, so the data order goes on where it stopped");
}

// Training goes on only over ids of the tokenizer the checkpoint learned.
void Checkpointer::check_tokenizer(const std::string& path, const checkpoint::Meta& meta) const {
  const std::string mine = data::kind_name(tokenizer_.kind());
  if (meta.tokenizer == mine && meta.tokenizer_model == tokenizer_.model()) return;
  const auto name = [](const std::string& kind, const std::string& model) {
    return kind == "byte" ? kind : kind + " model " + std::to_string(data::model_hash(model));
  };
  throw UserError("--resume: checkpoint " + path + " was trained on data of the " +
                  name(meta.tokenizer, meta.tokenizer_model) + " tokenizer, but data.path '" + cfg_.data.path +
                  "' was made with the " + name(mine, tokenizer_.model()) +
                  " tokenizer; resume on token files made with the checkpoint's tokenizer (piper prepare --tokenizer)");
}

int64_t Checkpointer::load(const std::string& where) {
  const std::string path = resolve(where);
  if (path.empty()) return -1;
  checkpoint::Meta meta;
  try {
    meta = checkpoint::load(path, comm_, all_datasets(rt_.plan().model), read_requests(),
                            cfg_.parallel.comm_timeout_s);
  } catch (const checkpoint::CheckpointError& e) {
    throw UserError(std::string("--resume: ") + e.what());
  }
  land_read();
  check_position(path, meta);
  check_tokenizer(path, meta);
  rt_.resume_at({meta.step, meta.tokens_seen, meta.data_position});
  return meta.step;
}

}  // namespace piper::runtime
