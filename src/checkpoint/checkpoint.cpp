// checkpoint.cpp — parallel HDF5 checkpoints (checkpoint.hpp, docs/checkpoint.md).
#include "checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/files.hpp"
#include "comm/agreement.hpp"
#include "comm/mpi_comm.hpp"

namespace piper::checkpoint {
namespace fs = std::filesystem;

uint64_t checksum_range(int64_t first, const float* data, int64_t n) {
  uint64_t s = 0;
  for (int64_t k = 0; k < n; ++k) {
    uint32_t bits;
    std::memcpy(&bits, data + k, 4);
    s += checksum_term(static_cast<uint64_t>(first + k), bits);
  }
  return s;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

// ---- HDF5 plumbing ------------------------------------------------------------------------------------

// The innermost message of HDF5's error stack (automatic printing is off), then the stack cleared.
herr_t walk_cb(unsigned, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (e->desc && *e->desc) *s = e->desc;  // walking down, the last is the deepest: where it was detected
  return 0;
}
std::string h5_error() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &s);
  H5Eclear2(H5E_DEFAULT);
  if (s.empty()) return "HDF5 error";
  // An operating-system error, e.g. "file write failed: time = ..., errno = 28, error message = 'No space
  // left on device', buf = ...": what failed and the OS's words.
  const size_t m = s.find("error message = '");
  if (m != std::string::npos) {
    const size_t b = m + 17, e = s.find('\'', b);
    return s.substr(0, s.find(':')) + ": " + s.substr(b, e == std::string::npos ? std::string::npos : e - b);
  }
  return s;
}

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// Owns an HDF5 identifier.
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*closer)(hid_t)) : id_(id), close_(closer) {}
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handed to the C API everywhere
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }
  // Closes now, reporting failure (a file's close is where buffered writes land).
  herr_t close() {
    herr_t rc = 0;
    if (id_ >= 0 && close_) rc = close_(id_);
    id_ = H5I_INVALID_HID;
    return rc;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Errors name the file (and the dataset).
struct Where {
  std::string file;
  [[noreturn]] void fail(const std::string& what) const { throw CheckpointError("checkpoint " + file + ": " + what); }
  [[noreturn]] void fail(const std::string& dataset, const std::string& what) const {
    throw CheckpointError("checkpoint " + file + ": dataset " + dataset + ": " + what);
  }
  Id check(hid_t id, herr_t (*close)(hid_t), const std::string& what) const {
    if (id < 0) fail(what + ": " + h5_error());
    return Id(id, close);
  }
  Id check(hid_t id, herr_t (*close)(hid_t), const std::string& dataset, const std::string& what) const {
    if (id < 0) fail(dataset, what + ": " + h5_error());
    return Id(id, close);
  }
  void check(herr_t rc, const std::string& what) const {
    if (rc < 0) fail(what + ": " + h5_error());
  }
  void check(herr_t rc, const std::string& dataset, const std::string& what) const {
    if (rc < 0) fail(dataset, what + ": " + h5_error());
  }
};

std::string norm_name(const std::string& name) { return (!name.empty() && name[0] == '/') ? name : "/" + name; }

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Elements per collective I/O call and rank (PIPER_CKPT_ROUND_ELEMS overrides, for tests).
int64_t round_elems() {
  if (const char* e = std::getenv("PIPER_CKPT_ROUND_ELEMS")) {
    const long long v = std::atoll(e);
    if (v > 0) return v;
  }
  return int64_t{1} << 26;  // 256 MB of fp32
}

// Selects the union of sorted, disjoint flat runs in `space` (a dataspace of shape `dims`): each run as up
// to 2*rank-1 hyperslab blocks (a partial first row, full rows, a partial last row, recursively), OR-ed.
class Selector {
 public:
  Selector(hid_t space, std::vector<hsize_t> dims) : space_(space), dims_(std::move(dims)) {
    start_.assign(dims_.size(), 0);
    count_.assign(dims_.size(), 1);
  }
  herr_t select(const std::vector<Run>& runs) {
    if (dims_.empty()) {  // a scalar: one element
      for (const Run& r : runs)
        if (r.end > r.begin) return H5Sselect_all(space_);
      return H5Sselect_none(space_);
    }
    first_ = true;
    rc_ = 0;
    for (const Run& r : runs)
      if (r.end > r.begin) add(0, static_cast<hsize_t>(r.begin), static_cast<hsize_t>(r.end));
    if (first_) return H5Sselect_none(space_);
    return rc_;
  }

 private:
  void emit() {
    if (rc_ < 0) return;
    rc_ = H5Sselect_hyperslab(space_, first_ ? H5S_SELECT_SET : H5S_SELECT_OR, start_.data(), nullptr,
                              count_.data(), nullptr);
    first_ = false;
  }
  // [b, e) of the sub-array dims_[k..] at the prefix start_[0..k-1].
  void add(size_t k, hsize_t b, hsize_t e) {
    const size_t n = dims_.size();
    if (k + 1 == n) {
      start_[k] = b;
      count_[k] = e - b;
      emit();
      return;
    }
    hsize_t inner = 1;
    for (size_t j = k + 1; j < n; ++j) inner *= dims_[j];
    if (b % inner != 0) {  // partial first row
      const hsize_t row = b / inner;
      const hsize_t stop = std::min(e, (row + 1) * inner);
      start_[k] = row;
      count_[k] = 1;
      add(k + 1, b - row * inner, stop - row * inner);
      b = stop;
      if (b >= e) return;
    }
    if (e / inner > b / inner) {  // full rows
      start_[k] = b / inner;
      count_[k] = e / inner - b / inner;
      for (size_t j = k + 1; j < n; ++j) {
        start_[j] = 0;
        count_[j] = dims_[j];
      }
      emit();
    }
    if (e % inner != 0) {  // partial last row
      const hsize_t row = e / inner;
      start_[k] = row;
      count_[k] = 1;
      add(k + 1, 0, e - row * inner);
    }
  }

  hid_t space_;
  std::vector<hsize_t> dims_, start_, count_;
  bool first_ = true;
  herr_t rc_ = 0;
};

std::vector<hsize_t> to_hsize(const std::vector<int64_t>& v) { return std::vector<hsize_t>(v.begin(), v.end()); }

// A run of a dataset and where its elements are in memory.
template <class P>
struct Seg {
  int64_t b, e;
  P ptr;
};

// Splits sorted segments into rounds of at most k elements each.
template <class P>
std::vector<std::vector<Seg<P>>> split_rounds(const std::vector<Seg<P>>& segs, int64_t k) {
  std::vector<std::vector<Seg<P>>> rounds;
  std::vector<Seg<P>> cur;
  int64_t in_cur = 0;
  for (Seg<P> s : segs) {
    while (s.e > s.b) {
      const int64_t take = std::min(s.e - s.b, k - in_cur);
      cur.push_back({s.b, s.b + take, s.ptr});
      s.b += take;
      s.ptr += take;
      in_cur += take;
      if (in_cur == k) {
        rounds.push_back(std::move(cur));
        cur.clear();
        in_cur = 0;
      }
    }
  }
  if (!cur.empty()) rounds.push_back(std::move(cur));
  return rounds;
}

// One independent read of sorted, disjoint segments: on the file side the union of their runs, in memory one
// contiguous block (the segments' own when they lie back to back, else a packed copy). Nothing to do for no
// segments: no rank waits for another here.
void read_segs(const Where& w, const std::string& name, hid_t dset, const std::vector<hsize_t>& dims,
               const std::vector<Seg<float*>>& segs) {
  std::vector<Run> runs;
  int64_t total = 0;
  bool contiguous = true;
  for (size_t i = 0; i < segs.size(); ++i) {
    runs.push_back({segs[i].b, segs[i].e});
    if (i && segs[i].ptr != segs[i - 1].ptr + (segs[i - 1].e - segs[i - 1].b)) contiguous = false;
    total += segs[i].e - segs[i].b;
  }
  if (total == 0) return;
  Id fspace = w.check(H5Dget_space(dset), H5Sclose, name, "cannot get its dataspace");
  Selector sel(fspace, dims);
  w.check(sel.select(runs), name, "cannot select runs");
  const hsize_t mdim = static_cast<hsize_t>(total);
  Id mspace = w.check(H5Screate_simple(1, &mdim, nullptr), H5Sclose, name, "cannot create a memory space");
  std::vector<float> pack;
  float* buf = segs[0].ptr;
  if (!contiguous) {
    pack.resize(static_cast<size_t>(total));
    buf = pack.data();
  }
  w.check(H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, buf), name, "read failed");
  if (!contiguous) {
    int64_t o = 0;
    for (const auto& s : segs) {
      std::memcpy(s.ptr, pack.data() + o, static_cast<size_t>(s.e - s.b) * 4);
      o += s.e - s.b;
    }
  }
}

// Writes a rank's bytes straight to the offsets HDF5 allocated for them. With direct I/O (and a file system
// that allows it) every 4 KiB page that lies wholly inside a run goes through O_DIRECT (no page cache: on a
// VM, filling fresh page-cache pages is slower than the disk itself) and the partial pages at a run's ends
// through the page cache; a page shared by two ranks' runs is always a partial page for both, so no page is
// written both ways. Otherwise everything goes through the page cache, the disk started on each write
// (sync_file_range, no waiting) so that the final flush finds little left. finish() flushes this rank's
// writes to the disk; every error names the dataset, the offset and the OS error.
class DataWriter {
 public:
  static constexpr int64_t kPage = 4096;
  static constexpr int64_t kChunk = int64_t{8} << 20;  // bytes per direct write, through an aligned buffer

  DataWriter(const Where& w, const std::string& path, bool direct_io) : w_(w) {
    buffered_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (buffered_ < 0) w_.fail(std::string("cannot open to write: ") + std::strerror(errno));
#ifdef O_DIRECT
    if (direct_io) direct_ = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
#else
    (void)direct_io;
#endif
    void* p = nullptr;
    if (direct_ >= 0 && ::posix_memalign(&p, static_cast<size_t>(kPage), static_cast<size_t>(kChunk)) != 0) {
      ::close(direct_);
      direct_ = -1;
    }
    bounce_.reset(static_cast<char*>(p));
  }
  DataWriter(const DataWriter&) = delete;
  DataWriter& operator=(const DataWriter&) = delete;
  ~DataWriter() {
    if (direct_ >= 0) ::close(direct_);
    if (buffered_ >= 0) ::close(buffered_);
  }

  // Bytes [off, off + n) of the file from src.
  void write(const std::string& dataset, int64_t off, const char* src, int64_t n) {
    if (direct_ < 0) {
      put(dataset, buffered_, src, n, off);
#ifdef __linux__
      ::sync_file_range(buffered_, off, n, SYNC_FILE_RANGE_WRITE);  // a hint: the flush does what it leaves
#endif
      return;
    }
    const int64_t a = (off + kPage - 1) / kPage * kPage, z = (off + n) / kPage * kPage;
    if (a >= z) return put(dataset, buffered_, src, n, off);
    if (a > off) put(dataset, buffered_, src, a - off, off);
    for (int64_t p = a; p < z; p += kChunk) {
      const int64_t len = std::min(kChunk, z - p);
      std::memcpy(bounce_.get(), src + (p - off), static_cast<size_t>(len));
      put(dataset, direct_, bounce_.get(), len, p);
    }
    if (off + n > z) put(dataset, buffered_, src + (z - off), off + n - z, z);
  }

  // This rank's writes on the disk (a write error the kernel deferred shows here).
  void finish() {
    if (::fdatasync(buffered_) != 0) w_.fail(std::string("flushing the written data failed: ") + std::strerror(errno));
  }

 private:
  void put(const std::string& dataset, int fd, const char* src, int64_t n, int64_t off) {
    while (n > 0) {
      const ssize_t k = ::pwrite(fd, src, static_cast<size_t>(n), static_cast<off_t>(off));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) w_.fail(dataset, "write of " + std::to_string(n) + " bytes at " + std::to_string(off) +
                                       " failed: " + std::strerror(k < 0 ? errno : ENOSPC));
      src += k, n -= k, off += k;
    }
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  const Where& w_;
  int direct_ = -1, buffered_ = -1;
  std::unique_ptr<char, Free> bounce_;
};

// ---- attributes -----------------------------------------------------------------------------------------

void write_attr(const Where& w, hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
  Id space = w.check(H5Screate(H5S_SCALAR), H5Sclose, std::string("attribute ") + name);
  Id a = w.check(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                 std::string("cannot create attribute ") + name);
  w.check(H5Awrite(a, mem_type, v), std::string("cannot write attribute ") + name);
}
void write_attr_str(const Where& w, hid_t obj, const char* name, const std::string& s) {
  Id t = w.check(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  std::string v = s.empty() ? std::string(1, '\0') : s;
  w.check(H5Tset_size(t, v.size()), "string type");
  w.check(H5Tset_strpad(t, H5T_STR_NULLPAD), "string type");
  w.check(H5Tset_cset(t, H5T_CSET_UTF8), "string type");
  write_attr(w, obj, name, t, t, v.data());
}

Id open_attr(const Where& w, hid_t obj, const char* name, const std::string& dataset) {
  const htri_t ex = H5Aexists(obj, name);
  if (ex < 0) {
    const std::string what = std::string("cannot read attribute ") + name + " (the file's structure is damaged): " + h5_error();
    if (dataset.empty()) w.fail(what);
    w.fail(dataset, what);
  }
  if (ex == 0) {
    if (dataset.empty()) w.fail(std::string("missing attribute ") + name);
    w.fail(dataset, std::string("missing attribute ") + name);
  }
  return w.check(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, std::string("cannot open attribute ") + name);
}
template <class T>
T read_attr(const Where& w, hid_t obj, const char* name, hid_t mem_type, const std::string& dataset = "") {
  Id a = open_attr(w, obj, name, dataset);
  T v{};
  w.check(H5Aread(a, mem_type, &v), std::string("cannot read attribute ") + name);
  return v;
}
std::string read_attr_str(const Where& w, hid_t obj, const char* name) {
  Id a = open_attr(w, obj, name, "");
  Id ft = w.check(H5Aget_type(a), H5Tclose, std::string("attribute ") + name);
  if (H5Tget_class(ft) != H5T_STRING) w.fail(std::string("attribute ") + name + " is not a string");
  if (H5Tis_variable_str(ft) > 0) {  // written by another tool (h5py's default)
    Id mt = w.check(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
    H5Tset_size(mt, H5T_VARIABLE);
    char* p = nullptr;
    w.check(H5Aread(a, mt, &p), std::string("cannot read attribute ") + name);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t n = H5Tget_size(ft);
  std::string s(n, '\0');
  w.check(H5Aread(a, ft, s.data()), std::string("cannot read attribute ") + name);
  s.resize(std::strlen(s.c_str()));
  return s;
}

void write_meta(const Where& w, hid_t file, const Meta& m) {
  const int version = m.format_version;
  write_attr(w, file, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT, &version);
  write_attr(w, file, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &m.step);
  write_attr(w, file, "tokens_seen", H5T_STD_I64LE, H5T_NATIVE_INT64, &m.tokens_seen);
  write_attr(w, file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &m.seed);
  write_attr(w, file, "data_position", H5T_STD_I64LE, H5T_NATIVE_INT64, &m.data_position);
  write_attr_str(w, file, "config", m.config_yaml);
  write_attr_str(w, file, "strategy", m.strategy);
  write_attr_str(w, file, "tokenizer", m.tokenizer);
  if (!m.tokenizer_model.empty()) {  // bytes, NULs included: a uint8 array, in dense attribute storage past 64 KiB
    const hsize_t n = m.tokenizer_model.size();
    Id space = w.check(H5Screate_simple(1, &n, nullptr), H5Sclose, "attribute tokenizer_model");
    Id a = w.check(H5Acreate2(file, "tokenizer_model", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                   "cannot create attribute tokenizer_model");
    w.check(H5Awrite(a, H5T_NATIVE_UCHAR, m.tokenizer_model.data()), "cannot write attribute tokenizer_model");
  }
  write_attr_str(w, file, "checksum_algorithm",
                 "sum mod 2^64 over elements i of splitmix64(i * 0x9E3779B97F4A7C15 ^ float_bits(x_i))");
}

// The largest step, token count or data position a checkpoint may record: 2^50, far beyond any run, far below
// where step * global_batch * seq_len could overflow.
constexpr int64_t kMaxCount = int64_t{1} << 50;

int64_t read_count(const Where& w, hid_t file, const char* name) {
  Id a = open_attr(w, file, name, "");
  Id t = w.check(H5Aget_type(a), H5Tclose, std::string("attribute ") + name);
  if (H5Tget_class(t) != H5T_INTEGER)
    w.fail(std::string("attribute ") + name + " is not an integer (damaged, or not written by piper)");
  const int64_t v = read_attr<int64_t>(w, file, name, H5T_NATIVE_INT64);
  if (v < 0 || v > kMaxCount)
    w.fail(std::string("attribute ") + name + " is " + std::to_string(v) + ", outside 0.." +
           std::to_string(kMaxCount) + " (damaged or edited)");
  return v;
}

Meta read_meta(const Where& w, hid_t file) {
  Meta m;
  m.format_version = read_attr<int>(w, file, "format_version", H5T_NATIVE_INT);
  if (m.format_version < 1 || m.format_version > kFormatVersion)
    w.fail("format_version " + std::to_string(m.format_version) + ", this piper reads 1 to " +
           std::to_string(kFormatVersion));
  m.step = read_count(w, file, "step");
  m.tokens_seen = read_count(w, file, "tokens_seen");
  m.seed = read_attr<uint64_t>(w, file, "seed", H5T_NATIVE_UINT64);
  m.data_position = read_count(w, file, "data_position");
  // Each step reads at least one sequence of at least one token.
  if (m.data_position < m.step || m.tokens_seen < m.data_position)
    w.fail("attributes step " + std::to_string(m.step) + ", data_position " + std::to_string(m.data_position) +
           " and tokens_seen " + std::to_string(m.tokens_seen) +
           " disagree (each step reads at least one sequence of at least one token): damaged or edited");
  m.config_yaml = read_attr_str(w, file, "config");
  m.strategy = read_attr_str(w, file, "strategy");
  if (m.format_version >= 2) {
    m.tokenizer = read_attr_str(w, file, "tokenizer");
    if (m.tokenizer != "byte" && m.tokenizer != "sentencepiece")
      w.fail("attribute tokenizer is '" + m.tokenizer + "' (expected byte or sentencepiece)");
    const htri_t has_model = H5Aexists(file, "tokenizer_model");
    if (has_model < 0) w.fail("cannot read attribute tokenizer_model (the file's structure is damaged): " + h5_error());
    if ((has_model > 0) != (m.tokenizer == "sentencepiece"))
      w.fail(std::string("the ") + m.tokenizer + " tokenizer " + (has_model > 0 ? "has" : "needs") +
             " a tokenizer_model attribute: damaged or edited");
    if (has_model > 0) {
      Id a = open_attr(w, file, "tokenizer_model", "");
      Id space = w.check(H5Aget_space(a), H5Sclose, "attribute tokenizer_model");
      hsize_t n = 0;
      if (H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, &n, nullptr) != 1)
        w.fail("attribute tokenizer_model is not a byte array: damaged or edited");
      m.tokenizer_model.resize(n);
      w.check(H5Aread(a, H5T_NATIVE_UCHAR, m.tokenizer_model.data()), "cannot read attribute tokenizer_model");
    }
  }
  return m;
}

// ---- agreement among ranks --------------------------------------------------------------------------------

// Runs f on this rank, then agrees on the outcome (comm::agree, bounded by timeout_s): when any rank failed,
// every rank throws E with the lowest failing rank's message, so that no rank walks on into a step the others
// skip.
template <class E, class F>
void local_step(MPI_Comm comm, double timeout_s, const std::string& phase, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "checkpoint: unknown error";
    int size = 1;
    MPI_Comm_size(comm, &size);
    if (size > 1) err += " (world rank " + std::to_string(comm::mpi_world_rank()) + ", host " + comm::mpi_host_name() + ")";
  }
  const std::string first = comm::agree(comm, err, timeout_s, phase);
  if (!first.empty()) throw E(first);
}

// Sums n values over comm into out, bounded by timeout_s.
template <class T>
void sum_all(MPI_Comm comm, const T* in, T* out, size_t n, MPI_Datatype type, double timeout_s, const char* phase) {
  MPI_Request r;
  MPI_Iallreduce(in, out, static_cast<int>(n), type, MPI_SUM, comm, &r);
  comm::wait_bounded(&r, 1, timeout_s, phase, comm);
}

Id mpio_fapl(const Where& w, MPI_Comm comm) {
  Id fapl = w.check(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  w.check(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL), "cannot use MPI-IO");
  w.check(H5Pset_all_coll_metadata_ops(fapl, true), "collective metadata");
  w.check(H5Pset_coll_metadata_write(fapl, true), "collective metadata");
  return fapl;
}

// Opens dataset `name`, distinguishing a missing one (any missing group on the way) from other failures.
Id open_dataset(const Where& w, hid_t file, const std::string& name) {
  size_t pos = 1;
  while (true) {
    const size_t slash = name.find('/', pos);
    const std::string prefix = name.substr(0, slash);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      w.fail(name, "missing tensor");
    }
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  Id d = w.check(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, name, "cannot open (not a dataset?)");
  return d;
}

std::vector<int64_t> dataset_shape(const Where& w, hid_t dset, const std::string& name) {
  Id space = w.check(H5Dget_space(dset), H5Sclose, name, "cannot get its dataspace");
  const int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0) w.fail(name, "cannot read its shape: " + h5_error());
  std::vector<hsize_t> d(static_cast<size_t>(nd));
  if (nd > 0) H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return std::vector<int64_t>(d.begin(), d.end());
}

void check_float32(const Where& w, hid_t dset, const std::string& name) {
  Id t = w.check(H5Dget_type(dset), H5Tclose, name, "cannot read its type");
  if (H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 4) w.fail(name, "not fp32");
}

// ---- runs -------------------------------------------------------------------------------------------------

// Sorted, with overlapping and adjacent runs merged.
std::vector<Run> merged(std::vector<Run> v) {
  std::sort(v.begin(), v.end(), [](const Run& a, const Run& b) { return a.begin < b.begin; });
  std::vector<Run> m;
  for (const Run& r : v) {
    if (r.end <= r.begin) continue;
    if (!m.empty() && r.begin <= m.back().end) m.back().end = std::max(m.back().end, r.end);
    else m.push_back(r);
  }
  return m;
}

int64_t count_of(const std::vector<Run>& runs) {
  int64_t c = 0;
  for (const Run& r : runs) c += r.end - r.begin;
  return c;
}

// [0, n) less the sorted, disjoint `runs`.
std::vector<Run> complement(const std::vector<Run>& runs, int64_t n) {
  std::vector<Run> out;
  int64_t at = 0;
  for (const Run& r : runs) {
    if (r.begin > at) out.push_back({at, r.begin});
    at = std::max(at, r.end);
  }
  if (at < n) out.push_back({at, n});
  return out;
}

// Rank r's part of sorted runs when their elements, in order, are shared out evenly over p ranks.
std::vector<Run> share_of(const std::vector<Run>& runs, int r, int p) {
  const int64_t n = count_of(runs), lo = n * r / p, hi = n * (r + 1) / p;
  std::vector<Run> out;
  int64_t seen = 0;
  for (const Run& run : runs) {
    const int64_t len = run.end - run.begin;
    const int64_t b = std::max(lo, seen), e = std::min(hi, seen + len);
    if (e > b) out.push_back({run.begin + (b - seen), run.begin + (e - seen)});
    seen += len;
  }
  return out;
}

template <class P>
std::vector<Run> runs_of(const std::vector<Seg<P>>& segs) {
  std::vector<Run> runs;
  for (const auto& s : segs) runs.push_back({s.b, s.e});
  return runs;
}

// Sorted, disjoint segments less the sorted, disjoint runs `cut` (each kept piece keeps its place in memory).
template <class P>
std::vector<Seg<P>> minus(const std::vector<Seg<P>>& segs, const std::vector<Run>& cut) {
  std::vector<Seg<P>> kept;
  size_t j = 0;
  for (auto s : segs) {
    while (j < cut.size() && cut[j].end <= s.b) ++j;
    for (size_t l = j; s.b < s.e; ++l) {
      if (l >= cut.size() || cut[l].begin >= s.e) {
        kept.push_back(s);
        break;
      }
      if (cut[l].begin > s.b) kept.push_back({s.b, cut[l].begin, s.ptr});
      const int64_t nb = std::max(s.b, std::min(s.e, cut[l].end));
      s.ptr += nb - s.b;
      s.b = nb;
    }
  }
  return kept;
}

// Every rank's runs of the datasets `which`, on every rank: result[j][r] = rank r's runs of dataset which[j]
// (mine[d]: this rank's runs of dataset d). One MPI_Allgatherv of (dataset, begin, end) triples.
std::vector<std::vector<std::vector<Run>>> gather_runs(MPI_Comm comm, const std::vector<size_t>& which,
                                                       const std::vector<std::vector<Run>>& mine, double timeout_s) {
  int nranks = 1;
  MPI_Comm_size(comm, &nranks);
  std::vector<int64_t> local;
  for (size_t j = 0; j < which.size(); ++j)
    for (const Run& r : mine[which[j]]) local.insert(local.end(), {static_cast<int64_t>(j), r.begin, r.end});
  int n = static_cast<int>(local.size());
  std::vector<int> counts(static_cast<size_t>(nranks)), displs(static_cast<size_t>(nranks), 0);
  MPI_Request req;
  MPI_Iallgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm, &req);
  comm::wait_bounded(&req, 1, timeout_s, "the checkpoint's exchange of replicated runs", comm);
  for (int r = 1; r < nranks; ++r) displs[r] = displs[r - 1] + counts[r - 1];
  std::vector<int64_t> every(static_cast<size_t>(displs.back() + counts.back()));
  MPI_Iallgatherv(local.data(), n, MPI_INT64_T, every.data(), counts.data(), displs.data(), MPI_INT64_T, comm, &req);
  comm::wait_bounded(&req, 1, timeout_s, "the checkpoint's exchange of replicated runs", comm);
  std::vector<std::vector<std::vector<Run>>> out(which.size(), std::vector<std::vector<Run>>(nranks));
  for (int r = 0; r < nranks; ++r)
    for (int k = displs[r]; k < displs[r] + counts[r]; k += 3) out[every[k]][r].push_back({every[k + 1], every[k + 2]});
  return out;
}

// The runs of ranks below `rank` and those of all ranks, each merged.
std::pair<std::vector<Run>, std::vector<Run>> lower_and_all(const std::vector<std::vector<Run>>& per_rank, int rank) {
  std::vector<Run> lower, everyone;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    everyone.insert(everyone.end(), per_rank[r].begin(), per_rank[r].end());
    if (static_cast<int>(r) < rank) lower.insert(lower.end(), per_rank[r].begin(), per_rank[r].end());
  }
  return {merged(std::move(lower)), merged(std::move(everyone))};
}

}  // namespace

// ---- save -------------------------------------------------------------------------------------------------

namespace {

// Bytes of the structure beyond the data: superblock, groups, object headers and attributes. Measured on the
// files save writes (about 0.9 KiB per dataset with its checksum attribute, and the root attributes with the
// config and strategy texts); the estimate doubles that.
int64_t structure_bytes(size_t datasets, const Meta& meta) {
  return 64 * 1024 + 2 * 1024 * static_cast<int64_t>(datasets) +
         2 * static_cast<int64_t>(meta.config_yaml.size() + meta.strategy.size() + meta.tokenizer_model.size());
}

std::string mib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

// A scratch file in memory (on /dev/shm's tmpfs, else in the temp folder), removed with the object. Sparse:
// only the bytes written take memory.
class MemFile {
 public:
  MemFile() {
    static int serial = 0;
    std::error_code ec;
    const fs::path dir = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path(ec);
    path_ = (dir / (".piper-structure-" + std::to_string(::getpid()) + "-" + std::to_string(serial++) + ".h5")).string();
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() {
    if (fd_ >= 0) ::close(fd_);
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Opens it for reading once HDF5 has closed it.
  int fd() {
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    return fd_;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Rank 0 alone: the file's structure (every dataset with its storage allocated, never filled; checksums; root
// attributes) built by HDF5 in `mem`, where no write can fail: a write error inside HDF5 1.10's flush leaves
// the file impossible to close, and the library then crashes when it shuts down in MPI_Finalize. Returns where
// each dataset's elements start in the file (-1: none).
std::vector<int64_t> create_structure(const Where& wt, const MemFile& mem, const Meta& meta,
                                      const std::vector<DatasetSpec>& all, const std::vector<std::string>& names,
                                      const std::vector<uint64_t>& sums) {
  Id fapl = wt.check(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  wt.check(H5Pset_fapl_sec2(fapl), "file access properties");
  wt.check(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18), "file format bounds");
  Id lcpl = wt.check(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "link properties");
  wt.check(H5Pset_create_intermediate_group(lcpl, 1), "link properties");
  Id dcpl = wt.check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dataset properties");
  wt.check(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "dataset properties");
  wt.check(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), "dataset properties");
  Id file = wt.check(H5Fcreate(mem.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose,
                     "cannot create its structure in " + mem.path());
  std::vector<int64_t> offsets(all.size(), -1);
  for (size_t i = 0; i < all.size(); ++i) {
    const auto dims = to_hsize(all[i].shape);
    Id space = dims.empty() ? wt.check(H5Screate(H5S_SCALAR), H5Sclose, names[i], "dataspace")
                            : wt.check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                       H5Sclose, names[i], "dataspace");
    Id d = wt.check(H5Dcreate2(file, names[i].c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT), H5Dclose,
                    names[i], "cannot create");
    write_attr(wt, d, "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sums[i]);
    if (numel(all[i].shape) == 0) continue;
    const haddr_t at = H5Dget_offset(d);  // contiguous storage: element j at byte at + 4 j
    if (at == HADDR_UNDEF) wt.fail(names[i], "HDF5 allocated no contiguous storage for it");
    offsets[i] = static_cast<int64_t>(at);
  }
  write_meta(wt, file, meta);
  if (file.close() < 0) wt.fail("building the file's structure failed: " + h5_error());
  return offsets;
}

// Rank 0: the temporary at its full size, its room on the disk checked (with the structure's bytes) and
// reserved (fallocate), so that no write of the data can meet a full disk; then the structure, the parts of
// `mem` that hold bytes, copied to the same offsets.
void write_structure(const Where& wt, MemFile& mem, const std::string& tmp) {
  const int src = mem.fd();
  if (src < 0) wt.fail("cannot read its structure back from " + mem.path() + ": " + std::strerror(errno));
  const off_t size = ::lseek(src, 0, SEEK_END);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) wt.fail(std::string("cannot create: ") + std::strerror(errno));
  std::string err;
  struct statvfs vfs {};
  if (::fstatvfs(fd, &vfs) != 0) {
    err = std::string("cannot read the file system's free space: ") + std::strerror(errno);
  } else if (const int64_t free_bytes = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
             size > free_bytes) {
    err = "no room on the file system: the checkpoint takes " + mib(size) + ", " + mib(free_bytes) +
          " are free (" + std::strerror(ENOSPC) + ")";
#ifdef __linux__
  } else if (::fallocate(fd, 0, 0, size) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
    err = "cannot reserve " + mib(size) + " on the file system: " + std::strerror(errno);
#endif
  } else if (::ftruncate(fd, size) != 0) {
    err = std::string("cannot set its size: ") + std::strerror(errno);
  }
  std::vector<char> buf(size_t{1} << 20);
  for (off_t at = ::lseek(src, 0, SEEK_DATA); err.empty() && at >= 0 && at < size;) {
    const off_t end = std::min<off_t>(size, ::lseek(src, at, SEEK_HOLE));
    for (; err.empty() && at < end;) {
      const ssize_t n = ::pread(src, buf.data(), static_cast<size_t>(std::min<off_t>(end - at, buf.size())), at);
      if (n <= 0) {
        err = std::string("cannot read its structure back: ") + std::strerror(n < 0 ? errno : EIO);
        break;
      }
      for (ssize_t k = 0; err.empty() && k < n;) {
        const ssize_t w = ::pwrite(fd, buf.data() + k, static_cast<size_t>(n - k), at + k);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) err = "write of its structure at " + std::to_string(at + k) + " failed: " + std::strerror(w < 0 ? errno : ENOSPC);
        else k += w;
      }
      at += n;
    }
    if (err.empty()) at = ::lseek(src, end, SEEK_DATA);
  }
  if (::close(fd) != 0 && err.empty()) err = std::string("close failed: ") + std::strerror(errno);
  if (!err.empty()) wt.fail(err);
}

}  // namespace

int64_t estimated_bytes(const std::vector<DatasetSpec>& all, const Meta& meta) {
  int64_t data = 0;
  for (const DatasetSpec& d : all) data += numel(d.shape) * 4;
  return data + structure_bytes(all.size(), meta);
}

namespace {

// What this rank writes: per dataset (in the list's order) its name, its size and the segments of its
// elements, sorted and disjoint.
struct Outgoing {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  std::vector<std::vector<Seg<const float*>>> segs;
};

// This rank's pieces, checked against the list (each dataset once, every run inside its dataset, no
// overlap) and sorted into segments.
Outgoing collect_pieces(const Where& w, MPI_Comm comm, double timeout, const std::vector<DatasetSpec>& all,
                        const std::vector<Piece>& mine) {
  const size_t nd = all.size();
  Outgoing out{std::vector<std::string>(nd), std::vector<int64_t>(nd), std::vector<std::vector<Seg<const float*>>>(nd)};
  local_step<SaveError>(comm, timeout, "the checkpoint's check of its pieces", [&] {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < nd; ++i) {
      out.names[i] = norm_name(all[i].name);
      out.sizes[i] = numel(all[i].shape);
      for (int64_t d : all[i].shape)
        if (d < 0) w.fail(out.names[i], "negative dimension in shape " + shape_string(all[i].shape));
      if (!index.emplace(out.names[i], i).second) w.fail(out.names[i], "listed twice");
    }
    for (const Piece& p : mine) {
      const auto it = index.find(norm_name(p.dataset));
      if (it == index.end()) w.fail(norm_name(p.dataset), "a piece of a dataset that is not in the list");
      const size_t i = it->second;
      const float* src = p.data;
      for (const Run& r : p.runs) {
        if (r.begin < 0 || r.end < r.begin || r.end > out.sizes[i])
          w.fail(out.names[i], "run [" + std::to_string(r.begin) + "," + std::to_string(r.end) + ") outside its " +
                                   std::to_string(out.sizes[i]) + " elements");
        if (r.end > r.begin) out.segs[i].push_back({r.begin, r.end, src});
        src += r.end - r.begin;
      }
    }
    for (size_t i = 0; i < nd; ++i) {
      auto& sg = out.segs[i];
      std::sort(sg.begin(), sg.end(), [](const auto& x, const auto& y) { return x.b < y.b; });
      for (size_t j = 1; j < sg.size(); ++j)
        if (sg[j].b < sg[j - 1].e)
          w.fail(out.names[i], "this rank's runs overlap at element " + std::to_string(sg[j].b));
    }
  });
  return out;
}

// Elements offered by several ranks (replicated tensors) are written by the lowest of them: the others drop
// them from their segments. Together the ranks must cover every element.
void keep_lowest_writers(const std::string& path, MPI_Comm comm, double timeout, Outgoing& out) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const size_t nd = out.segs.size();
  std::vector<int64_t> count(nd, 0), total(nd, 0);
  for (size_t i = 0; i < nd; ++i)
    for (const auto& sg : out.segs[i]) count[i] += sg.e - sg.b;
  sum_all(comm, count.data(), total.data(), nd, MPI_INT64_T, timeout, "the checkpoint's count of elements");
  for (size_t i = 0; i < nd; ++i)
    if (total[i] < out.sizes[i])
      throw SaveError("checkpoint " + path + ": dataset " + out.names[i] + ": the pieces of all ranks hold " +
                      std::to_string(total[i]) + " of its " + std::to_string(out.sizes[i]) + " elements");
  std::vector<size_t> shared;  // datasets with elements on several ranks
  for (size_t i = 0; i < nd; ++i)
    if (total[i] > out.sizes[i]) shared.push_back(i);
  if (shared.empty()) return;
  std::vector<std::vector<Run>> my_runs(nd);
  for (size_t i : shared) my_runs[i] = runs_of(out.segs[i]);
  const auto every = gather_runs(comm, shared, my_runs, timeout);
  for (size_t j = 0; j < shared.size(); ++j) {
    const size_t i = shared[j];
    const auto [lower, everyone] = lower_and_all(every[j], rank);
    const int64_t covered = count_of(everyone);
    if (covered != out.sizes[i])
      throw SaveError("checkpoint " + path + ": dataset " + out.names[i] + ": the pieces of all ranks cover " +
                      std::to_string(covered) + " of its " + std::to_string(out.sizes[i]) + " elements");
    out.segs[i] = minus(out.segs[i], lower);
  }
}

// Each dataset's checksum: of what each rank writes, summed.
std::vector<uint64_t> checksums_of(MPI_Comm comm, double timeout, const Outgoing& out) {
  const size_t nd = out.segs.size();
  std::vector<uint64_t> part(nd, 0), sums(nd, 0);
  for (size_t i = 0; i < nd; ++i)
    for (const auto& sg : out.segs[i]) part[i] += checksum_range(sg.b, sg.ptr, sg.e - sg.b);
  sum_all(comm, part.data(), sums.data(), nd, MPI_UINT64_T, timeout, "the checkpoint's checksums");
  return sums;
}

}  // namespace

void save(const std::string& path, MPI_Comm comm, const Meta& meta, const std::vector<DatasetSpec>& all,
          const std::vector<Piece>& mine, const SaveOptions& options) {
  quiet_hdf5();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const double timeout = options.timeout_s;
  const Where w{path};
  const size_t nd = all.size();

  Outgoing mine_sorted = collect_pieces(w, comm, timeout, all, mine);
  keep_lowest_writers(path, comm, timeout, mine_sorted);
  const std::vector<uint64_t> sums = checksums_of(comm, timeout, mine_sorted);
  const std::vector<std::string>& names = mine_sorted.names;
  const auto& segs = mine_sorted.segs;

  // From here on a failure removes the temporary.
  const std::string tmp = temp_path(path);
  const Where wt{tmp};
  auto step = [&](const std::string& phase, auto&& f) {
    try {
      local_step<SaveError>(comm, timeout, phase, f);
    } catch (const SaveError&) {
      if (rank == 0) {
        std::error_code ec;
        fs::remove(tmp, ec);
      }
      throw;
    } catch (const comm::StallError&) {  // the job is ending: whichever rank noticed clears up
      std::error_code ec;
      fs::remove(tmp, ec);
      throw;
    }
  };

  // 1. The structure, by rank 0 alone; the file's room on the disk reserved.
  std::vector<int64_t> offsets(nd, -1);
  step("the creation of the checkpoint file", [&] {
    if (rank != 0) return;
    const fs::path parent = fs::path(path).parent_path();
    if (!parent.empty()) {
      std::error_code ec;
      fs::create_directories(parent, ec);
      if (ec) w.fail("cannot create directory " + parent.string() + ": " + ec.message());
    }
    MemFile mem;
    offsets = create_structure(wt, mem, meta, all, names, sums);
    write_structure(wt, mem, tmp);
  });
  MPI_Request req;
  MPI_Ibcast(offsets.data(), static_cast<int>(nd), MPI_INT64_T, 0, comm, &req);
  comm::wait_bounded(&req, 1, timeout, "the checkpoint's dataset offsets", comm);

  // 2. The data: each rank its own elements, waiting for no other rank until all have written and flushed.
  step("the end of the checkpoint's writes", [&] {
    bool any = false;
    for (const auto& s : segs) any = any || !s.empty();
    if (!any) return;
    DataWriter out(wt, tmp, options.direct_io);
    for (size_t i = 0; i < nd; ++i)
      for (const auto& sg : segs[i])
        out.write(names[i], offsets[i] + sg.b * 4, reinterpret_cast<const char*>(sg.ptr), (sg.e - sg.b) * 4);
    out.finish();
  });

  // 3. In place.
  step("the rename of the checkpoint file", [&] {
    if (rank != 0) return;
    fsync_path(tmp);
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) w.fail("cannot rename " + tmp + ": " + ec.message());
    const fs::path parent = fs::path(path).parent_path();
    fsync_path(parent.empty() ? "." : parent.string());
  });
}

// ---- load -------------------------------------------------------------------------------------------------

namespace {

// A checkpoint open for a load: the expected datasets in their order, each open, with its stored checksum.
struct OpenCheckpoint {
  Id fapl, file;
  Meta meta;
  std::vector<std::string> names;
  std::map<std::string, size_t> index;  // name -> position in the expected list
  std::vector<Id> dsets;
  std::vector<uint64_t> stored;
};

// The file, its root attributes, and every expected dataset with the expected shape and type.
OpenCheckpoint open_for_load(const Where& w, MPI_Comm comm, double timeout_s,
                             const std::vector<DatasetSpec>& expected) {
  const size_t nd = expected.size();
  OpenCheckpoint f;
  f.fapl = mpio_fapl(w, comm);
  local_step<CheckpointError>(comm, timeout_s, "the checkpoint's open", [&] {
    if (!fs::is_regular_file(w.file)) w.fail("no such file");
    f.file = w.check(H5Fopen(w.file.c_str(), H5F_ACC_RDONLY, f.fapl), H5Fclose,
                     "cannot open (not an HDF5 file, truncated or damaged)");
  });
  f.names.resize(nd);
  f.dsets.resize(nd);
  f.stored.assign(nd, 0);
  local_step<CheckpointError>(comm, timeout_s, "the checkpoint's check of its datasets", [&] {
    f.meta = read_meta(w, f.file);
    for (size_t i = 0; i < nd; ++i) {
      f.names[i] = norm_name(expected[i].name);
      f.index.emplace(f.names[i], i);
      f.dsets[i] = open_dataset(w, f.file, f.names[i]);
      const auto shape = dataset_shape(w, f.dsets[i], f.names[i]);
      if (shape != expected[i].shape)
        w.fail(f.names[i], "shape " + shape_string(shape) + " in the file, " + shape_string(expected[i].shape) +
                               " expected");
      check_float32(w, f.dsets[i], f.names[i]);
      f.stored[i] = read_attr<uint64_t>(w, f.dsets[i], "checksum", H5T_NATIVE_UINT64, f.names[i]);
    }
  });
  return f;
}

// What this rank reads of each dataset, and where it goes. Per dataset, `segs` are sorted and disjoint: the
// requested runs themselves when they already are, else their union into `staging`, and then `runs` and
// `outs` keep the requests to copy out of it after the read (they are empty otherwise).
struct Reads {
  std::vector<std::vector<Run>> runs;
  std::vector<std::vector<float*>> outs;
  std::vector<std::vector<float>> staging;
  std::vector<std::vector<Seg<float*>>> segs;
};

// This rank's requests, each checked against its dataset's size, laid out as reads.
Reads plan_reads(const Where& w, MPI_Comm comm, double timeout_s, const OpenCheckpoint& f,
                 const std::vector<DatasetSpec>& expected, const std::vector<Request>& mine) {
  const size_t nd = expected.size();
  Reads rd{std::vector<std::vector<Run>>(nd), std::vector<std::vector<float*>>(nd),
           std::vector<std::vector<float>>(nd), std::vector<std::vector<Seg<float*>>>(nd)};
  local_step<CheckpointError>(comm, timeout_s, "the checkpoint's check of the requests", [&] {
    for (const Request& q : mine) {
      const auto it = f.index.find(norm_name(q.dataset));
      if (it == f.index.end()) w.fail(norm_name(q.dataset), "requested but not in the expected list");
      const size_t i = it->second;
      const int64_t n = numel(expected[i].shape);
      float* out = q.out;
      for (const Run& r : q.runs) {
        if (r.begin < 0 || r.end < r.begin || r.end > n)
          w.fail(f.names[i], "requested run [" + std::to_string(r.begin) + "," + std::to_string(r.end) +
                                 ") outside its " + std::to_string(n) + " elements");
        if (r.end > r.begin) {
          rd.runs[i].push_back(r);
          rd.outs[i].push_back(out);
        }
        out += r.end - r.begin;
      }
    }
  });
  for (size_t i = 0; i < nd; ++i) {
    const std::vector<Run>& runs = rd.runs[i];
    bool sorted = true;
    for (size_t j = 1; j < runs.size(); ++j)
      if (runs[j].begin < runs[j - 1].end) sorted = false;
    if (sorted) {
      for (size_t j = 0; j < runs.size(); ++j) rd.segs[i].push_back({runs[j].begin, runs[j].end, rd.outs[i][j]});
      rd.runs[i].clear();
      rd.outs[i].clear();
      continue;
    }
    const std::vector<Run> m = merged(runs);
    rd.staging[i].resize(static_cast<size_t>(count_of(m)));
    float* p = rd.staging[i].data();
    for (const Run& r : m) {
      rd.segs[i].push_back({r.begin, r.end, p});
      p += r.end - r.begin;
    }
  }
  return rd;
}

// Who sums what into the checksums, in the same pass as the reads: each element by the lowest rank that
// reads it; elements no rank reads are shared out evenly and read for that alone.
struct ChecksumShare {
  std::vector<std::vector<Seg<float*>>> sum;  // what this rank sums of what it reads
  std::vector<std::vector<Run>> extra;        // what this rank reads only to sum it
};

ChecksumShare share_checksums(MPI_Comm comm, double timeout_s, const std::vector<DatasetSpec>& expected,
                              const std::vector<std::vector<Seg<float*>>>& segs) {
  int rank = 0, nranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &nranks);
  const size_t nd = expected.size();
  std::vector<int64_t> reading(2 * nd, 0), readers(2 * nd, 0);  // per dataset: ranks reading, elements read
  for (size_t i = 0; i < nd; ++i) {
    reading[2 * i] = segs[i].empty() ? 0 : 1;
    for (const auto& sg : segs[i]) reading[2 * i + 1] += sg.e - sg.b;
  }
  sum_all(comm, reading.data(), readers.data(), 2 * nd, MPI_INT64_T, timeout_s, "the checkpoint's count of readers");
  ChecksumShare share{std::vector<std::vector<Seg<float*>>>(nd), std::vector<std::vector<Run>>(nd)};
  std::vector<size_t> several;  // datasets read by several ranks
  std::vector<std::vector<Run>> my_runs(nd);
  for (size_t i = 0; i < nd; ++i) {
    const int64_t n = numel(expected[i].shape);
    if (readers[2 * i] >= 2) {
      several.push_back(i);
      my_runs[i] = runs_of(segs[i]);
    } else if (readers[2 * i] == 1) {  // its only reader sums all of it, reading what nobody asked for
      share.sum[i] = segs[i];
      if (!segs[i].empty() && readers[2 * i + 1] < n) share.extra[i] = complement(runs_of(segs[i]), n);
    } else {
      share.extra[i] = share_of({{0, n}}, rank, nranks);
    }
  }
  if (several.empty()) return share;
  const auto every = gather_runs(comm, several, my_runs, timeout_s);
  for (size_t j = 0; j < several.size(); ++j) {
    const size_t i = several[j];
    const auto [lower, everyone] = lower_and_all(every[j], rank);
    share.sum[i] = minus(segs[i], lower);
    share.extra[i] = share_of(complement(everyone, numel(expected[i].shape)), rank, nranks);
  }
  return share;
}

// Reads `extra` of a dataset in rounds of at most k elements through `buf`, only to sum it.
uint64_t sum_unrequested(const Where& w, const std::string& name, hid_t dset, const std::vector<hsize_t>& dims,
                         const std::vector<Run>& extra, int64_t k, std::vector<float>& buf) {
  uint64_t part = 0;
  buf.resize(static_cast<size_t>(std::min(k, count_of(extra))));
  std::vector<Seg<float*>> es;
  for (const Run& r : extra) es.push_back({r.begin, r.end, nullptr});
  for (auto round : split_rounds(es, k)) {
    float* p = buf.data();
    for (auto& sg : round) {
      sg.ptr = p;
      p += sg.e - sg.b;
    }
    read_segs(w, name, dset, dims, round);
    for (const auto& sg : round) part += checksum_range(sg.b, sg.ptr, sg.e - sg.b);
  }
  return part;
}

// The reads, each rank on its own, in rounds of at most round_elems() elements; the staged requests copied
// out. Returns this rank's part of each dataset's checksum.
std::vector<uint64_t> read_and_sum(const Where& w, MPI_Comm comm, double timeout_s, const OpenCheckpoint& f,
                                   const std::vector<DatasetSpec>& expected, const Reads& rd,
                                   const ChecksumShare& share) {
  const size_t nd = expected.size();
  const int64_t k = round_elems();
  std::vector<uint64_t> part(nd, 0);
  local_step<CheckpointError>(comm, timeout_s, "the checkpoint's reads", [&] {
    std::vector<float> buf;
    for (size_t i = 0; i < nd; ++i) {
      const auto dims = to_hsize(expected[i].shape);
      for (const auto& round : split_rounds(rd.segs[i], k)) read_segs(w, f.names[i], f.dsets[i], dims, round);
      for (const auto& sg : share.sum[i]) part[i] += checksum_range(sg.b, sg.ptr, sg.e - sg.b);
      if (!share.extra[i].empty()) part[i] += sum_unrequested(w, f.names[i], f.dsets[i], dims, share.extra[i], k, buf);
      for (size_t j = 0; j < rd.runs[i].size(); ++j) {  // staged: copy each run out of the union
        const Run& r = rd.runs[i][j];
        auto it = std::upper_bound(rd.segs[i].begin(), rd.segs[i].end(), r.begin,
                                   [](int64_t v, const Seg<float*>& sg) { return v < sg.b; });
        --it;
        std::memcpy(rd.outs[i][j], it->ptr + (r.begin - it->b), static_cast<size_t>(r.end - r.begin) * 4);
      }
    }
  });
  return part;
}

// Every rank's parts summed, against the checksums stored.
void verify_checksums(const Where& w, MPI_Comm comm, double timeout_s, const OpenCheckpoint& f,
                      const std::vector<uint64_t>& part) {
  std::vector<uint64_t> sums(part.size(), 0);
  sum_all(comm, part.data(), sums.data(), part.size(), MPI_UINT64_T, timeout_s, "the checkpoint's checksums");
  for (size_t i = 0; i < part.size(); ++i)
    if (sums[i] != f.stored[i])
      w.fail(f.names[i], "checksum mismatch (stored " + std::to_string(f.stored[i]) + ", computed " +
                             std::to_string(sums[i]) + "): the data is damaged");
}

}  // namespace

Meta load(const std::string& path, MPI_Comm comm, const std::vector<DatasetSpec>& expected,
          const std::vector<Request>& mine, double timeout_s) {
  quiet_hdf5();
  const Where w{path};
  OpenCheckpoint f = open_for_load(w, comm, timeout_s, expected);
  const Reads reads = plan_reads(w, comm, timeout_s, f, expected, mine);
  const ChecksumShare share = share_checksums(comm, timeout_s, expected, reads.segs);
  verify_checksums(w, comm, timeout_s, f, read_and_sum(w, comm, timeout_s, f, expected, reads, share));
  f.dsets.clear();
  f.file.close();
  return f.meta;
}

// ---- inspect ----------------------------------------------------------------------------------------------

namespace {
struct VisitCtx {
  std::vector<std::string> datasets;
};
herr_t visit_cb(hid_t group, const char* name, const H5L_info_t* info, void* p) {
  if (info->type != H5L_TYPE_HARD) return 0;
  const hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
  if (obj < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  if (H5Iget_type(obj) == H5I_DATASET) static_cast<VisitCtx*>(p)->datasets.push_back("/" + std::string(name));
  H5Oclose(obj);
  return 0;
}
}  // namespace

Inspection inspect(const std::string& path, bool verify) {
  quiet_hdf5();
  const Where w{path};
  if (!fs::is_regular_file(path)) w.fail("no such file");
  Inspection out;
  out.bytes = static_cast<int64_t>(fs::file_size(path));
  Id file = w.check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                    "cannot open (not an HDF5 file, truncated or damaged)");
  out.meta = read_meta(w, file);
  VisitCtx ctx;
  w.check(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &ctx), "cannot list the datasets");
  std::sort(ctx.datasets.begin(), ctx.datasets.end());
  const int64_t k = round_elems();
  std::vector<float> buf;
  for (const std::string& name : ctx.datasets) {
    Id d = open_dataset(w, file, name);
    DatasetInfo info{name, dataset_shape(w, d, name), true};
    if (verify) {
      check_float32(w, d, name);
      const uint64_t stored = read_attr<uint64_t>(w, d, "checksum", H5T_NATIVE_UINT64, name);
      const int64_t n = numel(info.shape);
      const auto dims = to_hsize(info.shape);
      buf.resize(static_cast<size_t>(std::min(k, std::max<int64_t>(n, 1))));
      uint64_t sum = 0;
      for (int64_t b = 0; b < n; b += k) {
        const int64_t e = std::min(n, b + k);
        read_segs(w, name, d, dims, std::vector<Seg<float*>>{{b, e, buf.data()}});
        sum += checksum_range(b, buf.data(), e - b);
      }
      info.checksum_ok = sum == stored;
    }
    out.datasets.push_back(std::move(info));
  }
  return out;
}

}  // namespace piper::checkpoint
