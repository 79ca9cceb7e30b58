// files.hpp — where checkpoints live and how a directory of them stays consistent after a crash.
//   dir/step_00000120.h5   a finished checkpoint (written as dir/.step_00000120.h5.tmp, fsynced, renamed)
//   dir/latest             text: the file name of the newest finished checkpoint (temp + rename, written last)
#pragma once

#include <cstdint>
#include <string>

namespace piper::checkpoint {

// dir/step_00000120.h5
std::string checkpoint_path(const std::string& dir, int64_t step);
// dir/.step_00000120.h5.tmp for dir/step_00000120.h5: the name save writes before the rename.
std::string temp_path(const std::string& path);
// The step in a name step_NNNNNNNN.h5, or -1.
int64_t step_of(const std::string& path);

// Writes dir/latest (the file name of `path`) through dir/.latest.tmp, fsync, rename, fsync of dir.
void update_latest(const std::string& dir, const std::string& path);

// A checkpoint file from: a file (itself), a `latest` file (the checkpoint it names), a directory (its
// `latest`, or without one its highest step_*.h5). CheckpointError when there is none.
std::string resolve(const std::string& dir_or_path_or_latest);

// Removes all but the newest k step_*.h5 in dir (never the one `latest` names) and every temporary: called
// after a save has finished, when no other save is in flight, so they are of saves that never finished.
void keep_last(const std::string& dir, int k);

// fsync of a file or directory; CheckpointError naming it on failure.
void fsync_path(const std::string& path);

}  // namespace piper::checkpoint
