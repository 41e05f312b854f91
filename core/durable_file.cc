#include "core/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/fd.h"

namespace meshtrain {

namespace {

// All n bytes through `io` (::read or ::write), which may move fewer at a
// time or be interrupted by a signal; false on an error or end of file.
template <class Byte, class Io>
bool transfer_all(int fd, Byte* p, std::size_t n, Io io) {
  while (n > 0) {
    const ssize_t done = io(fd, p, n);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    p += done, n -= static_cast<std::size_t>(done);
  }
  return true;
}

}  // namespace

bool write_all(int fd, const void* data, std::size_t n) {
  return transfer_all(fd, static_cast<const char*>(data), n, ::write);
}

bool read_all(int fd, void* data, std::size_t n) { return transfer_all(fd, static_cast<char*>(data), n, ::read); }

Status write_durably(const std::string& final_path, const std::string& tmp_path, std::span<const ByteChunk> chunks,
                     bool exclusive) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC);
  Fd fd(::open(tmp_path.c_str(), flags, 0644));
  if (fd.get() < 0) return make_error("cannot create '{}': {}", tmp_path, std::strerror(errno));
  auto fail = [&](const char* what) {
    Error e = make_error("cannot {} '{}': {}", what, tmp_path, std::strerror(errno));
    ::unlink(tmp_path.c_str());
    return e;
  };
  for (const ByteChunk& c : chunks)
    if (!write_all(fd.get(), c.data, c.size)) return fail("write");
  if (::fsync(fd.get()) != 0 || !fd.close()) return fail("flush to disk");
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    Error e = make_error("cannot rename '{}' to '{}': {}", tmp_path, final_path, std::strerror(errno));
    ::unlink(tmp_path.c_str());
    return e;
  }
  return ok_status();
}

Status fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    return make_error("cannot flush directory '{}' to disk: {}", dir, std::strerror(errno));
  return ok_status();
}

}  // namespace meshtrain
