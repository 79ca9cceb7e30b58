// prepare.hpp — `piper prepare`: text files in, one token file out, with the byte tokenizer or a
// SentencePiece model trained on the text or given (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"

namespace piper::data {

struct PrepareOptions {
  SubwordOptions train;   // train.vocab_size > 0: train a SentencePiece model on the inputs
  std::string tokenizer;  // a SentencePiece model file to use as it is
  bool progress = false;  // a line on stderr every second: bytes read, tokens written, rate
};

struct Prepared {
  int64_t bytes = 0, tokens = 0;
  double seconds = 0;         // tokenizing and writing, after any training
  double train_seconds = 0;   // training the model
  TokenizerKind kind = TokenizerKind::BYTE;
  int32_t vocab_size = 0;
  std::string model_path;     // where the SentencePiece model was written; empty for bytes
};

// Concatenates the documents named by `inputs` — a file is one document; a directory stands
// for every regular file under it, recursively, sorted by path — in the order given, with a
// blank line between documents (a newline is added first where a document does not end with
// one; empty files are skipped). Tokenizes the text — with bytes, with a model trained on it
// (options.train), or with options.tokenizer — and writes the token file `output`, creating its
// directory; a SentencePiece model is written (or copied) to model_path_for(output).
// Throws DataError: no inputs, an input that is missing or not a file or directory, an
// unreadable file, both a model to train and one to use, a model that cannot be trained or
// loaded, fewer than 2 tokens in all, or a failure writing.
Prepared prepare(const std::vector<std::string>& inputs, const std::string& output, const PrepareOptions& options);

}  // namespace piper::data
