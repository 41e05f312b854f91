#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/durable_file.h"
#include "core/fd.h"

namespace meshtrain {

namespace {

std::string not_regular(std::string_view what, const std::string& path, unsigned mode) {
  if (S_ISDIR(mode)) return fmt::format("{} '{}' is a directory; pass a JSON file", what, path);
  return fmt::format("{} '{}' is {}, not a regular file; pass a JSON file", what, path, file_kind(mode));
}

}  // namespace

std::string_view file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

Result<std::string> read_input_file(const std::string& path, std::string_view what, std::size_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return make_error("{} '{}' does not exist; check the path", what, path);
    return make_error("cannot open {} '{}': {}", what, path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Error(not_regular(what, path, st.st_mode));
  // O_NONBLOCK: should the path have become a FIFO since the stat, open returns at once.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return make_error("cannot open {} '{}': {}", what, path, std::strerror(errno));
  if (::fstat(fd.get(), &st) != 0) return make_error("cannot stat {} '{}': {}", what, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Error(not_regular(what, path, st.st_mode));
  auto too_large = [&](double bytes) {
    return make_error("{} '{}' is {}{}; the most meshtrain reads is {} (is it the right file?)", what, path,
                      bytes > static_cast<double>(max_bytes) && st.st_size == 0 ? "over " : "",
                      human_bytes(bytes), human_bytes(static_cast<double>(max_bytes)));
  };
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) return too_large(static_cast<double>(st.st_size));
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      return make_error("cannot read {} '{}': {}", what, path, std::strerror(errno));
    }
    text.append(buf, static_cast<std::size_t>(r));
    // Files whose size stat does not know (/proc) are capped as they are read.
    if (text.size() > max_bytes) return too_large(static_cast<double>(text.size()));
  }
  return text;
}

namespace {

// A descriptor for writing `path` (a regular file, or new), or the reason why not.
Result<Fd> open_output(const std::string& path, std::string_view what, int flags, bool& existed) {
  struct stat st {};
  existed = ::stat(path.c_str(), &st) == 0;
  if (existed && !S_ISREG(st.st_mode))
    return make_error("{} '{}' is {}; pass a file path", what, path, file_kind(st.st_mode));
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | flags, 0644));
  if (fd.get() < 0) return make_error("cannot write {} '{}': {}", what, path, std::strerror(errno));
  return fd;
}

}  // namespace

Status probe_output_file(const std::string& path, std::string_view what) {
  bool existed = false;
  MT_ASSIGN(Fd fd, open_output(path, what, 0, existed));
  if (!existed) ::unlink(path.c_str());
  return ok_status();
}

Status write_output_file(const std::string& path, std::string_view text, std::string_view what) {
  if (path.empty()) return make_error("the {} path is empty; name a file", what);
  bool existed = false;
  // The file as it is (a regular one, or none), checked as the probe checks it.
  { MT_ASSIGN(Fd probe, open_output(path, what, 0, existed)); }
  if (!existed) ::unlink(path.c_str());
  // Written beside it under a temporary name and renamed over it, so a failure
  // part-way (a full disk, a signal) leaves the old file whole.
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const ByteChunk chunk{text.data(), text.size()};
  Status written = write_durably(path, tmp, {&chunk, 1}, /*exclusive=*/true);
  if (!written.ok()) return std::move(written).error().context(fmt::format("writing {} '{}'", what, path));
  return ok_status();
}

}  // namespace meshtrain
