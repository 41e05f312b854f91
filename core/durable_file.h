// Files written so that a crash, a full disk or a signal never leaves a
// half-written file under its final name: the bytes go to a temporary name
// beside it, are fsynced, and the temporary is renamed over the final name.
// Checkpoints (engine/checkpoint/) and every user-named output
// (core/input_file.h, write_output_file) are written this way.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "core/status.h"

namespace meshtrain {

// Loops over short writes and EINTR; false on any other failure (errno set).
bool write_all(int fd, const void* data, std::size_t n);
// Loops over short reads and EINTR; false on an error or an early end of file.
bool read_all(int fd, void* data, std::size_t n);

struct ByteChunk {
  const void* data;
  std::size_t size;
};

// Writes `chunks` back to back into `tmp_path` (created, or truncated unless
// `exclusive`), fsyncs it and renames it onto `final_path`. On any failure
// the temporary is removed, so a full disk does not stay full of it, and the
// Error names the file and the system's reason.
Status write_durably(const std::string& final_path, const std::string& tmp_path, std::span<const ByteChunk> chunks,
                     bool exclusive = false);

// Makes the renames in directory `dir` themselves durable.
Status fsync_dir(const std::string& dir);

}  // namespace meshtrain
