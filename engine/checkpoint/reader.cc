// Reading a checkpoint back: the manifest, then the payload, each verified.
#include "engine/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>

#include "core/durable_file.h"
#include "core/fd.h"
#include "core/input_file.h"
#include "engine/checkpoint/files.h"

namespace meshtrain {

using namespace checkpoint_files;
namespace fs = std::filesystem;

Result<const CheckpointTensor*> Checkpoint::tensor(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return make_error(
        "checkpoint in '{}' has no tensor '{}'; it was written by another model or plan", dir,
        name);
  }
  return &it->second;
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifest, ec);
}

Result<Checkpoint> load_checkpoint(const std::string& dir_name) {
  const fs::path dir(dir_name);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return make_error("checkpoint directory '{}' does not exist; point --checkpoint at one",
                      dir_name);
  }
  const fs::path manifest_path = dir / kManifest;
  if (!fs::exists(manifest_path, ec)) {
    return make_error("no checkpoint in '{}': '{}' is missing; {}", dir_name,
                      manifest_path.string(), kRefuse);
  }
  MT_ASSIGN(const std::string text, read_input_file(manifest_path.string(), "checkpoint manifest"));
  MT_ASSIGN(CheckpointManifest manifest, parse_checkpoint_manifest(text, manifest_path.string()));

  Checkpoint c;
  c.dir = dir_name;
  c.meta = std::move(manifest.meta);
  const std::string& payload_name = manifest.payload;
  const std::uint64_t payload_bytes = manifest.payload_bytes;
  const std::uint32_t payload_crc = manifest.payload_crc;
  std::vector<CheckpointManifest::Tensor>& entries = manifest.tensors;

  const fs::path payload_path = dir / payload_name;
  Fd fd(::open(payload_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    return make_error("checkpoint payload '{}' cannot be opened: {}; {}", payload_path.string(),
                      errno_text(), kRefuse);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return make_error("cannot stat checkpoint payload '{}': {}", payload_path.string(),
                      errno_text());
  }
  if (!S_ISREG(st.st_mode)) {
    return make_error("checkpoint payload '{}' is {}, not a regular file; {}", payload_path.string(),
                      file_kind(st.st_mode), kRefuse);
  }
  if (static_cast<std::uint64_t>(st.st_size) != payload_bytes) {
    return make_error(
        "checkpoint payload '{}' is {} bytes, the manifest expects {} (truncated or "
        "overwritten); {}",
        payload_path.string(), st.st_size, payload_bytes, kRefuse);
  }
  std::uint32_t crc = 0;
  for (CheckpointManifest::Tensor& t : entries) {
    CheckpointTensor tensor{std::move(t.shape), std::vector<float>(t.bytes / sizeof(float))};
    if (!read_all(fd.get(), tensor.data.data(), t.bytes)) {
      return make_error("cannot read checkpoint payload '{}': {}", payload_path.string(),
                        errno_text());
    }
    crc = crc_update(crc, tensor.data.data(), t.bytes);
    if (!c.tensors.emplace(t.name, std::move(tensor)).second) {
      return make_error("checkpoint manifest '{}' lists tensor '{}' twice; {}",
                        manifest_path.string(), t.name, kRefuse);
    }
  }
  if (crc != payload_crc) {
    return make_error(
        "checkpoint payload '{}' is corrupted: crc32 expected {:#010x}, actual {:#010x}; {}",
        payload_path.string(), payload_crc, crc, kRefuse);
  }
  if (c.meta.tokenizer) {
    const CheckpointTokenizer& t = *c.meta.tokenizer;
    const fs::path path = dir / t.file;
    MT_ASSIGN(const std::string bytes, read_input_file(path.string(), "checkpoint tokenizer")
                                           .context(fmt::format("checkpoint in '{}' names a tokenizer copy", dir_name)));
    const std::uint32_t actual = crc_update(0, bytes.data(), bytes.size());
    if (bytes.size() != t.bytes || actual != t.crc32)
      return make_error("checkpoint tokenizer '{}' is {} bytes with crc32 {:#010x}, the manifest expects {} bytes "
                        "with crc32 {:#010x} (overwritten or damaged); copy '{}' back there, or {}",
                        path.string(), bytes.size(), actual, t.bytes, t.crc32, t.source, kRefuse);
  }
  return c;
}

}  // namespace meshtrain
