// player.hpp — the rules for playing one rank's program, written once: the
// executor plays it with real compute and communicators, the simulator with
// a virtual clock and a cost model.
//
// The rules:
// - Compute instructions run in program order. Before one runs, its waits
//   (the communication it reads) complete, in the order listed.
// - Communication is issued as soon as its inputs are: before and after each
//   compute instruction, every communication instruction whose waits have run
//   is issued. Point-to-point messages are matched by tag and may go out of
//   program order. Collectives go in program order within their group (every
//   member of a group issues them alike, as MPI and NCCL require); a
//   collective that is not ready holds back the later ones of its group only.
// - Receives and ZeRO-3 parameter gathers are posted at most kLookahead
//   compute instructions before their first consumer: enough to hide their
//   latency, few enough to keep memory at the schedule's.
// - Completing a collective first issues the unissued collectives of its
//   group before it; completing a message issues just that message.
// - After the last compute instruction every communication completes, in
//   program order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ir/program.hpp"

namespace piper::ir {

constexpr size_t kLookahead = 2;

// A ZeRO-3 gather of a unit's parameters before one of its passes (as
// opposed to the gather of updated shards after the step's updates).
bool is_zero3_gather(const Instr& c);

// What a player drives. Indices are into Program::compute and Program::comm.
class PlayHost {
 public:
  virtual ~PlayHost() = default;
  // Posts communication instruction k without waiting for it.
  virtual void issue(size_t k) = 0;
  // Completes communication instruction k, issued before: true once it is
  // complete. The executor blocks until then; the simulator answers false
  // while another rank has not issued its side, and is asked again later.
  virtual bool complete(size_t k) = 0;
  // Runs compute instruction i; its waits are complete.
  virtual void run(size_t i) = 0;
};

// One thing a player asked of its host, for comparing two plays.
struct PlayEvent {
  enum What : uint8_t { ISSUE, COMPLETE, RUN } what = RUN;
  size_t index = 0;  // into Program::comm (ISSUE, COMPLETE) or Program::compute (RUN)
  bool operator==(const PlayEvent&) const = default;
};

// Passes everything to `inner` and appends what succeeded to `log`.
class RecordingHost final : public PlayHost {
 public:
  RecordingHost(PlayHost& inner, std::vector<PlayEvent>& log) : inner_(inner), log_(log) {}
  void issue(size_t k) override {
    inner_.issue(k);
    log_.push_back({PlayEvent::ISSUE, k});
  }
  bool complete(size_t k) override {
    if (!inner_.complete(k)) return false;
    log_.push_back({PlayEvent::COMPLETE, k});
    return true;
  }
  void run(size_t i) override {
    inner_.run(i);
    log_.push_back({PlayEvent::RUN, i});
  }

 private:
  PlayHost& inner_;
  std::vector<PlayEvent>& log_;
};

class Player {
 public:
  explicit Player(const Program& program);

  const Program& program() const { return program_; }
  // The first compute instruction that waits for communication instruction
  // k (compute.size() when none does).
  size_t first_use(size_t k) const { return first_use_[k]; }
  // Index of `node` in the communication stream, or -1.
  int comm_index(int node) const;

  struct Progress {
    bool finished = false;  // every instruction ran and every communication completed
    bool moved = false;     // something was issued, completed or run
  };
  // Starts a step: nothing issued, nothing run.
  void start();
  // Plays from where it stopped until the program ends or the host cannot
  // complete a communication yet.
  Progress advance(PlayHost& host);

  // Where the step is, for hosts and tests.
  size_t pc() const { return pc_; }
  bool issued(size_t k) const { return issued_[k] != 0; }
  bool completed(size_t k) const { return completed_[k] != 0; }

 private:
  bool ready(size_t k, size_t done) const { return ready_at_[k] <= done; }
  void issue(PlayHost& host, size_t k, Progress& p);
  void pump(PlayHost& host, size_t done, Progress& p);
  bool finish(PlayHost& host, size_t k, Progress& p);

  const Program& program_;
  std::vector<size_t> first_use_;  // per communication instruction
  std::vector<size_t> ready_at_;   // per communication instruction: compute instructions that must have run
  std::vector<size_t> issuable_from_;  // per communication instruction and one past: the least ready_at_ or
                                       // undeferring point from it on (pump stops where none can go)
  std::vector<int> comm_of_node_;  // graph node -> communication index, -1 (dense over the program's nodes)
  int node_base_ = 0;

  // Per step.
  std::vector<char> issued_, completed_;
  size_t comm_next_ = 0;  // first communication instruction not issued
  // Per communication instruction: where the next unissued one may be, from an issued one on
  // (skipped over by next_unissued, so that pump and finish pass the issued ones in one step).
  std::vector<size_t> skip_;
  size_t next_unissued(size_t k);
  size_t pc_ = 0;         // next compute instruction
  bool pumped_ = false;   // the pump before instruction pc_ ran
  size_t wait_i_ = 0;     // next of pc_'s waits to complete
  size_t drain_i_ = 0;    // next communication instruction to complete after the last compute
};

}  // namespace piper::ir
