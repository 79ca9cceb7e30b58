// verify.hpp — checks a global DAG before any rank runs it.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/model_graph.hpp"

namespace piper::ir {

// The first problem found, naming the offending node and rank.
class VerifyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Checks, in order: every edge names existing nodes; data crosses ranks only
// from a SEND to its RECV, and every SEND has exactly one matching RECV;
// every FWD/BWD input is produced (the previous unit's forward, the next
// unit's backward, the unit's own forward); every (unit, microbatch) has its
// forward and backward and every unit its update; ordering edges join nodes of
// one rank and stream, and each rank's compute order covers all its compute
// nodes; data and ordering edges together are acyclic (a cycle is a schedule
// that deadlocks). Throws VerifyError.
void verify(const Graph& g, const ModelGraph& model);

}  // namespace piper::ir
