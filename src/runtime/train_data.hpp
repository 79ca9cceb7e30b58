// train_data.hpp — the token files a run reads, and which of their ids the training order and the
// held-out evaluations draw from (docs/data.md, "Held-out data").
#pragma once

#include <memory>

#include "config/config.hpp"
#include "data/split.hpp"
#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "runtime/mpi_env.hpp"

namespace piper::runtime {

struct TrainData {
  std::unique_ptr<data::TokenFile> tokens;  // data.path
  std::unique_ptr<data::TokenFile> held;    // data.eval_path's, when given
  std::unique_ptr<data::Tokenizer> tokenizer;  // the one both were made with
  data::Split split;                        // train: of `tokens`; held_out and held: of `held` when given, else of `tokens`
  const data::TokenFile& held_file() const { return held ? *held : *tokens; }
};

// Every rank opens the token files and their tokenizer (all stop if any cannot); the held-out sequences
// are the last of data.path's (data.eval_fraction) or every whole sequence of data.eval_path's. Throws
// UserError, naming the key's position and the file, when a file cannot be read, when its tokenizer's
// model is missing or another, when the model's vocab_size is smaller than the tokenizer's, when
// data.eval_path was made with another tokenizer than data.path, when the fraction leaves no sequence
// to train on, or when an evaluation (train.eval_every > 0) reads more sequences than are held out.
TrainData open_data(const config::Config& cfg, const MpiEnv& env);

}  // namespace piper::runtime
