#include "engine/data/byte_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/host_memory.h"

namespace meshtrain {

std::size_t validation_bytes(std::size_t file_bytes, int seq_len) {
  return std::max(file_bytes / 10, static_cast<std::size_t>(seq_len) + 1);
}

Result<ByteDataset> load_byte_dataset(const std::string& path, int seq_len) {
  if (seq_len < 1) return make_error("--seq-len must be at least 1, got {}", seq_len);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    return make_error("data file '{}' does not exist; pass an existing file with --data", path);
  }
  if (!std::filesystem::is_regular_file(status)) {
    return make_error(
        "data file '{}' is not a regular file; pass a file (not a directory) with --data", path);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) {
    return make_error("cannot read data file '{}': {}; check its permissions", path,
                      std::strerror(errno));
  }
  // The whole file is held in memory: one larger than the machine (a 40 GB file, a sparse one) is refused
  // before reading instead of running the machine out of memory.
  const auto size = static_cast<double>(std::filesystem::file_size(path, ec));
  MT_TRY(check_host_memory(size, fmt::format("reading data file '{}' into memory", path),
                           "train on a smaller file (or a part of it)"));
  ByteDataset d;
  d.path = path;
  d.bytes.reserve(static_cast<std::size_t>(size));
  unsigned char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0)
    d.bytes.insert(d.bytes.end(), buf, buf + n);
  if (std::ferror(f.get())) {
    return make_error("error reading data file '{}': {}", path, std::strerror(errno));
  }
  if (d.bytes.empty())
    return make_error("data file '{}' is empty; pass a file with text in it", path);

  const std::size_t need = 2 * (static_cast<std::size_t>(seq_len) + 1);
  if (d.bytes.size() < need) {
    return make_error(
        "data file '{}' has {} bytes, but --seq-len {} needs at least {} bytes ({} for one "
        "training "
        "sequence and {} for the held-out validation split); use a longer file or a smaller "
        "--seq-len",
        path, d.bytes.size(), seq_len, need, seq_len + 1, seq_len + 1);
  }
  d.val_size = validation_bytes(d.bytes.size(), seq_len);
  return d;
}

}  // namespace meshtrain
