// player.cpp — one rank's program played by the rules of player.hpp.
#include "ir/player.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace piper::ir {

bool is_zero3_gather(const Instr& c) {
  return c.kind == NodeKind::ALLGATHER && c.payload == Payload::PAYLOAD_PARAMS && c.microbatch >= 0;
}

Player::Player(const Program& program) : program_(program) {
  const auto& comm = program_.comm;
  const auto& compute = program_.compute;
  int lo = 0, hi = -1;
  for (const auto* s : {&comm, &compute})
    for (const Instr& in : *s) {
      if (hi < lo) lo = hi = in.node;
      lo = std::min(lo, in.node), hi = std::max(hi, in.node);
    }
  node_base_ = lo;
  comm_of_node_.assign(static_cast<size_t>(std::max(0, hi - lo + 1)), -1);
  for (size_t k = 0; k < comm.size(); ++k) comm_of_node_[static_cast<size_t>(comm[k].node - lo)] = static_cast<int>(k);
  std::vector<size_t> compute_of(comm_of_node_.size(), 0);
  for (size_t i = 0; i < compute.size(); ++i) compute_of[static_cast<size_t>(compute[i].node - lo)] = i;
  first_use_.assign(comm.size(), compute.size());
  for (size_t i = 0; i < compute.size(); ++i)
    for (int w : compute[i].waits) {
      const int k = comm_index(w);
      if (k >= 0) first_use_[static_cast<size_t>(k)] = std::min(first_use_[static_cast<size_t>(k)], i);
    }
  // A communication instruction waits only for compute of this rank (ir::lower).
  ready_at_.assign(comm.size(), 0);
  for (size_t k = 0; k < comm.size(); ++k)
    for (int w : comm[k].waits) ready_at_[k] = std::max(ready_at_[k], compute_of[static_cast<size_t>(w - lo)] + 1);
  // No instruction from k on can be issued before this many compute instructions have run.
  issuable_from_.assign(comm.size() + 1, compute.size() + 1);
  for (size_t k = comm.size(); k-- > 0;) {
    const bool deferrable = comm[k].kind == NodeKind::RECV || is_zero3_gather(comm[k]);
    const size_t undeferred = deferrable && first_use_[k] > kLookahead ? first_use_[k] - kLookahead : 0;
    issuable_from_[k] = std::min(issuable_from_[k + 1], std::max(ready_at_[k], undeferred));
  }
  start();
}

int Player::comm_index(int node) const {
  const int i = node - node_base_;
  return i >= 0 && static_cast<size_t>(i) < comm_of_node_.size() ? comm_of_node_[static_cast<size_t>(i)] : -1;
}

void Player::start() {
  issued_.assign(program_.comm.size(), 0);
  completed_.assign(program_.comm.size(), 0);
  skip_.resize(program_.comm.size());
  for (size_t k = 0; k < skip_.size(); ++k) skip_[k] = k + 1;
  comm_next_ = pc_ = wait_i_ = drain_i_ = 0;
  pumped_ = false;
}

void Player::issue(PlayHost& host, size_t k, Progress& p) {
  host.issue(k);
  issued_[k] = 1;
  p.moved = true;
  comm_next_ = next_unissued(comm_next_);
}

// The first unissued communication instruction from k on (its count when none), shortening the
// skips it passes so that the next search jumps straight there.
size_t Player::next_unissued(size_t k) {
  size_t r = k;
  while (r < issued_.size() && issued_[r]) r = skip_[r];
  while (k < r && issued_[k]) {
    const size_t next = skip_[k];
    skip_[k] = r;
    k = next;
  }
  return r;
}

// Issues every ready communication instruction; `done` compute instructions have run.
void Player::pump(PlayHost& host, size_t done, Progress& p) {
  constexpr size_t kGroups = 4;  // GroupDim values
  bool blocked[kGroups] = {};
  // Unissued instructions in order; issuable_from_ never decreases, so passing the issued ones
  // stops where the plain scan would.
  for (size_t k = next_unissued(comm_next_); k < program_.comm.size() && issuable_from_[k] <= done;
       k = next_unissued(k + 1)) {
    const Instr& c = program_.comm[k];
    const bool p2p = is_p2p(c.kind);
    bool& group_blocked = blocked[static_cast<size_t>(c.group) % kGroups];
    if (!p2p && group_blocked) continue;
    const bool deferred = (c.kind == NodeKind::RECV || is_zero3_gather(c)) && first_use_[k] > pc_ + kLookahead;
    if (!ready(k, done) || deferred) {
      group_blocked |= !p2p;
      continue;
    }
    issue(host, k, p);
  }
}

// Completes communication instruction k, issuing it (and, for a collective,
// the unissued collectives of its group before it) first.
bool Player::finish(PlayHost& host, size_t k, Progress& p) {
  if (completed_[k]) return true;
  const Instr& target = program_.comm[k];
  const bool p2p = is_p2p(target.kind);
  // Once k is issued, so are the collectives of its group before it (pump and this loop keep group order).
  for (size_t j = p2p || issued_[k] ? k : comm_next_; j <= k; ++j) {
    const Instr& c = program_.comm[j];
    if (issued_[j] || (j != k && (is_p2p(c.kind) || c.group != target.group))) continue;
    if (!ready(j, pc_))
      throw std::logic_error("rank " + std::to_string(program_.rank) + ": communication node " +
                             std::to_string(c.node) + " must be issued before node " + std::to_string(target.node) +
                             " completes, but waits for compute that has not run");
    issue(host, j, p);
  }
  if (!host.complete(k)) return false;
  completed_[k] = 1;
  p.moved = true;
  return true;
}

Player::Progress Player::advance(PlayHost& host) {
  Progress p;
  const auto& compute = program_.compute;
  while (pc_ < compute.size()) {
    const Instr& in = compute[pc_];
    if (!pumped_) {
      pump(host, pc_, p);
      pumped_ = true;
      wait_i_ = 0;
    }
    for (; wait_i_ < in.waits.size(); ++wait_i_) {
      const int k = comm_index(in.waits[wait_i_]);
      if (k >= 0 && !finish(host, static_cast<size_t>(k), p)) return p;
    }
    host.run(pc_);
    p.moved = true;
    pump(host, pc_ + 1, p);
    ++pc_;
    pumped_ = false;
  }
  for (; drain_i_ < program_.comm.size(); ++drain_i_)
    if (!finish(host, drain_i_, p)) return p;
  p.finished = true;
  return p;
}

}  // namespace piper::ir
