#include "engine/simulation/variation.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/bounded.h"

namespace meshtrain {

namespace {

// A straggler at most this many times slower: far past any real one, and it
// keeps the simulator's integer picoseconds from overflowing.
constexpr RealRange kSlowdown{0, 1000, true};

// `flag` '`spec`': ... names the flag and the whole value in errors.
Result<double> parse_factor(std::string_view text, std::string_view flag, std::string_view spec, std::string_view what,
                            const RealRange& range) {
  auto v = parse_real(what, text, range);
  if (!v.ok()) return make_error("{} '{}': {}", flag, spec, v.error().message());
  return v;
}

Result<int> parse_rank(std::string_view text, std::string_view spec, int world) {
  auto v = parse_int("a rank", text, {0, std::numeric_limits<int>::max()});
  if (!v.ok()) return make_error("--straggler '{}': {} (write 17, 3,5,9 or 8-15)", spec, v.error().message());
  if (*v >= world) return make_error("--straggler '{}': rank {} is outside the world of {} ranks (0..{})", spec, *v, world, world - 1);
  return static_cast<int>(*v);
}

// splitmix64: the seeded draw of random stragglers.
std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Result<std::map<int, double>> parse_stragglers(const std::vector<std::string>& specs, int world,
                                               std::uint64_t seed) {
  std::map<int, double> out;
  for (const std::string& spec : specs) {
    const auto colon = spec.rfind(':');
    if (colon == std::string::npos)
      return make_error("--straggler '{}': write RANKS:FACTOR (e.g. 17:1.3) or random:P:FACTOR", spec);
    MT_ASSIGN(const double factor,
              parse_factor(std::string_view(spec).substr(colon + 1), "--straggler", spec, "the factor (1.3: 30% slower)",
                           kSlowdown));
    std::vector<int> ranks;
    const std::string_view what = std::string_view(spec).substr(0, colon);
    if (what.substr(0, 7) == "random:") {
      MT_ASSIGN(const double p, parse_factor(what.substr(7), "--straggler", spec, "the fraction P", {0, 1, true}));
      const int n = std::max(1, static_cast<int>(std::lround(p * world)));
      std::vector<int> all(static_cast<std::size_t>(world));
      std::iota(all.begin(), all.end(), 0);
      std::uint64_t state = seed ^ 0x5eedULL;
      for (int i = 0; i < n; ++i) {  // a partial Fisher-Yates shuffle
        const auto j = static_cast<std::size_t>(i) + next(state) % static_cast<std::uint64_t>(world - i);
        std::swap(all[static_cast<std::size_t>(i)], all[j]);
        ranks.push_back(all[static_cast<std::size_t>(i)]);
      }
    } else {
      std::size_t start = 0;
      while (start <= what.size()) {
        const std::size_t comma = std::min(what.find(',', start), what.size());
        const std::string_view item = what.substr(start, comma - start);
        if (item.starts_with("-"))
          return make_error("--straggler '{}': rank {} is negative; ranks are 0..{} (write 17, 3,5,9 or 8-15)", spec,
                            item, world - 1);
        const std::size_t dash = item.find('-');
        MT_ASSIGN(const int lo, parse_rank(item.substr(0, dash), spec, world));
        int hi = lo;
        if (dash != std::string_view::npos) {
          MT_ASSIGN(hi, parse_rank(item.substr(dash + 1), spec, world));
          if (hi < lo) return make_error("--straggler '{}': range {} runs backwards", spec, item);
        }
        for (int r = lo; r <= hi; ++r) ranks.push_back(r);
        start = comma + 1;
      }
    }
    for (int r : ranks)
      if (!out.emplace(r, factor).second)
        return make_error("--straggler '{}': rank {} is already a straggler (give each rank once)", spec, r);
  }
  return out;
}

Result<LinkChange> parse_link_degrade(const std::string& spec) {
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return make_error("--link-degrade '{}': write CABLE:FACTOR (e.g. leaf2-spine7:0.5)", spec);
  MT_ASSIGN(const double factor, parse_factor(std::string_view(spec).substr(colon + 1), "--link-degrade", spec,
                                              "the factor (the share of bandwidth left; --link-fail for none)",
                                              {0, 1, true}));
  return LinkChange{spec.substr(0, colon), factor, false};
}

LinkChange link_failure(const std::string& cable) { return LinkChange{cable, 0, true}; }

namespace {

std::string describe_link(const LinkChange& c) {
  return c.fail ? fmt::format("--link-fail {}", c.cable) : fmt::format("--link-degrade {}:{:g}", c.cable, c.factor);
}

}  // namespace

Status add_link_change(Variation& v, LinkChange change) {
  for (const LinkChange& c : v.links)
    if (c.cable == change.cable)
      return make_error("{} and {} both change cable {}: a cable is failed or degraded once; give one of them",
                        describe_link(c), describe_link(change), c.cable);
  v.links.push_back(std::move(change));
  return ok_status();
}

std::vector<std::string> describe_variation(const Variation& v) {
  std::vector<std::string> out;
  if (!v.stragglers.empty())
    out.push_back(fmt::format("{} straggler{}: {}", v.stragglers.size(), v.stragglers.size() == 1 ? "" : "s",
                              describe_stragglers(v.stragglers)));
  for (const LinkChange& c : v.links)
    out.push_back(c.fail ? fmt::format("cable {} failed", c.cable)
                         : fmt::format("cable {} at {:g} of its bandwidth", c.cable, c.factor));
  return out;
}

std::string describe_stragglers(const std::map<int, double>& stragglers, std::size_t limit) {
  std::string out;
  std::size_t n = 0;
  for (const auto& [rank, f] : stragglers) {
    if (n == limit) {
      out += fmt::format(" ... and {} more", stragglers.size() - limit);
      break;
    }
    out += fmt::format("{}rank {} x{:.2f}", n++ == 0 ? "" : ", ", rank, f);
  }
  return out;
}

}  // namespace meshtrain
