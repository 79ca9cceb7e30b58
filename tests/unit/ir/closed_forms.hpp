// closed_forms.hpp — each pipeline schedule's published bubble and peak activation count, for the
// schedule player's tests (test_pipeline_schedules.cpp) and the simulator's (tests/unit/sim).
// Costs as the papers draw them: F = 1 and a whole backward = 2 (fused B = 2, or BI = BW = 1).
#pragma once

#include <algorithm>

#include "ir/strategy.hpp"

namespace piper::ir::closed {

inline constexpr ScheduleKind GPIPE = ScheduleKind::SCHEDULE_GPIPE;
inline constexpr ScheduleKind ONE_F_ONE_B = ScheduleKind::SCHEDULE_1F1B;
inline constexpr ScheduleKind INTERLEAVED = ScheduleKind::SCHEDULE_INTERLEAVED;
inline constexpr ScheduleKind ZBH1 = ScheduleKind::SCHEDULE_ZBH1;
inline constexpr ScheduleKind DUALPIPEV = ScheduleKind::SCHEDULE_DUALPIPEV;

// Idle time per rank in units of one chunk's F.
inline double closed_form_idle(ScheduleKind kind, int p) {
  const double f = 1, b = 2, bi = 1, bw = 1;  // unit_costs()
  switch (kind) {
    // GPipe and 1F1B (Narayanan et al. SC'21, Sec. 2.2.1): t_pb = (p-1)(t_f + t_b), against the ideal
    // m(t_f + t_b): a fraction (p-1)/m of the ideal, (p-1)/(m+p-1) of the total time.
    case GPIPE:
    case ONE_F_ONE_B: return (p - 1) * (f + b);
    // Interleaved (Narayanan et al. SC'21, Sec. 2.2.2): t_pb = (p-1)(t_f + t_b)/v with t_f, t_b a whole
    // stage's times; one chunk's F and B are t_f/v and t_b/v, so in chunk units (p-1)(F + B).
    case INTERLEAVED: return (p - 1) * (f + b);
    // ZB-H1 (Qi et al. 2024, Sec. 2.1): (p-1)(T_F + T_B - T_W) with T_B the input half, a third of
    // 1F1B's (p-1)(T_F + T_B + T_W) when all three are equal (Sea AI's own summary: bubble rate
    // (p-1)/3m against 1F1B's (p-1)/m); the DualPipe README's ZB1P row (PP-1)(F + B - 2W) is the same
    // with B the whole backward. p-1 for F = BI = BW = 1.
    case ZBH1: return (p - 1) * (f + bi - bw);
    // DualPipeV: the DualPipe README gives (PP/2-1)(F&B + B - 3W), PP = 2p stages, B the whole
    // backward; with the F&B pair run back to back (F&B = F + B = 3), that is 2(p-1). Played here it
    // is (p-1)(F + BI - W) = p-1: one input half less per step, because piper publishes each pass's
    // output (its SEND) when the pass ends, while DualPipeV.step() sends an overlapped F&B pair's
    // outputs and a whole backward's input gradient only after the whole pair or backward. Playing
    // the same order with pairs and whole backwards made atomic gives exactly 2(p-1).
    case DUALPIPEV: return (p - 1) * (f + bi - bw);
  }
  return -1;
}

// Most (microbatch, chunk) activations rank r holds at once; a microbatch stays alive until its B, or
// its W when the backward is split.
inline int expected_peak(ScheduleKind kind, int p, int v, int m, int r) {
  switch (kind) {
    case GPIPE: return m;                            // all forwards first (Huang et al. 2019)
    case ONE_F_ONE_B: return std::min(p - r, m);     // warm-up p-r-1, then one more (Narayanan et al.)
    // Megatron: warm-up 2(p-r-1) + (v-1)p chunk forwards, then one more; on rank 0 that is
    // pv(1 + (p-1)/(pv)) chunks = p(1 + (p-1)/(pv)) stages, the interleaved schedule's known factor
    // 1 + (p-1)/(pv) over 1F1B (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    // Transformer Models").
    case INTERLEAVED: return std::min(2 * (p - r - 1) + (v - 1) * p + 1, m * v);
    // ZB-H1 (Qi et al. 2024, Sec. 2.1): every rank keeps min(p, m) microbatches in flight, rank 0's
    // 1F1B count; those past their B hold only what W needs, so its memory stays 1F1B's.
    case ZBH1: return std::min(p, m);
    // DualPipe README: activation PP+1 per device, PP = 2p stages for DualPipeV.
    case DUALPIPEV: return 2 * p + 1;
  }
  return -1;
}

}  // namespace piper::ir::closed
