// checkpoint.hpp — one HDF5 file per checkpoint, written and read by all ranks together through parallel
// HDF5 (MPI-IO, collective hyperslab I/O). Format, checksum and crash safety: docs/checkpoint.md.
//
// Every dataset is fp32 with its global shape; a rank writes and reads only its elements, named as runs of
// global flat (row-major) indices. An element offered by several ranks (a replicated tensor) is written once,
// by the lowest of them. Each dataset carries a uint64 attribute `checksum` (see checksum_term) that load
// verifies in the same pass as it reads: each element summed by the lowest rank that reads it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace piper::checkpoint {

// Every failure: names the file, the dataset where there is one, and what was wrong.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Run {
  int64_t begin, end;  // global flat (row-major) element indices, [begin, end)
};

struct DatasetSpec {  // every dataset, the same list on every rank
  std::string name;   // path in the file, e.g. "/model/layers.0.mixer.in_proj.weight" (leading '/' optional)
  std::vector<int64_t> shape;
};

struct Piece {  // this rank's elements of one dataset, packed run after run
  std::string dataset;
  std::vector<Run> runs;
  const float* data;
};

struct Request {  // elements to read, packed into `out` run after run (runs may be in any order, may overlap)
  std::string dataset;
  std::vector<Run> runs;
  float* out;
};

// Format 2 added the tokenizer; a format-1 file was written with the byte tokenizer.
inline constexpr int kFormatVersion = 2;

struct Meta {
  int64_t step = 0, tokens_seen = 0, data_position = 0;
  uint64_t seed = 0;
  std::string config_yaml, strategy;
  std::string tokenizer = "byte";  // the kind of the tokenizer the run's data was made with (data::kind_name)
  std::string tokenizer_model;     // its model file's bytes: empty for the byte tokenizer
  int format_version = kFormatVersion;
};

// A save that did not complete: a write error (ENOSPC, EIO, ...), a file system without room, a folder that
// cannot be written. Every rank throws it with the same text (the first rank that failed, the path, the OS
// error); the temporary file is removed and nothing else in the folder changes.
class SaveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SaveOptions {
  bool direct_io = true;   // whole pages with O_DIRECT where the file system allows it
  double timeout_s = 300;  // every wait for another rank (comm::agree, comm::wait_bounded)
};

// Collective over comm, every wait bounded by options.timeout_s (comm::StallError names a rank that does not
// arrive). Writes PATH through a temporary name (.NAME.tmp in the same directory):
//   1. rank 0 builds the file's structure alone, in memory (every dataset with its storage allocated, its
//      checksum, the root attributes), checks the file system has room for the whole file and reserves it
//      (fallocate), and writes the structure there;
//   2. every rank writes its elements at the offsets HDF5 allocated (whole pages with O_DIRECT where allowed,
//      the rest through the page cache) and flushes them to the disk;
//   3. rank 0 renames the temporary over PATH and syncs the directory.
// After each step the ranks agree; a failure anywhere throws SaveError on every rank after rank 0 removed the
// temporary. The pieces of all ranks together must cover every element of every dataset.
void save(const std::string& path, MPI_Comm comm, const Meta& meta, const std::vector<DatasetSpec>& all,
          const std::vector<Piece>& mine, const SaveOptions& options = {});

// An upper bound on the bytes a checkpoint of these datasets takes on disk (data, structure, attributes):
// what a save needs free, known before the file exists.
int64_t estimated_bytes(const std::vector<DatasetSpec>& all, const Meta& meta);

// Collective: opens PATH, checks each expected dataset exists with the expected shape, reads this rank's
// requests (independent hyperslab reads) and verifies every checksum in the same pass (elements no rank
// requests are read for that alone), returns the root attributes, each checked for range and type. Waits for
// other ranks are bounded by timeout_s. On a failure the requests' buffers may
// already hold part of the file.
Meta load(const std::string& path, MPI_Comm comm, const std::vector<DatasetSpec>& expected,
          const std::vector<Request>& mine, double timeout_s = 300);

// One process, no MPI needed: everything about a checkpoint (`piper ckpt inspect`), with `verify` every
// dataset's checksum recomputed (`piper ckpt verify`; without it checksum_ok is true).
struct DatasetInfo {
  std::string name;  // full path, "/model/..."
  std::vector<int64_t> shape;
  bool checksum_ok;
};
struct Inspection {
  Meta meta;
  std::vector<DatasetInfo> datasets;  // every dataset in the file, sorted by name
  int64_t bytes;                      // file size
};
Inspection inspect(const std::string& path, bool verify);

// The checksum of a dataset is the sum, modulo 2^64, of checksum_term(i, x_i) over its elements, i the global
// flat index and x_i the float: order-independent, so ranks add partial sums (MPI_UINT64_T, MPI_SUM).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t checksum_term(uint64_t index, uint32_t float_bits) {
  return splitmix64((index * 0x9E3779B97F4A7C15ull) ^ float_bits);
}
// Sum of checksum_term over data[k] at global index first + k.
uint64_t checksum_range(int64_t first, const float* data, int64_t n);

// "[a,b,c]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace piper::checkpoint
