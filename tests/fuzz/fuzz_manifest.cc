// Fuzz target: the checkpoint manifest reader (engine/checkpoint.h). Each
// input is read as it is and, when it is a JSON object, once more with its
// manifest_crc32 made right, so the fields behind the checksum get fuzzed too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/json_input.h"
#include "engine/checkpoint/checkpoint.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace meshtrain;
  const std::string_view text = meshtrain::fuzz::fuzz_text(data, size);
  (void)parse_checkpoint_manifest(text, "fuzz/manifest.json");
  auto j = parse_json(text, "fuzz manifest");
  if (!j.ok() || !j->is_object()) return 0;
  j->erase("manifest_crc32");
  (*j)["manifest_crc32"] = checkpoint_manifest_crc(*j);
  const std::string fixed = j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  (void)parse_checkpoint_manifest(fixed, "fuzz/manifest.json");
  return 0;
}
