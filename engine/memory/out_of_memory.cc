#include "engine/memory/out_of_memory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace meshtrain {

std::vector<MemoryConsumer> memory_consumers(const MemoryBreakdown& m) {
  const MemoryConsumer parts[] = {{"parameters", m.parameters},
                                  {"gradients", m.gradients},
                                  {"optimizer state", m.optimizer},
                                  {"zero-3 gathered layers", m.zero3_working},
                                  {"whole-layer gradient buffers", m.gradient_working},
                                  {"reduce-scattered gradient shard", m.gradient_shard},
                                  {"activations", m.activations},
                                  {"backward's working gradients", m.backward_working}};
  std::vector<MemoryConsumer> out;
  for (const MemoryConsumer& c : parts)
    if (c.bytes > 0) out.push_back(c);
  return out;
}

MemoryConsumer largest_consumer(const std::vector<MemoryConsumer>& consumers) {
  MemoryConsumer best{"nothing", 0};
  for (const MemoryConsumer& c : consumers)
    if (c.bytes > best.bytes) best = c;
  return best;
}

std::string out_of_memory_message(const OutOfMemory& o) {
  const MemoryConsumer top = largest_consumer(o.consumers);
  std::string out = fmt::format("out of memory: rank {}{} peaks at an estimated {}", o.rank,
                                o.where.empty() ? "" : fmt::format(" ({})", o.where), human_bytes(o.peak));
  // Rank threads share one machine: the capacity binds their sum, not one rank.
  if (o.sharing_ranks > 1)
    out += fmt::format(", and the {} ranks of this process {} together,", o.sharing_ranks, human_bytes(o.shared_total));
  out += fmt::format(" against {}'s capacity of {}; its largest consumer is the {} ({})", o.capacity_of,
                     human_bytes(o.capacity), top.name, human_bytes(top.bytes));
  std::vector<std::string> parts;
  for (const MemoryConsumer& c : o.consumers) parts.push_back(fmt::format("{} {}", c.name, human_bytes(c.bytes)));
  out += fmt::format(". Breakdown of the rank: {}", fmt::join(parts, ", "));
  if (!o.detail.empty()) out += "; " + o.detail;
  if (!o.fix.empty()) out += ". " + o.fix;
  return out;
}

}  // namespace meshtrain
