#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <optional>
#include <set>

#include "core/fd.h"
#include "core/input_file.h"
#include "core/json_input.h"

namespace meshtrain {
namespace fs = std::filesystem;

// The payload is the host's float32 bytes as they are; reading them back on a
// big-endian host would need a byte swap that nothing here does.
static_assert(std::endian::native == std::endian::little);

namespace {

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestTmp = "manifest.json.tmp";
constexpr const char* kLockFile = "meshtrain.lock";
constexpr const char* kRefuse = "delete the directory or point --checkpoint elsewhere";

std::string errno_text() { return std::strerror(errno); }

bool write_all(int fd, const void* data, std::size_t n) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t n) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= static_cast<std::size_t>(r);
  }
  return true;
}

std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n) {
  // zlib treats a null buffer as "start over" and returns 0; an empty tensor's
  // data() may be null and must leave the running checksum alone.
  if (n == 0) return crc;
  return static_cast<std::uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

struct Chunk {
  const void* data;
  std::size_t size;
};

// tmp: create, write, fsync, close; then rename onto `final_path`. On any
// failure the temporary is removed: a full disk must not stay full of it.
Status write_durably(const fs::path& final_path, const std::vector<Chunk>& chunks) {
  const fs::path tmp = final_path.string() + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return make_error("cannot create '{}': {}", tmp.string(), errno_text());
  auto fail = [&](const char* what) {
    Error e = make_error("cannot {} '{}': {}", what, tmp.string(), errno_text());
    ::unlink(tmp.c_str());
    return e;
  };
  for (const Chunk& c : chunks) {
    if (!write_all(fd.get(), c.data, c.size)) return fail("write");
  }
  if (::fsync(fd.get()) != 0 || !fd.close()) return fail("flush to disk");
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    Error e = make_error("cannot rename '{}' to '{}': {}", tmp.string(), final_path.string(), errno_text());
    ::unlink(tmp.c_str());
    return e;
  }
  return ok_status();
}

// Makes the renames in `dir` themselves durable.
Status fsync_dir(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
    return make_error("cannot flush directory '{}' to disk: {}", dir.string(), errno_text());
  }
  return ok_status();
}

bool is_payload_name(const std::string& name) {
  return name.starts_with("payload-") && (name.ends_with(".bin") || name.ends_with(".bin.tmp"));
}

// tokenizer-<crc32>.model: the copy of a run's tokenizer (no '/': it names a file in the directory).
bool is_tokenizer_name(const std::string& name) {
  return name.starts_with("tokenizer-") && name.ends_with(".model") && name.find('/') == std::string::npos;
}

bool is_temporary_name(const std::string& name) {
  return name == kManifestTmp || (name.starts_with("payload-") && name.ends_with(".bin.tmp")) ||
         (name.starts_with("tokenizer-") && name.ends_with(".model.tmp")) ||
         (name.starts_with(".write-probe-") && name.ends_with(".tmp"));
}

// Every name a checkpoint directory holds of ours.
bool is_our_name(const std::string& name) {
  return name == kManifest || name == kLockFile || is_payload_name(name) || is_tokenizer_name(name) ||
         is_temporary_name(name);
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

// Elements of a shape of non-negative dimensions; -1 past kMaxTensorElements.
constexpr std::int64_t kMaxTensorElements = std::int64_t{1} << 50;
std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d != 0 && n > kMaxTensorElements / d) return -1;
    n *= d;
  }
  return n;
}

std::uint32_t manifest_crc(const nlohmann::json& body) {
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return crc_update(0, text.data(), text.size());
}

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

}  // namespace

Result<const CheckpointTensor*> Checkpoint::tensor(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return make_error(
        "checkpoint in '{}' has no tensor '{}'; it was written by another model or plan", dir,
        name);
  }
  return &it->second;
}

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
    MT_TRY(fsync_dir(abs.parent_path()));
  }
  // What an interrupted commit left would otherwise hold the disk space this one needs.
  remove_leftovers(dir, live_payload(dir));

  std::vector<Chunk> chunks;
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
  MT_TRY(write_durably(dir / payload, chunks));

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
  if (Status s = write_durably(dir / kManifest, {{text.data(), text.size()}}); !s.ok()) {
    fs::remove(dir / payload, ec);  // nothing names it; the previous checkpoint is untouched
    return s;
  }
  MT_TRY(fsync_dir(dir));

  // The new manifest is durable: older payloads and tokenizer copies are garbage now.
  const std::string tokenizer = meta_.tokenizer ? meta_.tokenizer->file : std::string();
  remove_leftovers(dir, payload, &tokenizer);
  return fsync_dir(dir);
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifest, ec);
}

Result<CheckpointManifest> parse_checkpoint_manifest(std::string_view text, const std::string& path) {
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
  const auto malformed = [&](const Error& e) {
    return make_error("checkpoint manifest '{}' is malformed ({}); {}", path, e.message(), kRefuse);
  };
  const auto fields = JsonFields::of(manifest, "field", "").value();
  std::string format;
  int version = 0;
  if (!fields.get_string("format", format).ok() || format != kFormat) {
    return make_error("'{}' is not a meshtrain checkpoint manifest; {}", path, kRefuse);
  }
  if (Status s = fields.get_int("version", IntRange{0, 1 << 20}, version); !s.ok()) return malformed(s.error());
  if (version != kCheckpointVersion) {
    return make_error("checkpoint '{}' has format version {}, this build reads version {}; {}", path, version,
                      kCheckpointVersion, kRefuse);
  }
  // Every field, its type and its range; the first problem is the message.
  CheckpointManifest m;
  Status status = [&]() -> Status {
    for (const char* key : {"model", "plan", "step", "rng", "data_loader", "payload", "tensors"})
      if (!fields.has(key)) return make_error("field '{}' is missing", key);
    m.meta.model = fields.at("model");
    m.meta.plan = fields.at("plan");
    m.meta.rng = fields.at("rng");
    if (fields.has("run")) m.meta.run = fields.at("run");
    if (fields.has("tokenizer")) {
      MT_ASSIGN(const JsonFields tf, JsonFields::of(fields.at("tokenizer"), "field 'tokenizer'",
                                                    "field 'tokenizer' must be an object"));
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
      m.meta.tokenizer = std::move(t);
    }
    MT_TRY(fields.get_int("step", IntRange{0, std::int64_t{1} << 62}, m.meta.step));
    MT_ASSIGN(m.meta.data_loader, loader_state_from_json(fields.at("data_loader")));
    MT_ASSIGN(const JsonFields payload, JsonFields::of(fields.at("payload"), "field 'payload'",
                                                       "field 'payload' must be an object"));
    if (!payload.has("file") || !payload.has("bytes") || !payload.has("crc32"))
      return make_error("field 'payload' needs file, bytes and crc32");
    MT_TRY(payload.get_string("file", m.payload));
    MT_TRY(payload.get_uint64("bytes", std::uint64_t{1} << 52, m.payload_bytes));
    MT_TRY(payload.get_int("crc32", IntRange{0, 0xffffffff}, m.payload_crc));
    if (!fields.at("tensors").is_array()) return make_error("field 'tensors' must be a list");
    std::size_t i = 0;
    for (const auto& t : fields.at("tensors")) {
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
      m.tensors.push_back(std::move(entry));
      ++i;
    }
    return ok_status();
  }();
  if (!status.ok()) return malformed(status.error());

  // Tensors tile the payload in order; anything else is a manifest no writer makes.
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
  return m;
}

Result<CheckpointManifest> read_checkpoint_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  MT_ASSIGN(const std::string text, read_input_file(path, "checkpoint manifest"));
  return parse_checkpoint_manifest(text, path);
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
  MT_TRY(write_durably(path, {{bytes.data(), bytes.size()}}));
  MT_TRY(fsync_dir(dir));
  return t;
}

std::uint32_t checkpoint_manifest_crc(const nlohmann::json& manifest_without_crc) {
  return manifest_crc(manifest_without_crc);
}

std::uint32_t checkpoint_crc32(std::span<const std::uint8_t> bytes) {
  return crc_update(0, bytes.data(), bytes.size());
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

Status probe_checkpoint_dir(const std::string& dir_name) {
  const fs::path dir(dir_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(
        "cannot create checkpoint directory '{}': {}; pass a writable --checkpoint path", dir_name,
        ec.message());
  }
  if (!fs::is_directory(dir, ec)) {
    return make_error("checkpoint path '{}' is not a directory; pass a directory to --checkpoint",
                      dir_name);
  }
  const fs::path probe = dir / fmt::format(".write-probe-{}.tmp", ::getpid());
  Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  const char byte = 0;
  const bool ok = fd.get() >= 0 && write_all(fd.get(), &byte, 1) && fd.close();
  const std::string why = errno_text();
  fs::remove(probe, ec);
  if (!ok) {
    return make_error(
        "checkpoint directory '{}' is not writable: {}; pass a writable --checkpoint path",
        dir_name, why);
  }
  return ok_status();
}

}  // namespace meshtrain

namespace meshtrain {

namespace {

// Who holds the lock, as its file records it ("pid 123 on host h").
std::string lock_holder(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "another process" : s;
}

// What a directory holds, as claim_checkpoint_dir sees it.
struct DirContents {
  bool manifest = false;       // manifest.json exists
  bool ours = false;           // ... and is a meshtrain manifest (maybe damaged)
  std::int64_t step = -1;      // its step when it parses
  std::vector<std::string> payloads, foreign;
};

DirContents look_into(const fs::path& dir, const std::vector<std::string>& run_files) {
  DirContents c;
  std::error_code ec;
  std::vector<fs::path> own;
  for (const std::string& f : run_files) own.push_back(fs::weakly_canonical(f, ec));
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (std::find(own.begin(), own.end(), fs::weakly_canonical(entry.path(), ec)) != own.end()) continue;
    if (name == kManifest) {
      c.manifest = true;
    } else if (is_payload_name(name) && !is_temporary_name(name)) {
      c.payloads.push_back(name);
    } else if (!is_our_name(name)) {
      c.foreign.push_back(name);
    }
  }
  std::sort(c.foreign.begin(), c.foreign.end());
  if (c.manifest) {
    const std::string path = (dir / kManifest).string();
    auto text = read_input_file(path, "checkpoint manifest");
    if (text.ok()) {
      auto m = parse_checkpoint_manifest(*text, path);
      if (m.ok()) c.step = m->meta.step;
      // A damaged manifest of ours still names our format near its top.
      c.ours = m.ok() || text->find(kFormat) != std::string::npos;
    }
  }
  return c;
}

std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 3; ++i) out += fmt::format("{}'{}'", i ? ", " : "", names[i]);
  if (names.size() > 3) out += fmt::format(" and {} more", names.size() - 3);
  return out;
}

// Whether a run of `use` may write into `dir`: an error naming what is there otherwise.
Status check_contents(const fs::path& dir, const std::string& dir_name, CheckpointUse use,
                      const std::vector<std::string>& run_files) {
  const DirContents c = look_into(dir, run_files);
  const std::string here = fmt::format("checkpoint directory '{}'", dir_name);
  if (c.manifest && !c.ours)
    return make_error("'{}' is not a meshtrain checkpoint manifest; meshtrain would overwrite it: point "
                      "--checkpoint at a new or empty directory", (dir / kManifest).string());
  if (!c.manifest && !c.foreign.empty())
    return make_error("{} is not empty and holds no meshtrain checkpoint (it has {}); meshtrain would write "
                      "among those files: point --checkpoint at a new or empty directory",
                      here, some_names(c.foreign));
  if (use == CheckpointUse::fresh && c.manifest)
    return make_error("{} already holds a checkpoint{}; continue it with --resume, or replace it with "
                      "--overwrite-checkpoint", here, c.step >= 0 ? fmt::format(" (step {})", c.step) : "");
  if (use == CheckpointUse::fresh && !c.payloads.empty())
    return make_error("{} holds checkpoint payloads ({}) but no manifest.json: an incomplete checkpoint; "
                      "replace it with --overwrite-checkpoint or point --checkpoint elsewhere",
                      here, some_names(c.payloads));
  if (use == CheckpointUse::resume && !c.manifest && !c.payloads.empty())
    return make_error("{} holds checkpoint payloads ({}) but no manifest.json, so there is nothing to resume "
                      "from: restore manifest.json, or start again from step 1 with --overwrite-checkpoint "
                      "instead of --resume", here, some_names(c.payloads));
  return ok_status();
}

}  // namespace

Result<CheckpointLock> claim_checkpoint_dir(const std::string& dir_name, CheckpointUse use,
                                            const std::vector<std::string>& run_files) {
  MT_TRY(probe_checkpoint_dir(dir_name));
  const fs::path dir(dir_name);
  const fs::path lock_path = dir / kLockFile;
  std::error_code ec;
  const bool lock_existed = fs::exists(lock_path, ec);
  Fd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644));
  if (fd.get() < 0)
    return make_error("cannot create the lock file '{}': {}; pass a writable --checkpoint path", lock_path.string(),
                      errno_text());
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK)
      return make_error("cannot lock '{}': {}", lock_path.string(), errno_text());
    return make_error("checkpoint directory '{}' is in use by another meshtrain run ({}); wait for it to finish "
                      "or stop it, or point --checkpoint elsewhere",
                      dir_name, lock_holder(fd.get()));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string holder = fmt::format("pid {} on host {}\n", ::getpid(), host);
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), holder.data(), holder.size(), 0) < 0)
    return make_error("cannot write the lock file '{}': {}", lock_path.string(), errno_text());

  // A directory refused below keeps nothing of ours: the lock file goes again if this run made it.
  Status refused = check_contents(dir, dir_name, use, run_files);
  if (!refused.ok()) {
    if (!lock_existed) fs::remove(lock_path, ec);
    return std::move(refused).error();
  }
  // We hold the lock: an interrupted commit's temporaries are nobody's now.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_temporary_name(name)) fs::remove(entry.path(), ec);
  }
  return CheckpointLock(std::move(fd));
}

}  // namespace meshtrain
