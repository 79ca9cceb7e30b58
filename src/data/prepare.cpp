// prepare.cpp — `piper prepare`: collect the documents, tokenize bytes, write the token file.
#include "data/prepare.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "data/token_file.hpp"
#include "data/tokenizer.hpp"

namespace piper::data {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& what) { throw DataError("prepare: " + what); }

// The documents of one input, in order: the file itself, or a directory's regular files sorted
// by path.
std::vector<fs::path> documents_of(const std::string& input) {
  std::error_code ec;
  const fs::file_status st = fs::status(input, ec);
  if (st.type() == fs::file_type::not_found) {
    fail("input '" + input + "' does not exist (expected a text file or a directory of them)");
  }
  if (ec) fail("cannot stat input '" + input + "': " + ec.message());
  if (fs::is_regular_file(st)) return {fs::path(input)};
  if (!fs::is_directory(st)) {
    fail("input '" + input +
         "' is not a regular file or directory (expected a text file or a "
         "directory of them)");
  }
  std::vector<fs::path> files;
  fs::recursive_directory_iterator it(input, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) fail("cannot list directory '" + input + "': " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '" + path.string() + "': " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("error reading '" + path.string() + "': " + std::strerror(errno));
  return text;
}

}  // namespace

int64_t prepare(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty()) fail("no inputs (expected at least one text file or directory)");
  std::error_code ec;
  const fs::path out_path = fs::weakly_canonical(output, ec);

  std::string text;
  for (const std::string& input : inputs) {
    for (const fs::path& doc : documents_of(input)) {
      if (!out_path.empty() && fs::weakly_canonical(doc, ec) == out_path) continue;  // a rerun
      const std::string body = read_file(doc);
      if (body.empty()) continue;
      if (!text.empty()) text += '\n';  // the blank line between documents
      text += body;
      if (text.back() != '\n') text += '\n';
    }
  }

  const ByteTokenizer tokenizer;
  const std::vector<int32_t> ids = tokenizer.encode(text);
  if (static_cast<int64_t>(ids.size()) < kTokenMinCount) {
    fail("the inputs hold " + std::to_string(ids.size()) + " bytes (expected at least " +
         std::to_string(kTokenMinCount) + " to write '" + output + "')");
  }
  const fs::path parent = fs::path(output).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec)
      fail("cannot create directory '" + parent.string() + "' for '" + output +
           "': " + ec.message());
  }
  write_token_file(output, static_cast<uint32_t>(tokenizer.vocab_size()), ids);
  return static_cast<int64_t>(ids.size());
}

}  // namespace piper::data
