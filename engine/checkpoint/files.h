// What the files of a checkpoint directory are called and how their
// checksums are computed: shared by the writer, the reader, the manifest's
// parser and the claim on a directory (engine/checkpoint/*.cc), nobody else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::checkpoint_files {

inline constexpr const char* kFormat = "meshtrain-checkpoint";
inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kManifestTmp = "manifest.json.tmp";
inline constexpr const char* kLockFile = "meshtrain.lock";
inline constexpr const char* kRefuse = "delete the directory or point --checkpoint elsewhere";

// payload-<step>-<n>.bin, or its temporary (.bin.tmp).
bool is_payload_name(const std::string& name);
// tokenizer-<crc32>.model: the copy of a run's tokenizer (no '/': it names a file in the directory).
bool is_tokenizer_name(const std::string& name);
// What an interrupted commit or probe leaves behind.
bool is_temporary_name(const std::string& name);
// Every name a checkpoint directory holds of ours.
bool is_our_name(const std::string& name);

// zlib's running crc32; an empty buffer leaves it alone.
std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n);
// The crc32 of a manifest's compact dump (without its manifest_crc32 field).
std::uint32_t manifest_crc(const nlohmann::json& body);

// Elements of a shape of non-negative dimensions; -1 past kMaxTensorElements.
inline constexpr std::int64_t kMaxTensorElements = std::int64_t{1} << 50;
std::int64_t element_count(const std::vector<std::int64_t>& shape);

std::string errno_text();

}  // namespace meshtrain::checkpoint_files
