// Writing a checkpoint: the commit protocol of checkpoint.h (payload, then
// manifest, each durably renamed into place, then the garbage collected).
#include "engine/checkpoint/checkpoint.h"

#include <bit>
#include <cmath>
#include <filesystem>
#include <optional>

#include "core/durable_file.h"
#include "core/input_file.h"
#include "engine/checkpoint/files.h"

namespace meshtrain {

using namespace checkpoint_files;
namespace fs = std::filesystem;

// The payload is the host's float32 bytes as they are; reading them back on a
// big-endian host would need a byte swap that nothing here does.
static_assert(std::endian::native == std::endian::little);

namespace {

Status write_file(const fs::path& final_path, std::span<const ByteChunk> chunks) {
  return write_durably(final_path.string(), final_path.string() + ".tmp", chunks);
}

// Removes what an interrupted commit left: temporaries, and payloads that are
// not the live one (when the manifest names it; otherwise none are touched),
// and, given the live manifest's tokenizer file ("" for none), other tokenizer
// copies. Only a commit whose own manifest is durable passes the tokenizer: a
// run's new copy lies unnamed until its first commit.
void remove_leftovers(const fs::path& dir, const std::string& live_payload,
                      const std::string* live_tokenizer = nullptr) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool stale_payload = !live_payload.empty() && is_payload_name(name) && name != live_payload;
    const bool stale_tokenizer = live_tokenizer != nullptr && is_tokenizer_name(name) && name != *live_tokenizer;
    if (is_temporary_name(name) || stale_payload || stale_tokenizer) fs::remove(entry.path(), ec);
  }
}

// The payload the current manifest names, or "" when there is no readable manifest.
std::string live_payload(const fs::path& dir) {
  const std::string path = (dir / kManifest).string();
  auto text = read_input_file(path, "checkpoint manifest");
  if (!text.ok()) return "";
  auto manifest = parse_checkpoint_manifest(*text, path);
  return manifest.ok() ? manifest->payload : "";
}

// The first non-finite element of `data`, if any.
std::optional<std::size_t> first_non_finite(const std::vector<float>& data) {
  for (std::size_t i = 0; i < data.size(); ++i)
    if (!std::isfinite(data[i])) return i;
  return std::nullopt;
}

// A payload name that no file in `dir` has, so the live payload is never overwritten.
std::string fresh_payload_name(const fs::path& dir, std::int64_t step) {
  for (int n = 0;; ++n) {
    std::string name = fmt::format("payload-{}-{}.bin", step, n);
    std::error_code ec;
    if (!fs::exists(dir / name, ec)) return name;
  }
}

}  // namespace

void CheckpointWriter::set_model_and_plan(const ModelSpec& m, const Plan& p) {
  meta_.model = model_to_json(m);
  meta_.plan = checkpoint_plan_json(m, p);
}

Status CheckpointWriter::add_tensor(std::string name, std::vector<std::int64_t> shape,
                                    std::vector<float> data) {
  for (const auto& [n, t] : tensors_) {
    if (n == name) return make_error("checkpoint tensor '{}' added twice", name);
  }
  for (std::int64_t d : shape) {
    if (d < 0) return make_error("checkpoint tensor '{}' has a negative dimension {}", name, d);
  }
  if (element_count(shape) != static_cast<std::int64_t>(data.size())) {
    return make_error("checkpoint tensor '{}' has shape of {} elements but {} values", name,
                      element_count(shape), data.size());
  }
  tensors_.emplace_back(std::move(name), CheckpointTensor{std::move(shape), std::move(data)});
  return ok_status();
}

Status CheckpointWriter::commit(const std::string& dir_name) const {
  // Only a checkpoint that can be resumed is written (the contract in checkpoint.h).
  for (const auto& [name, t] : tensors_) {
    if (auto i = first_non_finite(t.data)) {
      return make_error("checkpoint tensor '{}' holds {} at element {} of {}; a checkpoint that cannot be "
                        "resumed is not written, so the previous one in '{}' stays the last",
                        name, t.data[*i], *i, t.data.size(), dir_name);
    }
  }
  const fs::path dir(dir_name);
  std::error_code ec;
  const bool created = fs::create_directories(dir, ec);
  if (ec) return make_error("cannot create checkpoint directory '{}': {}", dir_name, ec.message());
  // A directory entry made now is durable only once its parent is synced.
  if (created) {
    fs::path abs = fs::absolute(dir).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();  // "a/b/" names b, not a
    MT_TRY(fsync_dir(abs.parent_path().string()));
  }
  // What an interrupted commit left would otherwise hold the disk space this one needs.
  remove_leftovers(dir, live_payload(dir));

  std::vector<ByteChunk> chunks;
  nlohmann::json tensors = nlohmann::json::array();
  std::uint64_t offset = 0;
  std::uint32_t crc = 0;
  for (const auto& [name, t] : tensors_) {
    const std::size_t bytes = t.data.size() * sizeof(float);
    chunks.push_back({t.data.data(), bytes});
    crc = crc_update(crc, t.data.data(), bytes);
    tensors.push_back({{"name", name},
                       {"dtype", "f32"},
                       {"shape", t.shape},
                       {"offset", offset},
                       {"bytes", bytes}});
    offset += bytes;
  }
  const std::string payload = fresh_payload_name(dir, meta_.step);
  MT_TRY(write_file(dir / payload, chunks));

  nlohmann::json manifest = {{"format", kFormat},
                             {"version", kCheckpointVersion},
                             {"model", meta_.model},
                             {"plan", meta_.plan},
                             {"step", meta_.step},
                             {"data_loader", loader_state_to_json(meta_.data_loader)},
                             {"rng", meta_.rng},
                             {"payload", {{"file", payload}, {"bytes", offset}, {"crc32", crc}}},
                             {"tensors", std::move(tensors)}};
  if (!meta_.run.is_null()) manifest["run"] = meta_.run;
  if (meta_.tokenizer) {
    const CheckpointTokenizer& t = *meta_.tokenizer;
    manifest["tokenizer"] = {
        {"file", t.file}, {"source", t.source}, {"bytes", t.bytes}, {"crc32", t.crc32}, {"vocab", t.vocab}};
  }
  manifest["manifest_crc32"] = manifest_crc(manifest);
  const std::string text = manifest.dump(2) + "\n";
  const ByteChunk manifest_chunk{text.data(), text.size()};
  if (Status s = write_file(dir / kManifest, {&manifest_chunk, 1}); !s.ok()) {
    fs::remove(dir / payload, ec);  // nothing names it; the previous checkpoint is untouched
    return s;
  }
  MT_TRY(fsync_dir(dir.string()));

  // The new manifest is durable: older payloads and tokenizer copies are garbage now.
  const std::string tokenizer = meta_.tokenizer ? meta_.tokenizer->file : std::string();
  remove_leftovers(dir, payload, &tokenizer);
  return fsync_dir(dir.string());
}

Result<CheckpointTokenizer> install_checkpoint_tokenizer(const std::string& dir_name, const std::string& source,
                                                         int vocab) {
  MT_ASSIGN(const std::string bytes, read_input_file(source, "tokenizer model"));
  CheckpointTokenizer t;
  t.source = source;
  t.bytes = bytes.size();
  t.crc32 = crc_update(0, bytes.data(), bytes.size());
  t.vocab = vocab;
  t.file = fmt::format("tokenizer-{:08x}.model", t.crc32);
  const fs::path dir(dir_name), path = dir / t.file;
  // A copy with this content is there already (a resumed or repeated run): keep it.
  auto there = read_input_file(path.string(), "checkpoint tokenizer");
  if (there.ok() && *there == bytes) return t;
  const ByteChunk chunk{bytes.data(), bytes.size()};
  MT_TRY(write_file(path, {&chunk, 1}));
  MT_TRY(fsync_dir(dir.string()));
  return t;
}

}  // namespace meshtrain
