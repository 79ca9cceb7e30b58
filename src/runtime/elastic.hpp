// elastic.hpp — which of the job's processes train, and what the job does at
// a step boundary (docs/switching.md).
//
// Membership: the job's live processes (members) and those of them that
// train under the current strategy (active, in the strategy's rank order);
// the others wait in reserve (train.standby) for a grow. Processes are named
// by their MPI_COMM_WORLD rank, as mpirun numbers them.
//
// Boundary: at every step boundary the members agree on one Decision —
// continue, stop (a signal: checkpoint and exit), finish, or switch to a new
// strategy — which the first active process makes from the `switch:` list,
// the leave notices (SIGUSR2, or `leave:` in the switch file) and the switch
// file, asking the tuner for a strategy when the target names none. A target
// that is not valid for its world is refused before any state moves: the
// `switch:` list when the job starts, a switch file when it is read (the job
// keeps running and says why).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "config/config.hpp"
#include "runtime/mpi_env.hpp"

namespace piper::runtime {

// SIGTERM and SIGUSR1 ask the job to checkpoint and stop; SIGUSR2 is a leave notice for the process it
// reaches. Installed by train().
void install_signal_handlers();
bool stop_requested();

class Membership {
 public:
  // Collective over MPI_COMM_WORLD: the first `size - standby` processes train, the rest wait in
  // reserve; points `env` at the ones that train.
  Membership(MpiEnv& env, int standby, const comm::CommOptions& options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  const std::vector<int>& members() const { return members_; }
  const std::vector<int>& active() const { return active_; }
  std::vector<int> standby() const;  // members not active, ascending
  int me() const { return me_; }     // this process's MPI_COMM_WORLD rank
  bool training() const;
  // Over every member: group rank i is members()[i].
  comm::Communicator& member_comm() { return *member_comm_; }
  MPI_Comm member_mpi() const { return member_mpi_; }
  // The strategy's world: group rank i is active()[i] (null in reserve).
  comm::Communicator* world() { return world_.get(); }
  // The member group ranks of processes.
  std::vector<int> procs(const std::vector<int>& world_ranks) const;

  // The communicator of a new active set, built beside the current one (collective over members).
  struct Next {
    std::vector<int> active;
    MPI_Comm mpi = MPI_COMM_NULL;
    std::unique_ptr<comm::Communicator> world;  // null when this process is not in the set
  };
  Next split(const std::vector<int>& active);
  // Collective over members, after the state has moved and the old runtime is gone: `next` becomes the
  // active set (and env's communicator), and the processes in `leaving` are no longer members.
  void commit(Next next, const std::vector<int>& leaving);
  // Collective over members, the last communication of a run that ends (not of a process leaving): no
  // member finalizes MPI before every other one is done (MpiEnv: MPI_Finalize may not wait for them). A
  // process in reserve passes patient = true and waits without spinning.
  void finish(bool patient, double timeout_s);

 private:
  MpiEnv& env_;
  comm::CommOptions options_;
  int me_ = 0;
  std::vector<int> members_, active_;
  MPI_Comm member_mpi_ = MPI_COMM_NULL, active_mpi_ = MPI_COMM_NULL;
  std::unique_ptr<comm::Communicator> member_comm_, world_;
};

enum class Event : uint8_t { CONTINUE, STOP, FINISH, SWITCH };

struct Decision {
  Event event = Event::CONTINUE;
  std::vector<int> active;   // SWITCH: the processes of the new strategy, in rank order
  std::vector<int> leaving;  // SWITCH: processes that leave the job after it
  std::string config_yaml;   // SWITCH: the config the new strategy runs under (config::to_yaml)
  std::string why;           // SWITCH: "switch[1] at step 4", "switch file run/s.yaml", "leave notice"
};

// The step boundary's agreement.
class Boundary {
 public:
  // Checks the `switch:` list of `cfg` before any step: each entry valid (config::validate_switch) and
  // compiling (ir::compile) at the world it runs at, within the job's `processes`; a UserError naming
  // the entry otherwise. Starting at `step` (a resumed run), entries before it are passed over.
  Boundary(const config::Config& cfg, int processes, int64_t step, const MpiEnv& env);

  // Collective over the members. `current` is the config of the strategy running (the leader applies
  // targets to it); `step` the steps completed and `finished` whether training is done (the leader's
  // count is the one that matters); a process in reserve passes patient = true and waits without
  // spinning.
  Decision exchange(Membership& m, const config::Config& current, int64_t step, bool finished, bool patient);

 private:
  // The leader's side: the decision from every member's flags.
  Decision decide(const Membership& m, const config::Config& current, int64_t step, bool finished,
                  const std::vector<int>& flags);
  // A target as a decision: the new active set, the config, refused (a message, CONTINUE) when invalid.
  Decision resolve(const Membership& m, const config::Config& current, const config::SwitchTarget& t,
                   const std::string& why);
  // The switch file's new content, or "" when it has not changed since it was last read.
  std::string read_switch_file();

  const config::Config& cfg_;
  size_t next_entry_ = 0;      // the first entry of the `switch:` list not yet reached
  std::string file_seen_;      // the switch file's content as last read
};

// Leaves the job after a switch moved this process's state away: at once where the launcher allows a
// process to end without MPI_Finalize (early_exit_allowed()), else when the job ends (MPI_Finalize waits
// for every process). Returns only in the second case.
void leave_job(int world_rank);

}  // namespace piper::runtime
