// alltoall.cpp — all-to-all time and bandwidth per message size through piper's communicator
// (comm::Communicator::ialltoallv, what the MoE dispatch and combine run, progress thread
// included) beside plain blocking MPI_Alltoallv of the same counts on a duplicate of
// MPI_COMM_WORLD, in the same run, the two alternating repetition by repetition. Run under
// mpirun on 2 or more ranks; bench/moe.py prints its table and writes it into docs/benchmarks.md.
//
// Cases: "equal" — every rank sends bytes / n to each rank, its own block included; "variable" —
// routing skewed towards low ranks (as tokens to a hot expert): rank i sends to rank j a share
// proportional to 1 / (j + 1) of its bytes, the rounding remainder to itself, so every rank sends
// `bytes` and rank 0 receives the most. Each (case, size): a warm-up of both, then --reps (>= 5)
// repetitions of [barrier, piper, barrier, MPI]; a repetition's time is the maximum over ranks
// (when it has completed everywhere); medians.
// Usage: mpirun -np N BUILD_DIR/bench/alltoall [--reps N] [--max-bytes B]  -> one JSON line per
// (case, size) on rank 0: {"ranks":N,"case":"equal","bytes":B,"piper_ms":..,"mpi_ms":..,"ratio":..,
// "piper_gb_s":..,"mpi_gb_s":..} (bytes: what each rank sends; GB/s = bytes / time; ratio: piper / MPI time).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_comm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Floats rank `src` sends to rank `dst` of `n`, `floats` in all from each rank.
int64_t share(bool equal, int64_t floats, int src, int dst, int n) {
  if (equal) return floats / n;
  double w = 0;
  for (int j = 0; j < n; ++j) w += 1.0 / (j + 1);
  auto part = [&](int j) { return static_cast<int64_t>(static_cast<double>(floats) / (j + 1) / w); };
  if (dst != src) return part(dst);
  int64_t others = 0;
  for (int j = 0; j < n; ++j) others += j == src ? 0 : part(j);
  return floats - others;
}

struct Counts {
  std::vector<int64_t> send, recv;
  std::vector<int> send_i, send_off, recv_i, recv_off;  // MPI's
};

Counts counts_of(bool equal, int64_t floats, int me, int n) {
  Counts c;
  int sent = 0, received = 0;
  for (int j = 0; j < n; ++j) {
    c.send.push_back(share(equal, floats, me, j, n));
    c.recv.push_back(share(equal, floats, j, me, n));
    c.send_i.push_back(static_cast<int>(c.send.back())), c.send_off.push_back(sent);
    c.recv_i.push_back(static_cast<int>(c.recv.back())), c.recv_off.push_back(received);
    sent += c.send_i.back(), received += c.recv_i.back();
  }
  return c;
}

// Per repetition, the maximum over ranks of each rank's milliseconds.
std::vector<double> max_over_ranks(std::vector<double> mine) {
  MPI_Allreduce(MPI_IN_PLACE, mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return mine;
}

}  // namespace

int main(int argc, char** argv) {
  piper::comm::init_mpi(&argc, &argv);
  int reps = 15;
  int64_t max_bytes = int64_t{16} << 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
      max_bytes = std::max<int64_t>(4096, std::atoll(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: mpirun -np N %s [--reps N] [--max-bytes B]\n", argv[0]);
      piper::comm::finalize_mpi();
      return 2;
    }
  }
  {
    std::unique_ptr<piper::comm::Communicator> world = piper::comm::make_mpi_world();
    MPI_Comm plain;
    MPI_Comm_dup(MPI_COMM_WORLD, &plain);
    const int n = world->size(), me = world->rank();
    for (const bool equal : {true, false})
      for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        const int64_t floats = bytes / 4 / n * n;
        const Counts c = counts_of(equal, floats, me, n);
        std::vector<float> in(static_cast<size_t>(floats), 1.0f), out(static_cast<size_t>(floats) * n, 0.0f);
        auto piper_once = [&] {
          world->barrier();
          const auto t0 = Clock::now();
          world->alltoallv(in.data(), c.send, out.data(), c.recv, piper::backend::DType::DTYPE_F32);
          return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        auto mpi_once = [&] {
          MPI_Barrier(plain);
          const auto t0 = Clock::now();
          MPI_Alltoallv(in.data(), c.send_i.data(), c.send_off.data(), MPI_FLOAT, out.data(), c.recv_i.data(),
                        c.recv_off.data(), MPI_FLOAT, plain);
          return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        piper_once(), mpi_once();  // warm-up: connections, registration
        std::vector<double> tp, tm;
        for (int r = 0; r < reps; ++r) tp.push_back(piper_once()), tm.push_back(mpi_once());
        const double p = median(max_over_ranks(tp)), m = median(max_over_ranks(tm));
        const double sent = static_cast<double>(floats) * 4;
        if (me == 0)
          std::printf("{\"ranks\":%d,\"case\":\"%s\",\"bytes\":%.0f,\"reps\":%d,\"piper_ms\":%.5f,\"mpi_ms\":%.5f,"
                      "\"ratio\":%.4f,\"piper_gb_s\":%.4f,\"mpi_gb_s\":%.4f}\n",
                      n, equal ? "equal" : "variable", sent, reps, p, m, p / m, sent / p / 1e6, sent / m / 1e6);
        std::fflush(stdout);
      }
    MPI_Comm_free(&plain);
  }
  piper::comm::finalize_mpi();
  return 0;
}
