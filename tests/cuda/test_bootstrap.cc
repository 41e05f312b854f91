// The NCCL unique-id bootstrap over a fake channel: the group's first rank
// makes the id once and every other member receives exactly it.
#include <catch2/catch.hpp>

#include <deque>
#include <map>
#include <tuple>

#include "backends/cuda/bootstrap.h"

using namespace meshtrain;
using namespace meshtrain::cuda;

namespace {
// One mailbox per (from, to, tag), shared by the "ranks" of a test that run
// one after another (root first).
struct Mailboxes {
  std::map<std::tuple<int, int, int>, std::deque<UniqueId>> box;
};

class FakeChannel final : public IdChannel {
 public:
  FakeChannel(Mailboxes& m, int me) : m_(m), me_(me) {}
  Status send(std::span<const std::byte> bytes, int to, int tag) override {
    UniqueId id;
    std::copy(bytes.begin(), bytes.end(), id.begin());
    m_.box[{me_, to, tag}].push_back(id);
    return ok_status();
  }
  Status recv(std::span<std::byte> bytes, int from, int tag) override {
    auto& q = m_.box[{from, me_, tag}];
    if (q.empty()) return make_error("nothing from rank {}", from);
    std::copy(q.front().begin(), q.front().end(), bytes.begin());
    q.pop_front();
    return ok_status();
  }

 private:
  Mailboxes& m_;
  int me_;
};

UniqueId id_of(int seed) {
  UniqueId id;
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(seed + static_cast<int>(i));
  return id;
}
}  // namespace

TEST_CASE("the first rank of the group makes the id and all members share it") {
  Mailboxes m;
  const Group g{7, {2, 5, 6}};
  int made = 0;
  auto make = [&]() -> Result<UniqueId> {
    ++made;
    return id_of(42);
  };
  std::map<int, UniqueId> got;
  for (int r : g.ranks) {  // root first, as its sends precede the receives
    FakeChannel ch(m, r);
    auto id = share_unique_id(ch, g, r, make);
    REQUIRE(id.ok());
    got[r] = *id;
  }
  CHECK(made == 1);
  for (int r : g.ranks) CHECK(got[r] == id_of(42));
  for (auto& [key, q] : m.box) CHECK(q.empty());
  CHECK(m.box.count({2, 5, bootstrap_tag(g)}) == 1);
  CHECK(m.box.count({2, 6, bootstrap_tag(g)}) == 1);
}

TEST_CASE("bootstrap failures name the group and the peer") {
  Mailboxes m;
  const Group g{3, {0, 1}};
  FakeChannel ch(m, 1);
  auto id = share_unique_id(ch, g, 1, [] { return Result<UniqueId>(id_of(1)); });
  REQUIRE_FALSE(id.ok());
  CHECK_THAT(id.error().message(), Catch::Contains("group 3") && Catch::Contains("rank 0"));
  auto outsider = share_unique_id(ch, g, 4, [] { return Result<UniqueId>(id_of(1)); });
  REQUIRE_FALSE(outsider.ok());
  CHECK_THAT(outsider.error().message(), Catch::Contains("not a member"));
  FakeChannel root(m, 0);
  auto bad = share_unique_id(root, g, 0, [] { return Result<UniqueId>(make_error("no NIC")); });
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("no NIC"));
}

TEST_CASE("bootstrap tags stay inside MPI's guaranteed tag range") {
  CHECK(bootstrap_tag(Group{5, {0}}) == 5);
  CHECK(bootstrap_tag(Group{-1, {0}}) >= 0);
  CHECK(bootstrap_tag(Group{1 << 20, {0}}) <= 32767);
}
