#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

namespace meshtrain {
namespace fs = std::filesystem;

// The payload is the host's float32 bytes as they are; reading them back on a
// big-endian host would need a byte swap that nothing here does.
static_assert(std::endian::native == std::endian::little);

namespace {

constexpr const char* kFormat = "meshtrain-checkpoint";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestTmp = "manifest.json.tmp";
constexpr const char* kRefuse = "delete the directory or point --checkpoint elsewhere";

std::string errno_text() { return std::strerror(errno); }

// Owns a file descriptor; closes it on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Close reports the error a delayed write may surface only here.
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

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

// tmp: create, write, fsync, close; then rename onto `final_path`.
Status write_durably(const fs::path& final_path, const std::vector<Chunk>& chunks) {
  const fs::path tmp = final_path.string() + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return make_error("cannot create '{}': {}", tmp.string(), errno_text());
  for (const Chunk& c : chunks) {
    if (!write_all(fd.get(), c.data, c.size)) {
      return make_error("cannot write '{}': {}", tmp.string(), errno_text());
    }
  }
  if (::fsync(fd.get()) != 0 || !fd.close()) {
    return make_error("cannot flush '{}' to disk: {}", tmp.string(), errno_text());
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return make_error("cannot rename '{}' to '{}': {}", tmp.string(), final_path.string(),
                      errno_text());
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

// A payload name that no file in `dir` has, so the live payload is never overwritten.
std::string fresh_payload_name(const fs::path& dir, std::int64_t step) {
  for (int n = 0;; ++n) {
    std::string name = fmt::format("payload-{}-{}.bin", step, n);
    std::error_code ec;
    if (!fs::exists(dir / name, ec)) return name;
  }
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::uint32_t manifest_crc(const nlohmann::json& body) {
  const std::string text = body.dump();
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

Result<std::string> read_text(const fs::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return make_error("cannot open '{}': {}", path.string(), errno_text());
  std::string text;
  char buf[1 << 16];
  ssize_t r;
  while ((r = ::read(fd.get(), buf, sizeof buf)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return make_error("cannot read '{}': {}", path.string(), errno_text());
    text.append(buf, static_cast<std::size_t>(r));
  }
  return text;
}

// The manifest's fields once its checksum has passed; a json exception here
// means a manifest of this version with a field of the wrong kind.
struct ManifestTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0, bytes = 0;
};

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
  manifest["manifest_crc32"] = manifest_crc(manifest);
  const std::string text = manifest.dump(2) + "\n";
  MT_TRY(write_durably(dir / kManifest, {{text.data(), text.size()}}));
  MT_TRY(fsync_dir(dir));

  // The new manifest is durable: older payloads and an interrupted commit's
  // temporaries are garbage now.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if ((is_payload_name(name) && name != payload) || name == kManifestTmp) {
      fs::remove(entry.path(), ec);
    }
  }
  return fsync_dir(dir);
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
  MT_ASSIGN(const std::string text, read_text(manifest_path));
  nlohmann::json manifest = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return make_error(
        "checkpoint manifest '{}' is not valid JSON ({} bytes; truncated or corrupted); {}",
        manifest_path.string(), text.size(), kRefuse);
  }
  if (!manifest.contains("manifest_crc32") || !manifest["manifest_crc32"].is_number_unsigned()) {
    return make_error("checkpoint manifest '{}' has no manifest_crc32; {}", manifest_path.string(),
                      kRefuse);
  }
  const auto stored_crc = manifest["manifest_crc32"].get<std::uint64_t>();
  manifest.erase("manifest_crc32");
  const std::uint32_t actual_crc = manifest_crc(manifest);
  if (stored_crc != actual_crc) {
    return make_error(
        "checkpoint manifest '{}' is corrupted: crc32 expected {:#010x}, actual {:#010x}; {}",
        manifest_path.string(), stored_crc, actual_crc, kRefuse);
  }
  if (manifest.value("format", "") != kFormat) {
    return make_error("'{}' is not a meshtrain checkpoint manifest; {}", manifest_path.string(),
                      kRefuse);
  }
  if (manifest.value("version", 0) != kCheckpointVersion) {
    return make_error("checkpoint '{}' has format version {}, this build reads version {}; {}",
                      manifest_path.string(), manifest.value("version", 0), kCheckpointVersion,
                      kRefuse);
  }

  Checkpoint c;
  c.dir = dir_name;
  std::string payload_name;
  std::uint64_t payload_bytes = 0, payload_crc = 0;
  std::vector<ManifestTensor> entries;
  try {
    c.meta.model = manifest.at("model");
    c.meta.plan = manifest.at("plan");
    c.meta.step = manifest.at("step").get<std::int64_t>();
    c.meta.rng = manifest.at("rng");
    MT_ASSIGN(c.meta.data_loader, loader_state_from_json(manifest.at("data_loader")));
    const auto& payload = manifest.at("payload");
    payload_name = payload.at("file").get<std::string>();
    payload_bytes = payload.at("bytes").get<std::uint64_t>();
    payload_crc = payload.at("crc32").get<std::uint64_t>();
    for (const auto& t : manifest.at("tensors")) {
      if (t.at("dtype").get<std::string>() != "f32") {
        return make_error("checkpoint tensor '{}' has dtype {}; this build reads f32 only",
                          t.at("name").get<std::string>(), t.at("dtype").dump());
      }
      entries.push_back({t.at("name").get<std::string>(),
                         t.at("shape").get<std::vector<std::int64_t>>(),
                         t.at("offset").get<std::uint64_t>(), t.at("bytes").get<std::uint64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return make_error("checkpoint manifest '{}' is malformed ({}); {}", manifest_path.string(),
                      e.what(), kRefuse);
  }

  // Tensors tile the payload in order; anything else is a manifest no writer makes.
  std::uint64_t expect_offset = 0;
  for (const ManifestTensor& t : entries) {
    bool dims_ok = true;
    for (std::int64_t d : t.shape) dims_ok = dims_ok && d >= 0;
    if (!dims_ok || t.offset != expect_offset ||
        t.bytes != static_cast<std::uint64_t>(element_count(t.shape)) * sizeof(float)) {
      return make_error(
          "checkpoint manifest '{}': tensor '{}' (offset {}, {} bytes) does not fit "
          "its shape or the payload layout; {}",
          manifest_path.string(), t.name, t.offset, t.bytes, kRefuse);
    }
    expect_offset += t.bytes;
  }
  if (expect_offset != payload_bytes || payload_name.find('/') != std::string::npos) {
    return make_error(
        "checkpoint manifest '{}': tensors cover {} bytes but the payload '{}' is {}; {}",
        manifest_path.string(), expect_offset, payload_name, payload_bytes, kRefuse);
  }

  const fs::path payload_path = dir / payload_name;
  Fd fd(::open(payload_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return make_error("checkpoint payload '{}' cannot be opened: {}; {}", payload_path.string(),
                      errno_text(), kRefuse);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return make_error("cannot stat checkpoint payload '{}': {}", payload_path.string(),
                      errno_text());
  }
  if (static_cast<std::uint64_t>(st.st_size) != payload_bytes) {
    return make_error(
        "checkpoint payload '{}' is {} bytes, the manifest expects {} (truncated or "
        "overwritten); {}",
        payload_path.string(), st.st_size, payload_bytes, kRefuse);
  }
  std::uint32_t crc = 0;
  for (ManifestTensor& t : entries) {
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
