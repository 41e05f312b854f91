// Files that a user names. Reading one (a model, plan, cluster, calibration or
// checkpoint manifest) takes one path; so does checking that an output can be
// written.
//
// Reading a file that a user named (a model, plan, cluster, calibration or
// checkpoint manifest): the one path every such read takes, so a special file
// cannot hang or exhaust the process. Only regular files are read: a
// directory, FIFO, socket or device is refused by its kind (a FIFO would block
// forever, /dev/zero never ends); the open itself does not block; a file
// larger than the cap is refused with both sizes before it is read.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain {

// Larger than any model, plan, cluster, calibration or manifest file.
inline constexpr std::size_t kMaxInputFileBytes = std::size_t{64} << 20;

// The whole file. `what` names it in errors ("model file", "calibration file").
Result<std::string> read_input_file(const std::string& path, std::string_view what,
                                    std::size_t max_bytes = kMaxInputFileBytes);

// An Error with the OS's reason ("Permission denied") unless `path` can be
// written: checked before long work whose result goes there. A file that did
// not exist is created and removed again.
Status probe_output_file(const std::string& path, std::string_view what);

// Writes `text` to `path` (created or replaced): the one path every output
// a user names takes (plan --out, traces, calibrations). Like the probe, only
// a regular file or a new one is written, so a FIFO is refused instead of
// hanging; the text goes to a temporary file beside it (PATH.tmp-PID), flushed
// to disk, then renamed over `path`, so a failure leaves the old file whole.
// An empty path is refused; errors carry the OS's reason.
Status write_output_file(const std::string& path, std::string_view text, std::string_view what);

// "a directory", "a FIFO (named pipe)", "a character device", ... for the
// file type bits of a stat mode; "a regular file" for S_IFREG.
std::string_view file_kind(unsigned mode);

// "1.50 GiB": bytes for messages.
std::string human_bytes(double bytes);

}  // namespace meshtrain
