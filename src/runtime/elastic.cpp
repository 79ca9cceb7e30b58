// elastic.cpp — the job's members, the active set, and the step boundary's decision.
#include "runtime/elastic.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/agreement.hpp"
#include "comm/mpi_comm.hpp"
#include "ir/compile.hpp"
#include "runtime/fit.hpp"
#include "runtime/trainer.hpp"
#include "tune/tune.hpp"

namespace piper::runtime {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_leave_notice = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
extern "C" void on_leave_notice(int) { g_leave_notice = 1; }

constexpr int kStopFlag = 1, kLeaveFlag = 2;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<int> minus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  for (int x : a)
    if (!contains(b, x)) out.push_back(x);
  return out;
}

// A process in reserve waits for the others' step without taking a core from them.
void wait_request(MPI_Request* r, bool patient, double timeout_s, const std::string& what, MPI_Comm comm) {
  if (!patient) return comm::wait_bounded(r, 1, timeout_s, what, comm);
  for (int done = 0;;) {
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// The decision as bytes, for the leader's broadcast.
struct Wire {
  std::string bytes;
  size_t at = 0;
  void put(int64_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void put(const std::string& s) { put(static_cast<int64_t>(s.size())), bytes += s; }
  void put(const std::vector<int>& v) {
    put(static_cast<int64_t>(v.size()));
    for (int x : v) put(int64_t{x});
  }
  int64_t num() {
    int64_t v = 0;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  std::string str() {
    const size_t n = static_cast<size_t>(num());
    std::string s = bytes.substr(at, n);
    at += n;
    return s;
  }
  std::vector<int> ints() {
    std::vector<int> v(static_cast<size_t>(num()));
    for (int& x : v) x = static_cast<int>(num());
    return v;
  }
};

// The tuner's strategy for `world` ranks, as a config: what a switch without a strategy runs under.
config::Config tuned(const config::Config& current, int world) {
  const config::TrainConfig& t = current.train;
  tune::Request req;
  req.cfg = current;
  req.world = world;
  double memory = 0;
  req.cost = tune::cost_model(current, world, t.switch_cost, t.switch_hardware, &memory);
  if (memory <= 0) memory = host_memory().bytes / world;  // a cost file: the host's memory, shared
  req.mem_limit_bytes = memory;
  req.time_budget_s = t.switch_tune_s;
  const tune::Result r = tune::tune(req);
  config::Config next = config::parse(tune::tuned_config_yaml(current, req, r),
                                      "the tuner's strategy for " + std::to_string(world) + " ranks");
  next.switches = current.switches;
  return next;
}

}  // namespace

void install_signal_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGUSR2, on_leave_notice);
}

bool stop_requested() { return g_stop_signal != 0; }

// ---- Membership --------------------------------------------------------------------

Membership::Membership(MpiEnv& env, int standby, const comm::CommOptions& options) : env_(env), options_(options) {
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me_);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int r = 0; r < size; ++r) members_.push_back(r);
  for (int r = 0; r < size - standby; ++r) active_.push_back(r);
  MPI_Comm_dup(MPI_COMM_WORLD, &member_mpi_);
  member_comm_ = comm::make_mpi_world(MPI_COMM_WORLD, options_);
  Next first = split(active_);
  active_mpi_ = first.mpi;
  world_ = std::move(first.world);
  env_.use(active_mpi_);
}

Membership::~Membership() {
  world_.reset();
  member_comm_.reset();
  if (active_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&active_mpi_);
  if (member_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&member_mpi_);
}

std::vector<int> Membership::standby() const { return minus(members_, active_); }

bool Membership::training() const { return contains(active_, me_); }

std::vector<int> Membership::procs(const std::vector<int>& world_ranks) const {
  std::vector<int> out;
  for (int w : world_ranks)
    out.push_back(static_cast<int>(std::find(members_.begin(), members_.end(), w) - members_.begin()));
  return out;
}

void Membership::finish(bool patient, double timeout_s) {
  MPI_Request r;
  MPI_Ibarrier(member_mpi_, &r);
  wait_request(&r, patient, timeout_s, "the end of the job (every process still in it)", member_mpi_);
}

Membership::Next Membership::split(const std::vector<int>& active) {
  Next next;
  next.active = active;
  auto pos = std::find(active.begin(), active.end(), me_);
  const bool in = pos != active.end();
  MPI_Comm_split(member_mpi_, in ? 0 : MPI_UNDEFINED, in ? static_cast<int>(pos - active.begin()) : 0, &next.mpi);
  if (in) next.world = comm::make_mpi_world(next.mpi, options_);
  return next;
}

void Membership::commit(Next next, const std::vector<int>& leaving) {
  world_.reset();
  if (active_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&active_mpi_);
  active_mpi_ = next.mpi;
  world_ = std::move(next.world);
  active_ = next.active;
  env_.use(active_mpi_);
  if (leaving.empty()) return;
  const bool stays = !contains(leaving, me_);
  MPI_Comm stay = MPI_COMM_NULL;
  MPI_Comm_split(member_mpi_, stays ? 0 : MPI_UNDEFINED, me_, &stay);
  member_comm_.reset();
  MPI_Comm_free(&member_mpi_);
  member_mpi_ = stay;
  members_ = minus(members_, leaving);
  if (stays) member_comm_ = comm::make_mpi_world(stay, options_);
}

// ---- Boundary ----------------------------------------------------------------------

Boundary::Boundary(const config::Config& cfg, int processes, int64_t step, const MpiEnv& env) : cfg_(cfg) {
  config::Config current = cfg;
  int world = processes - static_cast<int>(cfg.train.standby);
  bool known = true;  // the strategy before the entry is known (no tuner's choice before it)
  for (size_t i = 0; i < cfg.switches.size(); ++i) {
    const config::SwitchTarget& e = cfg.switches[i];
    const auto loc = e.locations.find(e.path());
    const std::string where = (loc != e.locations.end() ? loc->second + ": " : "") + e.path();
    if (e.at_step <= step) {
      next_entry_ = i + 1;
      if (env.rank() == 0)
        std::printf("piper: %s (at_step %lld) is behind the resumed step %lld; the run goes on under the "
                    "config's strategy\n", e.path().c_str(), static_cast<long long>(e.at_step),
                    static_cast<long long>(step));
      continue;
    }
    world = static_cast<int>(e.world.value_or(world));
    if (world > processes)
      throw UserError(where + ": world " + std::to_string(world) + " needs more ranks than the job's " +
                      std::to_string(processes) + " processes; start the job with at least " +
                      std::to_string(world) + " (train.standby keeps the extra ones in reserve until then)");
    if (!e.has_strategy()) {
      known = false;
      continue;
    }
    if (!known) continue;  // keys over a strategy the tuner picks: checked when it is reached
    config::validate_switch(current, e, world);
    config::Config next = config::apply_switch(current, e);
    try {
      (void)ir::compile(next, world);
    } catch (const std::exception& ex) {
      throw UserError(where + ": the strategy of " + e.path() + " at world " + std::to_string(world) +
                      " is not valid: " + ex.what());
    }
    current = std::move(next);
  }
  if (!cfg.train.switch_file.empty()) file_seen_ = read_switch_file();  // what is there already is not new
}

std::string Boundary::read_switch_file() {
  std::ifstream f(cfg_.train.switch_file, std::ios::binary);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  if (text == file_seen_) return "";
  file_seen_ = text;
  return text;
}

Decision Boundary::exchange(Membership& m, const config::Config& current, int64_t step, bool finished,
                            bool patient) {
  const double timeout = current.parallel.comm_timeout_s;
  int mine = (g_stop_signal ? kStopFlag : 0) | (g_leave_notice ? kLeaveFlag : 0);
  g_leave_notice = 0;  // the leader hears it once
  std::vector<int> flags(m.members().size(), 0);
  MPI_Request r;
  MPI_Iallgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, m.member_mpi(), &r);
  wait_request(&r, patient, timeout, "the step boundary (signals and leave notices)", m.member_mpi());

  const int leader = m.procs({m.active().front()}).front();
  Wire w;
  if (m.member_comm().rank() == leader) {
    const Decision d = decide(m, current, step, finished, flags);
    w.put(static_cast<int64_t>(d.event)), w.put(d.active), w.put(d.leaving), w.put(d.config_yaml), w.put(d.why);
    w.put(static_cast<int64_t>(next_entry_)), w.put(file_seen_);
  }
  int64_t n = static_cast<int64_t>(w.bytes.size());
  MPI_Ibcast(&n, 1, MPI_INT64_T, leader, m.member_mpi(), &r);
  wait_request(&r, patient, timeout, "the step boundary's decision", m.member_mpi());
  w.bytes.resize(static_cast<size_t>(n));
  MPI_Ibcast(w.bytes.data(), static_cast<int>(n), MPI_CHAR, leader, m.member_mpi(), &r);
  wait_request(&r, patient, timeout, "the step boundary's decision", m.member_mpi());
  Decision d;
  d.event = static_cast<Event>(w.num());
  d.active = w.ints(), d.leaving = w.ints(), d.config_yaml = w.str(), d.why = w.str();
  next_entry_ = static_cast<size_t>(w.num());  // a later leader goes on from here
  file_seen_ = w.str();
  return d;
}

Decision Boundary::decide(const Membership& m, const config::Config& current, int64_t step, bool finished,
                          const std::vector<int>& flags) {
  std::vector<int> notices;
  bool stop = false;
  for (size_t i = 0; i < flags.size(); ++i) {
    stop = stop || (flags[i] & kStopFlag);
    if (flags[i] & kLeaveFlag) notices.push_back(m.members()[i]);
  }
  if (stop) return {Event::STOP, {}, {}, "", "a signal"};
  if (finished) return {Event::FINISH, {}, {}, "", ""};
  const std::vector<config::SwitchTarget>& list = cfg_.switches;
  if (next_entry_ < list.size() && list[next_entry_].at_step <= step) {
    const config::SwitchTarget& e = list[next_entry_++];
    return resolve(m, current, e, e.path() + " at step " + std::to_string(e.at_step));
  }
  if (!notices.empty()) {
    config::SwitchTarget t;
    t.leave.assign(notices.begin(), notices.end());
    return resolve(m, current, t, "the leave notice of rank(s) " + rank_list(notices));
  }
  if (cfg_.train.switch_file.empty()) return {};
  const std::string text = read_switch_file();
  if (text.empty()) return {};
  const std::string why = "the switch file " + cfg_.train.switch_file;
  try {
    return resolve(m, current, config::parse_switch(text, cfg_.train.switch_file), why);
  } catch (const config::ConfigError& e) {
    std::fprintf(stderr, "piper: %s is not applied: %s; training goes on under the current strategy\n", why.c_str(),
                 e.what());
    std::fflush(stderr);
    return {};
  }
}

Decision Boundary::resolve(const Membership& m, const config::Config& current, const config::SwitchTarget& t,
                           const std::string& why) {
  auto refuse = [&](const std::string& what) {
    std::fprintf(stderr, "piper: %s is not applied: %s; training goes on under the current strategy (%zu ranks)\n",
                 why.c_str(), what.c_str(), m.active().size());
    std::fflush(stderr);
    return Decision{};
  };
  std::vector<int> leaving;
  for (int64_t r : t.leave) {
    if (!contains(m.members(), static_cast<int>(r)))
      return refuse("leave: rank " + std::to_string(r) + " is not in the job (its ranks are " +
                    rank_list(m.members()) + ")");
    if (!contains(leaving, static_cast<int>(r))) leaving.push_back(static_cast<int>(r));
  }
  const std::vector<int> stay_active = minus(m.active(), leaving), stay_standby = minus(m.standby(), leaving);
  if (stay_active.empty() && stay_standby.empty())
    return refuse("every rank of the job has a leave notice, and at least one must stay; send the notice to "
                  "fewer ranks, or SIGTERM to checkpoint and stop");
  const int world = static_cast<int>(t.world.value_or(stay_active.empty() ? 1 : stay_active.size()));
  std::vector<int> ranks = stay_active;
  ranks.insert(ranks.end(), stay_standby.begin(), stay_standby.end());
  if (world < 1 || world > static_cast<int>(ranks.size()))
    return refuse("world " + std::to_string(world) + " needs " + std::to_string(world) + " ranks, and " +
                  std::to_string(ranks.size()) + " are left (" + std::to_string(stay_standby.size()) +
                  " of them in reserve); ask for at most " + std::to_string(ranks.size()));
  ranks.resize(static_cast<size_t>(world));
  config::Config next;
  try {
    if (t.has_strategy()) {
      config::validate_switch(current, t, world);
      next = config::apply_switch(current, t);
    } else if (current.train.switch_hardware.empty() && current.train.switch_cost.empty()) {
      return refuse("it names no strategy for the " + std::to_string(world) + " ranks, and the tuner needs "
                    "train.switch_hardware or train.switch_cost to choose one; give parallel: or directives:, "
                    "or set one of those keys");
    } else {
      next = tuned(current, world);
    }
    (void)ir::compile(next, world);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  return {Event::SWITCH, ranks, leaving, config::to_yaml(next), why};
}

void leave_job(int world_rank) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (early_exit_allowed()) std::_Exit(0);
  std::fprintf(stderr, "piper: rank %d has left the training; it exits when the job ends (start mpirun with "
               "--mca orte_allowed_exit_without_sync 1 to let a leaving rank exit at once)\n", world_rank);
  std::fflush(stderr);
}

}  // namespace piper::runtime
