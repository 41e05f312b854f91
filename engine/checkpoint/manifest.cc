// The manifest: its parser (every field, type and range) and what compares a
// checkpoint with a run.
#include "engine/checkpoint/checkpoint.h"

#include <filesystem>
#include <set>

#include "core/input_file.h"
#include "core/json_input.h"
#include "engine/checkpoint/files.h"

namespace meshtrain {

using namespace checkpoint_files;
namespace fs = std::filesystem;

namespace {

std::string show(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// Appends "checkpoint was written for K A, this run has K B" for every key
// whose values differ; `skip` lists keys that do not affect compatibility.
void diff_fields(const nlohmann::json& written, const nlohmann::json& now,
                 const std::string& prefix, const std::set<std::string>& skip,
                 std::vector<std::string>& out) {
  std::set<std::string> keys;
  for (const auto& [k, v] : written.items()) keys.insert(k);
  for (const auto& [k, v] : now.items()) keys.insert(k);
  for (const std::string& k : keys) {
    if (skip.count(k)) continue;
    const nlohmann::json a = written.contains(k) ? written[k] : nlohmann::json("(absent)");
    const nlohmann::json b = now.contains(k) ? now[k] : nlohmann::json("(absent)");
    if (a != b) {
      out.push_back(fmt::format("checkpoint was written for {}{} {}, this run has {}{} {}", prefix,
                                k, show(a), prefix, k, show(b)));
    }
  }
}

// The manifest's JSON object, its manifest_crc32 checked and removed.
Result<nlohmann::json> checksummed_json(std::string_view text, const std::string& path) {
  auto parsed = parse_json(text, fmt::format("checkpoint manifest '{}'", path));
  if (!parsed.ok() || !parsed->is_object()) {
    return make_error("checkpoint manifest '{}' is not valid JSON ({} bytes; truncated or corrupted{}); {}", path,
                      text.size(), parsed.ok() ? "" : ": " + parsed.error().message(), kRefuse);
  }
  nlohmann::json& manifest = *parsed;
  if (!manifest.contains("manifest_crc32") || !manifest["manifest_crc32"].is_number_unsigned()) {
    return make_error("checkpoint manifest '{}' has no manifest_crc32; {}", path, kRefuse);
  }
  const auto stored_crc = manifest["manifest_crc32"].get<std::uint64_t>();
  manifest.erase("manifest_crc32");
  const std::uint32_t actual_crc = manifest_crc(manifest);
  if (stored_crc != actual_crc) {
    return make_error("checkpoint manifest '{}' is corrupted: crc32 expected {:#010x}, actual {:#010x}; {}", path,
                      stored_crc, actual_crc, kRefuse);
  }
  return std::move(manifest);
}

Error malformed(const std::string& path, const Error& e) {
  return make_error("checkpoint manifest '{}' is malformed ({}); {}", path, e.message(), kRefuse);
}

// A meshtrain manifest of the format version this build reads.
Status check_format_version(const JsonFields& fields, const std::string& path) {
  std::string format;
  int version = 0;
  if (!fields.get_string("format", format).ok() || format != kFormat) {
    return make_error("'{}' is not a meshtrain checkpoint manifest; {}", path, kRefuse);
  }
  if (Status s = fields.get_int("version", IntRange{0, 1 << 20}, version); !s.ok()) return malformed(path, s.error());
  if (version != kCheckpointVersion) {
    return make_error("checkpoint '{}' has format version {}, this build reads version {}; {}", path, version,
                      kCheckpointVersion, kRefuse);
  }
  return ok_status();
}

Result<CheckpointTokenizer> read_tokenizer(const nlohmann::json& j) {
  MT_ASSIGN(const JsonFields tf, JsonFields::of(j, "field 'tokenizer'", "field 'tokenizer' must be an object"));
  for (const char* key : {"file", "source", "bytes", "crc32", "vocab"})
    if (!tf.has(key)) return make_error("field 'tokenizer' needs file, source, bytes, crc32 and vocab");
  CheckpointTokenizer t;
  MT_TRY(tf.get_string("file", t.file));
  MT_TRY(tf.get_string("source", t.source));
  MT_TRY(tf.get_uint64("bytes", std::uint64_t{1} << 40, t.bytes));
  MT_TRY(tf.get_int("crc32", IntRange{0, 0xffffffff}, t.crc32));
  MT_TRY(tf.get_int("vocab", IntRange{1, 1 << 30}, t.vocab));
  if (!is_tokenizer_name(t.file))
    return make_error("field 'tokenizer': file '{}' is not a tokenizer copy's name (tokenizer-<crc32>.model)",
                      t.file);
  return t;
}

Status read_payload(const nlohmann::json& j, CheckpointManifest& m) {
  MT_ASSIGN(const JsonFields payload, JsonFields::of(j, "field 'payload'", "field 'payload' must be an object"));
  if (!payload.has("file") || !payload.has("bytes") || !payload.has("crc32"))
    return make_error("field 'payload' needs file, bytes and crc32");
  MT_TRY(payload.get_string("file", m.payload));
  MT_TRY(payload.get_uint64("bytes", std::uint64_t{1} << 52, m.payload_bytes));
  MT_TRY(payload.get_int("crc32", IntRange{0, 0xffffffff}, m.payload_crc));
  return ok_status();
}

// Entry i of the field 'tensors'.
Result<CheckpointManifest::Tensor> read_tensor_entry(const nlohmann::json& t, std::size_t i) {
  MT_ASSIGN(const JsonFields tf, JsonFields::of(t, fmt::format("tensors[{}] field", i),
                                                fmt::format("tensors[{}] must be an object", i)));
  for (const char* key : {"name", "dtype", "shape", "offset", "bytes"})
    if (!tf.has(key)) return make_error("tensors[{}]: field '{}' is missing", i, key);
  CheckpointManifest::Tensor entry;
  std::string dtype;
  MT_TRY(tf.get_string("name", entry.name));
  MT_TRY(tf.get_string("dtype", dtype));
  if (dtype != "f32") return make_error("tensor '{}' has dtype {}; this build reads f32 only", entry.name, dtype);
  if (!tf.at("shape").is_array()) return make_error("tensors[{}]: field 'shape' must be a list", i);
  const auto shape = tf.at("shape");
  for (std::size_t d = 0; d < shape.size(); ++d) {
    MT_ASSIGN(const std::int64_t dim, json_int(shape[d], fmt::format("tensors[{}] shape[{}]", i, d),
                                               IntRange{0, kMaxTensorElements}));
    entry.shape.push_back(dim);
  }
  MT_TRY(tf.get_uint64("offset", std::uint64_t{1} << 52, entry.offset));
  MT_TRY(tf.get_uint64("bytes", std::uint64_t{1} << 52, entry.bytes));
  return entry;
}

// Every field, its type and its range; the first problem is the message.
Status read_fields(const JsonFields& fields, CheckpointManifest& m) {
  for (const char* key : {"model", "plan", "step", "rng", "data_loader", "payload", "tensors"})
    if (!fields.has(key)) return make_error("field '{}' is missing", key);
  m.meta.model = fields.at("model");
  m.meta.plan = fields.at("plan");
  m.meta.rng = fields.at("rng");
  if (fields.has("run")) m.meta.run = fields.at("run");
  if (fields.has("tokenizer")) {
    MT_ASSIGN(m.meta.tokenizer, read_tokenizer(fields.at("tokenizer")));
  }
  MT_TRY(fields.get_int("step", IntRange{0, std::int64_t{1} << 62}, m.meta.step));
  MT_ASSIGN(m.meta.data_loader, loader_state_from_json(fields.at("data_loader")));
  MT_TRY(read_payload(fields.at("payload"), m));
  if (!fields.at("tensors").is_array()) return make_error("field 'tensors' must be a list");
  std::size_t i = 0;
  for (const auto& t : fields.at("tensors")) {
    MT_ASSIGN(CheckpointManifest::Tensor entry, read_tensor_entry(t, i));
    m.tensors.push_back(std::move(entry));
    ++i;
  }
  return ok_status();
}

// Tensors tile the payload in order; anything else is a manifest no writer makes.
Status check_payload_layout(const CheckpointManifest& m, const std::string& path) {
  std::uint64_t expect_offset = 0;
  for (const CheckpointManifest::Tensor& t : m.tensors) {
    const std::int64_t n = element_count(t.shape);
    if (n < 0 || t.offset != expect_offset || t.bytes != static_cast<std::uint64_t>(n) * sizeof(float)) {
      return make_error("checkpoint manifest '{}': tensor '{}' (offset {}, {} bytes) does not fit "
                        "its shape or the payload layout; {}",
                        path, t.name, t.offset, t.bytes, kRefuse);
    }
    expect_offset += t.bytes;
  }
  if (expect_offset != m.payload_bytes || m.payload.find('/') != std::string::npos || !is_payload_name(m.payload)) {
    return make_error("checkpoint manifest '{}': tensors cover {} bytes but the payload '{}' is {}; {}", path,
                      expect_offset, m.payload, m.payload_bytes, kRefuse);
  }
  return ok_status();
}

}  // namespace

Result<CheckpointManifest> parse_checkpoint_manifest(std::string_view text, const std::string& path) {
  MT_ASSIGN(const nlohmann::json manifest, checksummed_json(text, path));
  const auto fields = JsonFields::of(manifest, "field", "").value();
  MT_TRY(check_format_version(fields, path));
  CheckpointManifest m;
  if (Status s = read_fields(fields, m); !s.ok()) return malformed(path, s.error());
  MT_TRY(check_payload_layout(m, path));
  return m;
}

Result<CheckpointManifest> read_checkpoint_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  MT_ASSIGN(const std::string text, read_input_file(path, "checkpoint manifest"));
  return parse_checkpoint_manifest(text, path);
}

std::uint32_t checkpoint_manifest_crc(const nlohmann::json& manifest_without_crc) {
  return manifest_crc(manifest_without_crc);
}

std::uint32_t checkpoint_crc32(std::span<const std::uint8_t> bytes) {
  return crc_update(0, bytes.data(), bytes.size());
}

nlohmann::json checkpoint_plan_json(const ModelSpec& m, const Plan& p) {
  nlohmann::json j = plan_to_json(p);
  j["seq_len"] = p.effective_seq_len(m);
  return j;
}

Status check_compatible(const Checkpoint& c, const ModelSpec& m, const Plan& p) {
  std::vector<std::string> mismatches;
  // The name is a label: a preset and a JSON file of the same shape are one model.
  diff_fields(c.meta.model, model_to_json(m), "", {"name"}, mismatches);
  // "plan " keeps the plan's seq_len apart from the model's.
  diff_fields(c.meta.plan, checkpoint_plan_json(m, p), "plan ", {}, mismatches);
  if (mismatches.empty()) return ok_status();
  std::string list;
  for (const auto& s : mismatches) list += (list.empty() ? "" : "; ") + s;
  return make_error(
      "checkpoint in '{}' does not match this run: {}; resume with the same model and "
      "plan, or point --checkpoint elsewhere",
      c.dir, list);
}

}  // namespace meshtrain
