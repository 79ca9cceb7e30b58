// unit_passes.cpp — the communication points of each unit kind's passes.
#include "ir/unit_passes.hpp"

#include <stdexcept>
#include <string>

namespace piper::ir {

namespace {

// An MoE block. Forward: route, permute and count the rows per expert |
// (ep) counts exchanged | receive buffers sized | (ep) rows dispatched to
// their experts' ranks | experts | (ep) outputs returned | weighted combine,
// a tp-partial sum | (tp) summed | residual. Backward: the combine's
// gradients, the routing weights' tp-partial | (tp) weight gradients summed |
// (ep) row gradients to the experts | experts backward | (ep) returned |
// dispatch and router backward, a tp-partial dxn | (tp) summed | norm.
PassShape moe_shape(NodeKind pass, const PassDims& d) {
  PassShape s;
  const CommPoint sum_rows{NodeKind::ALLREDUCE, GroupDim::GROUP_TP, d.d_model, 0};
  const CommPoint rows{NodeKind::ALLTOALL, GroupDim::GROUP_EP, d.top_k * d.d_model, 0, true};
  if (pass == NodeKind::FWD) {
    if (d.ep > 1) s.points = {{NodeKind::ALLTOALL, GroupDim::GROUP_EP, 0, d.n_experts}, rows, rows};
    if (d.tp > 1) s.points.push_back(sum_rows);
  } else {
    if (d.tp > 1) s.points.push_back({NodeKind::ALLREDUCE, GroupDim::GROUP_TP, d.top_k, 0});
    if (d.ep > 1) s.points.push_back(rows), s.points.push_back(rows);
    if (d.tp > 1) s.points.push_back(sum_rows);
  }
  s.segments = static_cast<int>(s.points.size()) + 1;
  return s;
}

}  // namespace

PassDims pass_dims(const ModelGraph& model, int tp, int ep) {
  return {tp, ep, model.d_model, model.top_k, model.n_experts};
}

PassShape pass_shape(UnitKind kind, NodeKind pass, const PassDims& d) {
  if (pass != NodeKind::FWD && pass != NodeKind::BWD_I && pass != NodeKind::BWD_W && pass != NodeKind::BWD)
    throw std::logic_error(std::string("pass_shape: ") + node_kind_name(pass) + " is not a unit pass");
  if (pass == NodeKind::BWD_W) return {};
  if (kind == UnitKind::UNIT_MOE) return moe_shape(pass, d);
  if (d.tp <= 1) return {};
  const CommPoint sum_rows{NodeKind::ALLREDUCE, GroupDim::GROUP_TP, d.d_model, 0};
  switch (kind) {
    case UnitKind::UNIT_EMBED:
      // Vocab-parallel lookup: each rank's rows, zeros elsewhere | summed | the
      // sum stored in the activations' type. Its backward is the weight half
      // alone and reads only local rows.
      if (pass == NodeKind::FWD) return {2, {sum_rows}};
      return {};
    case UnitKind::UNIT_HEAD:
      // Forward: norm and local logits | row maxima summed into an [M, tp]
      // table of zeros (each rank's in its column) | exponential sums and the
      // target logit | [sum | target] summed | loss and dlogits.
      // Backward: dxn partial from the local vocabulary rows | summed | norm.
      if (pass == NodeKind::FWD)
        return {3, {{NodeKind::ALLREDUCE, GroupDim::GROUP_TP, d.tp, 0}, {NodeKind::ALLREDUCE, GroupDim::GROUP_TP, 2, 0}}};
      return {2, {sum_rows}};
    case UnitKind::UNIT_MAMBA:
    case UnitKind::UNIT_ATTENTION:
    case UnitKind::UNIT_MLP:
      // Forward: norm and the mixer, whose row-parallel output projection
      // leaves partial sums | summed | residual. Backward: the mixer's
      // column-parallel input projections leave a partial dxn | summed | norm
      // backward and residual.
      return {2, {sum_rows}};
    case UnitKind::UNIT_MOE: break;
  }
  throw std::logic_error("pass_shape: unknown unit kind");
}

}  // namespace piper::ir
