// unit_passes.cpp — the communication points of each unit kind's passes.
#include "ir/unit_passes.hpp"

#include <stdexcept>
#include <string>

namespace piper::ir {

PassShape pass_shape(UnitKind kind, NodeKind pass, int tp, int64_t d_model) {
  if (pass != NodeKind::FWD && pass != NodeKind::BWD_I && pass != NodeKind::BWD_W && pass != NodeKind::BWD)
    throw std::logic_error(std::string("pass_shape: ") + node_kind_name(pass) + " is not a unit pass");
  if (tp <= 1 || pass == NodeKind::BWD_W) return {};
  const CommPoint sum_rows{NodeKind::ALLREDUCE, d_model};
  switch (kind) {
    case UnitKind::UNIT_EMBED:
      // Vocab-parallel lookup: each rank's rows, zeros elsewhere, summed. Its
      // backward is the weight half alone and reads only local rows.
      if (pass == NodeKind::FWD) return {1, {sum_rows}};
      return {};
    case UnitKind::UNIT_HEAD:
      // Forward: norm and local logits | row maxima gathered | exponential sums
      // and the target logit | [sum | target] summed | loss and dlogits.
      // Backward: dxn partial from the local vocabulary rows | summed | norm.
      if (pass == NodeKind::FWD) return {3, {{NodeKind::ALLGATHER, 1}, {NodeKind::ALLREDUCE, 2}}};
      return {2, {sum_rows}};
    case UnitKind::UNIT_MAMBA:
    case UnitKind::UNIT_ATTENTION:
    case UnitKind::UNIT_MLP:
    case UnitKind::UNIT_MOE:
      // Forward: norm and the mixer, whose row-parallel output projection
      // leaves partial sums | summed | residual. Backward: the mixer's
      // column-parallel input projections leave a partial dxn | summed | norm
      // backward and residual.
      return {2, {sum_rows}};
  }
  throw std::logic_error("pass_shape: unknown unit kind");
}

}  // namespace piper::ir
