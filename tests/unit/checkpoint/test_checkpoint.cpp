// test_checkpoint.cpp — checkpoint save/load/inspect in one process (MPI_COMM_SELF): round trips of 1-D, 2-D
// and 3-D datasets from irregular runs, the root attributes, damage detection (a flipped byte, a truncated
// file), missing and misshapen tensors, and the files of a checkpoint directory (latest, keep_last, resolve).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/files.hpp"

namespace piper::checkpoint {
namespace {
namespace fs = std::filesystem;

class MpiEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) MPI_Init(nullptr, nullptr);
  }
  void TearDown() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
};
[[maybe_unused]] ::testing::Environment* const g_env = ::testing::AddGlobalTestEnvironment(new MpiEnv);

fs::path scratch(const std::string& name) {
  fs::path d = fs::path(PIPER_BINARY_DIR) / "test_checkpoint" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

float value(size_t dataset, int64_t i) { return static_cast<float>(dataset) * 1000.f + static_cast<float>(i) * 0.25f - 3.f; }

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

const std::vector<DatasetSpec> kSpecs = {
    {"/model/embed.weight", {37}},
    {"/model/layers.0.mixer.in_proj.weight", {5, 7}},
    {"model/layers.0.conv.weight", {3, 4, 5}},
    {"/optim/exp_avg/layers.0.mixer.in_proj.weight", {5, 7}},
    {"/optim/exp_avg_sq/layers.0.mixer.in_proj.weight", {5, 7}},
};

// Irregular runs covering [0, n), shuffled, in two pieces.
std::vector<std::vector<Run>> irregular_cover(int64_t n, std::mt19937& rng) {
  std::vector<Run> runs;
  for (int64_t b = 0; b < n;) {
    const int64_t len = std::min<int64_t>(n - b, 1 + static_cast<int64_t>(rng() % 9));
    runs.push_back({b, b + len});
    b += len;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  const size_t half = runs.size() / 2;
  return {std::vector<Run>(runs.begin(), runs.begin() + static_cast<long>(half)),
          std::vector<Run>(runs.begin() + static_cast<long>(half), runs.end())};
}

struct Saved {
  std::vector<std::vector<float>> bufs;
  std::vector<Piece> pieces;
};
Saved make_pieces(const std::vector<DatasetSpec>& specs, unsigned seed) {
  std::mt19937 rng(seed);
  Saved s;
  std::vector<std::vector<Run>> runs;
  std::vector<std::string> names;
  for (size_t i = 0; i < specs.size(); ++i)
    for (auto& part : irregular_cover(numel(specs[i].shape), rng)) {
      std::vector<float> buf;
      for (const Run& r : part)
        for (int64_t j = r.begin; j < r.end; ++j) buf.push_back(value(i, j));
      s.bufs.push_back(std::move(buf));
      runs.push_back(part);
      names.push_back(specs[i].name);
    }
  for (size_t p = 0; p < runs.size(); ++p) s.pieces.push_back({names[p], runs[p], s.bufs[p].data()});
  return s;
}

Meta sample_meta() {
  Meta m;
  m.step = 120;
  m.tokens_seen = 123456789012;
  m.data_position = 4242;
  m.seed = 0xFEDCBA9876543210ull;
  m.config_yaml = "model:\n  d_model: 64\n  layers: [mamba, attention]\n";
  m.strategy = "pp=2 dp=2 schedule=1f1b";
  return m;
}

void save_sample(const std::string& path, const Meta& meta = sample_meta()) {
  Saved s = make_pieces(kSpecs, 7);
  save(path, MPI_COMM_SELF, meta, kSpecs, s.pieces);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const SaveError& e) {
    return e.what();
  }
  return "";
}

void check_all(const std::string& path) {
  // Read back every dataset through irregular, unsorted and overlapping runs.
  std::mt19937 rng(99);
  std::vector<std::vector<float>> outs(kSpecs.size());
  std::vector<Request> reqs;
  std::vector<std::vector<Run>> runs(kSpecs.size());
  for (size_t i = 0; i < kSpecs.size(); ++i) {
    const int64_t n = numel(kSpecs[i].shape);
    auto parts = irregular_cover(n, rng);
    runs[i] = parts[0];
    runs[i].insert(runs[i].end(), parts[1].begin(), parts[1].end());
    runs[i].push_back({0, std::min<int64_t>(n, 5)});  // an overlap
    int64_t t = 0;
    for (auto& r : runs[i]) t += r.end - r.begin;
    outs[i].assign(static_cast<size_t>(t), -1.f);
    reqs.push_back({kSpecs[i].name, runs[i], outs[i].data()});
  }
  Meta m = load(path, MPI_COMM_SELF, kSpecs, reqs);
  EXPECT_EQ(m.step, 120);
  for (size_t i = 0; i < kSpecs.size(); ++i) {
    size_t o = 0, bad = 0;
    for (const Run& r : runs[i])
      for (int64_t j = r.begin; j < r.end; ++j) bad += outs[i][o++] != value(i, j);
    EXPECT_EQ(bad, 0u) << kSpecs[i].name;
  }
}

TEST(Checkpoint, RoundTripIrregularRuns) {
  const auto dir = scratch("roundtrip");
  const std::string path = checkpoint_path(dir.string(), 120);
  EXPECT_EQ(fs::path(path).filename(), "step_00000120.h5");
  save_sample(path);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(temp_path(path)));
  check_all(path);
}

TEST(Checkpoint, RoundTripInSmallRounds) {
  const auto dir = scratch("rounds");
  const std::string path = (dir / "c.h5").string();
  setenv("PIPER_CKPT_ROUND_ELEMS", "4", 1);
  save_sample(path);
  check_all(path);
  unsetenv("PIPER_CKPT_ROUND_ELEMS");
  check_all(path);
}

// Datasets of many pages, written in runs that start and end off the 4 KiB pages: through O_DIRECT (whole
// pages) with the partial pages buffered, and through HDF5 alone. Both files read back the same values
// and verify; the direct one is what the file system really holds (read with O_DIRECT-free reads).
TEST(Checkpoint, DirectAndBufferedWritesHoldTheSameValues) {
  const auto dir = scratch("direct");
  const std::vector<DatasetSpec> specs = {{"/model/big.weight", {301, 1000}}, {"/model/small.weight", {3}},
                                          {"/optim/exp_avg/big.weight", {301, 1000}}};
  std::vector<std::vector<float>> values(specs.size());
  std::vector<Piece> pieces;
  std::vector<std::vector<float>> bufs;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t n = numel(specs[i].shape);
    for (int64_t j = 0; j < n; ++j) values[i].push_back(static_cast<float>(i) * 1e6f + static_cast<float>(j) * 0.5f);
    // runs of 1 to ~3 pages, cut at odd element counts
    for (int64_t b = 0, k = 0; b < n; ++k) {
      const int64_t e = std::min(n, b + 777 + 1301 * (k % 3));
      bufs.emplace_back(values[i].begin() + b, values[i].begin() + e);
      b = e;
    }
  }
  size_t at = 0;
  for (size_t i = 0; i < specs.size(); ++i)
    for (int64_t b = 0; b < numel(specs[i].shape); b += static_cast<int64_t>(bufs[at++].size()))
      pieces.push_back({specs[i].name, {{b, b + static_cast<int64_t>(bufs[at].size())}}, bufs[at].data()});
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "through the page cache");
    const std::string path = (dir / (direct ? "direct.h5" : "buffered.h5")).string();
    save(path, MPI_COMM_SELF, sample_meta(), specs, pieces, SaveOptions{direct});
    std::vector<std::vector<float>> out(specs.size());
    std::vector<Request> reqs;
    for (size_t i = 0; i < specs.size(); ++i) {
      out[i].assign(values[i].size(), -1.0f);
      reqs.push_back({specs[i].name, {{0, numel(specs[i].shape)}}, out[i].data()});
    }
    load(path, MPI_COMM_SELF, specs, reqs);
    for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(out[i], values[i]) << specs[i].name;
    const Inspection in = inspect(path, true);
    for (const auto& d : in.datasets) EXPECT_TRUE(d.checksum_ok) << d.name;
  }
}

TEST(Checkpoint, SortedRequestsReadDirectly) {
  const auto dir = scratch("sorted");
  const std::string path = (dir / "c.h5").string();
  save_sample(path);
  std::vector<float> a(6), b(35);
  load(path, MPI_COMM_SELF, kSpecs,
       {{"/model/embed.weight", {{0, 2}, {10, 14}}, a.data()},
        {"/model/layers.0.mixer.in_proj.weight", {{0, 35}}, b.data()}});
  EXPECT_EQ(a[0], value(0, 0));
  EXPECT_EQ(a[2], value(0, 10));
  EXPECT_EQ(a[5], value(0, 13));
  for (int j = 0; j < 35; ++j) EXPECT_EQ(b[j], value(1, j));
}

TEST(Checkpoint, MetaRoundTrip) {
  const auto dir = scratch("meta");
  const std::string path = (dir / "c.h5").string();
  Meta m = sample_meta();
  m.config_yaml.append(100000, 'x');  // past HDF5's 64 KiB compact attribute limit
  m.tokenizer = "sentencepiece";
  for (int i = 0; i < 300000; ++i) m.tokenizer_model += static_cast<char>(i * 7 % 256);  // NULs included
  save_sample(path, m);
  const Meta r = load(path, MPI_COMM_SELF, {}, {});
  EXPECT_EQ(r.format_version, kFormatVersion);
  EXPECT_EQ(r.tokenizer, "sentencepiece");
  EXPECT_EQ(r.tokenizer_model, m.tokenizer_model);
  EXPECT_EQ(r.step, m.step);
  EXPECT_EQ(r.tokens_seen, m.tokens_seen);
  EXPECT_EQ(r.data_position, m.data_position);
  EXPECT_EQ(r.seed, m.seed);
  EXPECT_EQ(r.config_yaml, m.config_yaml);
  EXPECT_EQ(r.strategy, m.strategy);

  Meta empty;
  save_sample(path, empty);
  const Meta e = load(path, MPI_COMM_SELF, kSpecs, {});
  EXPECT_EQ(e.config_yaml, "");
  EXPECT_EQ(e.strategy, "");
  EXPECT_EQ(e.seed, 0u);
  EXPECT_EQ(e.tokenizer, "byte");
  EXPECT_EQ(e.tokenizer_model, "");

  Meta v1;  // format 1 had no tokenizer: its runs were byte-level
  v1.format_version = 1;
  save_sample(path, v1);
  EXPECT_EQ(load(path, MPI_COMM_SELF, kSpecs, {}).tokenizer, "byte");

  const Inspection ins = inspect(path, true);
  ASSERT_EQ(ins.datasets.size(), kSpecs.size());
  EXPECT_GT(ins.bytes, 0);
  for (const auto& d : ins.datasets) EXPECT_TRUE(d.checksum_ok) << d.name;
  EXPECT_EQ(ins.datasets[0].name, "/model/embed.weight");
  EXPECT_EQ(ins.datasets[0].shape, (std::vector<int64_t>{37}));
}

TEST(Checkpoint, ChecksumIsTheDocumentedSum) {
  const auto dir = scratch("sum");
  const std::string path = (dir / "c.h5").string();
  save_sample(path);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t d = H5Dopen2(f, "/model/layers.0.conv.weight", H5P_DEFAULT);
  hid_t a = H5Aopen(d, "checksum", H5P_DEFAULT);
  uint64_t stored = 0;
  H5Aread(a, H5T_NATIVE_UINT64, &stored);
  H5Aclose(a);
  H5Dclose(d);
  H5Fclose(f);
  uint64_t s = 0;
  for (int64_t i = 0; i < 60; ++i) {
    const float x = value(2, i);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    s += splitmix64((static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) ^ bits);
  }
  EXPECT_EQ(stored, s);
}

TEST(Checkpoint, FlippedByteNamesTheDataset) {
  const auto dir = scratch("flip");
  const std::string path = (dir / "c.h5").string();
  save_sample(path);
  const std::string target = "/model/layers.0.mixer.in_proj.weight";
  haddr_t off = 0;
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, target.c_str(), H5P_DEFAULT);
    off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  ASSERT_NE(off, HADDR_UNDEF);
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(off + 35 * 4 / 2 + 1));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    io.seekp(static_cast<std::streamoff>(off + 35 * 4 / 2 + 1));
    io.write(&c, 1);
  }
  const std::string err = error_of([&] { load(path, MPI_COMM_SELF, kSpecs, {}); });
  EXPECT_NE(err.find(target), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  const Inspection ins = inspect(path, true);
  for (const auto& d : ins.datasets) EXPECT_EQ(d.checksum_ok, d.name != target) << d.name;
  // Not verifying: inspect reports without reading the data.
  for (const auto& d : inspect(path, false).datasets) EXPECT_TRUE(d.checksum_ok);
}

TEST(Checkpoint, TruncatedFileNamesTheFile) {
  const auto dir = scratch("trunc");
  const std::string path = (dir / "c.h5").string();
  save_sample(path);
  fs::resize_file(path, fs::file_size(path) / 2);
  std::string err = error_of([&] { load(path, MPI_COMM_SELF, kSpecs, {}); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  err = error_of([&] { inspect(path, true); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  // Not HDF5 at all; absent.
  { std::ofstream(path, std::ios::trunc) << "hello"; }
  err = error_of([&] { load(path, MPI_COMM_SELF, kSpecs, {}); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  err = error_of([&] { load((dir / "none.h5").string(), MPI_COMM_SELF, kSpecs, {}); });
  EXPECT_NE(err.find("none.h5"), std::string::npos) << err;
}

TEST(Checkpoint, MissingAndMisshapenTensors) {
  const auto dir = scratch("missing");
  const std::string path = (dir / "c.h5").string();
  save_sample(path);
  auto specs = kSpecs;
  specs.push_back({"/model/layers.1.mixer.in_proj.weight", {5, 7}});
  std::string err = error_of([&] { load(path, MPI_COMM_SELF, specs, {}); });
  EXPECT_NE(err.find("/model/layers.1.mixer.in_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("missing tensor"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  err = error_of([&] { load(path, MPI_COMM_SELF, {{"/nogroup/x", {1}}}, {}); });
  EXPECT_NE(err.find("missing tensor"), std::string::npos) << err;

  specs = kSpecs;
  specs[1].shape = {7, 5};
  err = error_of([&] { load(path, MPI_COMM_SELF, specs, {}); });
  EXPECT_NE(err.find("/model/layers.0.mixer.in_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("shape [5,7] in the file, [7,5] expected"), std::string::npos) << err;
}

TEST(Checkpoint, SaveRejectsBadPieces) {
  const auto dir = scratch("bad");
  const std::string path = (dir / "c.h5").string();
  std::vector<float> x(40, 1.f);
  const std::vector<DatasetSpec> specs = {{"/model/a", {4, 10}}};
  std::string err = error_of([&] { save(path, MPI_COMM_SELF, {}, specs, {{"/model/a", {{0, 30}}, x.data()}}); });
  EXPECT_NE(err.find("30 of its 40"), std::string::npos) << err;
  err = error_of([&] { save(path, MPI_COMM_SELF, {}, specs, {{"/model/a", {{0, 41}}, x.data()}}); });
  EXPECT_NE(err.find("outside"), std::string::npos) << err;
  err = error_of([&] { save(path, MPI_COMM_SELF, {}, specs, {{"/model/a", {{0, 20}, {10, 30}}, x.data()}}); });
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
  err = error_of([&] { save(path, MPI_COMM_SELF, {}, specs, {{"/model/b", {{0, 1}}, x.data()}}); });
  EXPECT_NE(err.find("/model/b"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(path));
}

TEST(Checkpoint, LatestKeepLastResolve) {
  const auto dir = scratch("dir");
  const std::string d = dir.string();
  EXPECT_NE(error_of([&] { resolve(d); }).find("no checkpoint"), std::string::npos);
  for (int64_t step : {10, 20, 30, 40}) {
    const std::string p = checkpoint_path(d, step);
    save_sample(p);
    update_latest(d, p);
  }
  EXPECT_EQ(step_of(checkpoint_path(d, 40)), 40);
  std::ifstream lf(dir / "latest");
  std::string line;
  std::getline(lf, line);
  EXPECT_EQ(line, "step_00000040.h5");
  EXPECT_EQ(resolve(d), checkpoint_path(d, 40));
  EXPECT_EQ(resolve((dir / "latest").string()), checkpoint_path(d, 40));
  EXPECT_EQ(resolve(checkpoint_path(d, 20)), checkpoint_path(d, 20));
  { std::ofstream(temp_path(checkpoint_path(d, 35))) << "partial"; }  // a crashed save
  { std::ofstream(temp_path(checkpoint_path(d, 50))) << "partial"; }  // a crashed save of a later run
  keep_last(d, 2);
  EXPECT_FALSE(fs::exists(checkpoint_path(d, 10)));
  EXPECT_FALSE(fs::exists(checkpoint_path(d, 20)));
  EXPECT_TRUE(fs::exists(checkpoint_path(d, 30)));
  EXPECT_TRUE(fs::exists(checkpoint_path(d, 40)));
  EXPECT_FALSE(fs::exists(temp_path(checkpoint_path(d, 35))));
  EXPECT_FALSE(fs::exists(temp_path(checkpoint_path(d, 50))));
  // `latest` pins its checkpoint even when it is not among the newest k.
  update_latest(d, checkpoint_path(d, 30));
  keep_last(d, 1);
  EXPECT_TRUE(fs::exists(checkpoint_path(d, 30)));
  EXPECT_TRUE(fs::exists(checkpoint_path(d, 40)));
  fs::remove(dir / "latest");
  EXPECT_EQ(resolve(d), checkpoint_path(d, 40));  // no latest: the highest step
  EXPECT_NE(error_of([&] { resolve((dir / "nothing").string()); }).find("nothing"), std::string::npos);
}

TEST(Checkpoint, H5dumpReadsIt) {
  if (std::system("command -v h5dump > /dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not installed (hdf5-tools)";
  const auto dir = scratch("h5dump");
  const std::string path = (dir / "c.h5").string();
  save_sample(path);
  const std::string out = (dir / "dump.txt").string();
  ASSERT_EQ(std::system(("h5dump -H '" + path + "' > '" + out + "' 2>&1").c_str()), 0);
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("layers.0.mixer.in_proj.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("exp_avg_sq"), std::string::npos);
  EXPECT_NE(text.find("format_version"), std::string::npos);
  EXPECT_NE(text.find("checksum"), std::string::npos);
  EXPECT_NE(text.find("( 5, 7 )"), std::string::npos);
}

}  // namespace
}  // namespace piper::checkpoint

namespace piper::checkpoint {
namespace {

// Rewrites one int64 root attribute of a finished checkpoint, as an edit with HDF5's tools would (checksums
// cover the tensors, not the attributes, so nothing else notices).
void edit_attr(const std::string& path, const char* name, int64_t v) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Fclose(f);
}

TEST(Checkpoint, EditedAttributesAreRefused) {
  const auto dir = scratch("attrs");
  const std::string path = (dir / "c.h5").string();
  struct Edit {
    const char* attr;
    int64_t value;
    const char* expect;
  };
  for (const Edit& e : {Edit{"step", -1, "attribute step is -1, outside 0.."},
                        Edit{"tokens_seen", int64_t{1} << 60, "attribute tokens_seen is 1152921504606846976"},
                        Edit{"data_position", 3, "step 120, data_position 3 and tokens_seen"}}) {
    save_sample(path);
    edit_attr(path, e.attr, e.value);
    const std::string err = error_of([&] { load(path, MPI_COMM_SELF, kSpecs, {}); });
    std::printf("[ edited %s = %lld ] %s\n", e.attr, static_cast<long long>(e.value), err.c_str());
    EXPECT_NE(err.find(e.expect), std::string::npos) << err;
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(error_of([&] { inspect(path, false); }).find(e.expect), std::string::npos);
  }
}

}  // namespace
}  // namespace piper::checkpoint
