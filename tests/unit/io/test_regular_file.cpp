// test_regular_file.cpp — io::open_regular / read_regular / why_not_regular: only regular files of a
// bounded size, and never a wait on a FIFO.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "io/regular_file.hpp"

namespace piper::io {
namespace {

namespace fs = std::filesystem;

class RegularFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("piper-io-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::string error_of(const std::string& path, int64_t max_bytes) {
    try {
      read_regular(path, max_bytes);
    } catch (const FileError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(RegularFile, ReadsARegularFileUpToItsBound) {
  const std::string p = file("a.txt", "hello");
  EXPECT_EQ(read_regular(p, 5), "hello");
  EXPECT_EQ(error_of(p, 4), "is 5 bytes, more than the 4 allowed");
  EXPECT_EQ(why_not_regular(p), "");
  EXPECT_EQ(why_not_regular((dir_ / "absent").string()), "");
}

TEST_F(RegularFile, RefusesAFifoAtOnceADirectoryAndADevice) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(error_of(fifo, 0), "not a regular file: it is a FIFO (named pipe)");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_EQ(why_not_regular(fifo), "not a regular file: it is a FIFO (named pipe)");
  EXPECT_EQ(error_of(dir_.string(), 0), "not a regular file: it is a directory");
  EXPECT_EQ(error_of("/dev/zero", 0), "not a regular file: it is a character device");
  EXPECT_EQ(error_of((dir_ / "absent").string(), 0), "cannot open: No such file or directory");
}

}  // namespace
}  // namespace piper::io
