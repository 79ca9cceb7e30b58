// prepare.cpp — `piper prepare`: collect the documents, train or load the tokenizer, tokenize in
// parallel, write the token file.
#include "data/prepare.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "data/token_file.hpp"
#include "io/regular_file.hpp"

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
  try {
    return io::read_regular(path.string(), 0);
  } catch (const io::FileError& e) {
    fail(e.what());
  }
}

// Writes `bytes` to `path` atomically (a temporary beside it, then rename).
void write_file(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      fail("cannot write '" + tmp + "': " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
}

// The text of every document, in order, with the blank line between documents.
std::string collect(const std::vector<std::string>& inputs, const std::string& output) {
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
  return text;
}

// The tokenizer the options name, with its model written beside `output`.
std::unique_ptr<Tokenizer> tokenizer_for(const std::string& text, const std::string& output,
                                         const PrepareOptions& o, Prepared& done) {
  if (o.train.vocab_size > 0 && !o.tokenizer.empty())
    fail("both --tokenizer-train and --tokenizer are given (expected one: train a model, or use one)");
  std::string model;
  if (o.train.vocab_size > 0) {
    if (o.progress) std::fprintf(stderr, "prepare: training a %s model of %d pieces on %.1f MiB\n",
                                 o.train.model_type.c_str(), o.train.vocab_size,
                                 static_cast<double>(text.size()) / (1 << 20));
    const auto t0 = std::chrono::steady_clock::now();
    model = train_sentencepiece(text, o.train);
    done.train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else if (!o.tokenizer.empty()) {
    model = read_model_file(o.tokenizer);
  } else {
    return std::make_unique<ByteTokenizer>();
  }
  auto tok = std::make_unique<SentencePieceTokenizer>(model, o.tokenizer.empty() ? "trained on the inputs"
                                                                                 : "'" + o.tokenizer + "'");
  done.model_path = model_path_for(output);
  std::error_code ec;
  if (o.tokenizer.empty() || !fs::equivalent(o.tokenizer, done.model_path, ec)) write_file(done.model_path, model);
  return tok;
}

// Pieces of the text that end at a line break (a piece never spans one: '\n' is its own token with
// either tokenizer), about 1 MiB each.
std::vector<std::string_view> line_chunks(std::string_view text) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<std::string_view> chunks;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = std::min(text.size(), pos + kChunk);
    if (end < text.size()) {
      const size_t nl = text.find('\n', end);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    chunks.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return chunks;
}

}  // namespace

Prepared prepare(const std::vector<std::string>& inputs, const std::string& output, const PrepareOptions& o) {
  if (inputs.empty()) fail("no inputs (expected at least one text file or directory)");
  Prepared done;
  const std::string text = collect(inputs, output);
  done.bytes = static_cast<int64_t>(text.size());
  const fs::path parent = fs::path(output).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) fail("cannot create directory '" + parent.string() + "' for '" + output + "': " + ec.message());
  }
  const std::unique_ptr<Tokenizer> tok = tokenizer_for(text, output, o, done);
  done.kind = tok->kind();
  done.vocab_size = tok->vocab_size();

  // Chunks are encoded in parallel, a batch of them at a time, and joined in order.
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  const std::vector<std::string_view> chunks = line_chunks(text);
  std::vector<std::vector<int32_t>> encoded(chunks.size());
  std::vector<int32_t> ids;
  int64_t read = 0;
  constexpr size_t kBatch = 16;
  for (size_t first = 0; first < chunks.size(); first += kBatch) {
    const auto n = static_cast<int64_t>(std::min(kBatch, chunks.size() - first));
#pragma omp parallel for schedule(dynamic)
    for (int64_t k = 0; k < n; ++k) encoded[first + k] = tok->encode(chunks[first + k]);
    for (int64_t k = 0; k < n; ++k) {
      ids.insert(ids.end(), encoded[first + k].begin(), encoded[first + k].end());
      read += static_cast<int64_t>(chunks[first + k].size());
      std::vector<int32_t>().swap(encoded[first + k]);
    }
    const auto now = std::chrono::steady_clock::now();
    if (o.progress && now - last >= std::chrono::seconds(1)) {
      const double s = std::chrono::duration<double>(now - t0).count();
      std::fprintf(stderr, "prepare: read %.1f of %.1f MiB, %lld tokens, %.2f MiB/s\n",
                   static_cast<double>(read) / (1 << 20), static_cast<double>(text.size()) / (1 << 20),
                   static_cast<long long>(ids.size()), static_cast<double>(read) / (1 << 20) / s);
      last = now;
    }
  }
  done.tokens = static_cast<int64_t>(ids.size());
  if (done.tokens < kTokenMinCount) {
    fail("the inputs hold " + std::to_string(ids.size()) + " tokens (expected at least " +
         std::to_string(kTokenMinCount) + " to write '" + output + "')");
  }
  write_token_file(output, static_cast<uint32_t>(tok->vocab_size()), ids, tok->stamp());
  done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return done;
}

}  // namespace piper::data
