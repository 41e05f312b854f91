#include "core/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "core/input_file.h"

namespace meshtrain {

double host_memory_bytes() {
  double bytes = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  // cgroup v2, then v1; "max" or an absurd v1 number means no limit.
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (in >> text && !text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
      const double limit = std::stod(text);
      if (limit > 0) bytes = std::min(bytes, limit);
    }
  }
  return bytes;
}

Status check_host_memory(double bytes, std::string_view what, std::string_view fix) {
  const double have = host_memory_bytes();
  if (bytes <= have) return ok_status();
  return make_error("{} needs about {}, but this machine has {} of memory; {}", what, human_bytes(bytes),
                    human_bytes(have), fix);
}

}  // namespace meshtrain
