// A run's claim on its checkpoint directory: the lock, and the look at what
// the directory holds (claim_checkpoint_dir in checkpoint.h).
#include "engine/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "core/durable_file.h"
#include "core/fd.h"
#include "core/input_file.h"
#include "engine/checkpoint/files.h"

namespace meshtrain {

using namespace checkpoint_files;
namespace fs = std::filesystem;

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
