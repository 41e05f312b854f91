#include "engine/checkpoint/files.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace meshtrain::checkpoint_files {

std::string errno_text() { return std::strerror(errno); }

bool is_payload_name(const std::string& name) {
  return name.starts_with("payload-") && (name.ends_with(".bin") || name.ends_with(".bin.tmp"));
}

bool is_tokenizer_name(const std::string& name) {
  return name.starts_with("tokenizer-") && name.ends_with(".model") && name.find('/') == std::string::npos;
}

bool is_temporary_name(const std::string& name) {
  return name == kManifestTmp || (name.starts_with("payload-") && name.ends_with(".bin.tmp")) ||
         (name.starts_with("tokenizer-") && name.ends_with(".model.tmp")) ||
         (name.starts_with(".write-probe-") && name.ends_with(".tmp"));
}

bool is_our_name(const std::string& name) {
  return name == kManifest || name == kLockFile || is_payload_name(name) || is_tokenizer_name(name) ||
         is_temporary_name(name);
}

std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n) {
  // zlib treats a null buffer as "start over" and returns 0; an empty tensor's
  // data() may be null and must leave the running checksum alone.
  if (n == 0) return crc;
  return static_cast<std::uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

std::uint32_t manifest_crc(const nlohmann::json& body) {
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return crc_update(0, text.data(), text.size());
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d != 0 && n > kMaxTensorElements / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace meshtrain::checkpoint_files
