// verify.hpp — checks a global DAG before any rank runs it.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/model_graph.hpp"
#include "ir/parallel_dims.hpp"

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

// Checks that every rank's program (ir::lower), played by ir::Player's rules,
// finishes (docs/architecture.md, "Deadlock freedom"): the members of every
// group (ir::group_members under `dims`) issue its collectives in one order,
// and all ranks played together on an abstract clock, where a message
// completes once both sides have issued it and a collective once every
// member has, all finish. For a graph verify() accepts; ir::compile runs
// both. Throws VerifyError naming the op, its rank and what it waits on.
void verify_play(const Graph& g, const ModelGraph& model, const ParallelDims& dims);

}  // namespace piper::ir
