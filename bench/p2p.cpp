// p2p.cpp — point-to-point time and bandwidth through piper's communicator (comm::make_mpi_world,
// progress thread included: the communicator a strategy switch moves the training state over), per
// message size. Ranks pair up as rank i <-> rank i + N/2 (on 4 ranks 0 <-> 2 and 1 <-> 3), and in
// each repetition every rank posts an irecv from its peer and an isend of the same size to it and
// waits for both: the shape of one round of a switch, where every process sends one message and
// receives one. bench/switching.py runs it at the switch's chunk size and prints its table.
//
// Each size: a warm-up, then --reps (>= 5) repetitions of [barrier, isend + irecv, wait]; a
// repetition's time is the maximum over ranks; medians. The payload is checked once per size.
// Usage: mpirun -np N BUILD_DIR/bench/p2p [--reps N] [--bytes B]...  (N even; default sizes 32 MiB
// and 64 MiB) -> one JSON line per size on rank 0:
// {"ranks":N,"bytes":B,"reps":R,"ms":..,"mib_s":..} (bytes: what each rank sends and receives per
// repetition; mib_s: bytes / ms, one direction of one rank).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/mpi_comm.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTag = 11;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Per repetition, the maximum over ranks of each rank's milliseconds.
std::vector<double> max_over_ranks(std::vector<double> mine) {
  MPI_Allreduce(MPI_IN_PLACE, mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return mine;
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: mpirun -np N %s [--reps N] [--bytes B]...  (N even: the ranks pair up; B >= 4)\n",
               argv0);
  return 2;
}

// One size: the median over repetitions of the slowest rank's exchange, in milliseconds.
double exchange_ms(piper::comm::Communicator& world, int64_t bytes, int reps) {
  const int me = world.rank(), peer = (me + world.size() / 2) % world.size();
  const size_t n = static_cast<size_t>(bytes / 4);
  std::vector<float> out(n, static_cast<float>(me)), in(n, -1.0f);
  auto once = [&] {
    world.barrier();
    const auto t0 = Clock::now();
    std::vector<piper::comm::Request> pending;
    pending.push_back(world.irecv(in.data(), n, piper::backend::DType::DTYPE_F32, peer, kTag));
    pending.push_back(world.isend(out.data(), n, piper::backend::DType::DTYPE_F32, peer, kTag));
    piper::comm::wait_all(pending);
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  once();  // warm-up: connections, first touch of the buffers
  if (in.front() != static_cast<float>(peer) || in.back() != static_cast<float>(peer)) {
    std::fprintf(stderr, "p2p: rank %d received %g from rank %d, expected %d\n", me, in.back(), peer, peer);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(once());
  return median(max_over_ranks(t));
}

}  // namespace

int main(int argc, char** argv) {
  piper::comm::init_mpi(&argc, &argv);
  int reps = 9, size = 1;
  bool bad = false;
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc && !bad; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(5, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--bytes") && i + 1 < argc) {
      sizes.push_back(std::atoll(argv[++i]) / 4 * 4);
      bad = sizes.back() < 4;
    } else {
      bad = true;
    }
  }
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (bad || size % 2 != 0) {
    piper::comm::finalize_mpi();
    return usage(argv[0]);
  }
  if (sizes.empty()) sizes = {int64_t{32} << 20, int64_t{64} << 20};
  {
    std::unique_ptr<piper::comm::Communicator> world = piper::comm::make_mpi_world();
    for (const int64_t bytes : sizes) {
      const double ms = exchange_ms(*world, bytes, reps);
      if (world->rank() == 0)
        std::printf("{\"ranks\":%d,\"bytes\":%lld,\"reps\":%d,\"ms\":%.4f,\"mib_s\":%.1f}\n", world->size(),
                    static_cast<long long>(bytes), reps, ms, static_cast<double>(bytes) / 1048576.0 / (ms / 1000.0));
      std::fflush(stdout);
    }
  }
  piper::comm::finalize_mpi();
  return 0;
}
