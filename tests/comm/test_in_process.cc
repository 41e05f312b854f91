// The in-process ("threads") communicator: every collective against a
// single-threaded reference, bit for bit, plus timeouts and poisoning.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>

#include "backends/cpu/comm/in_process.h"
#include "tests/comm/reference.h"

using namespace meshtrain;
using meshtrain::testing::bit_difference;
using meshtrain::testing::contributions;
using meshtrain::testing::fold;
using Clock = std::chrono::steady_clock;

namespace {

Group world_group(int world) {
  Group g{0, std::vector<int>(static_cast<std::size_t>(world))};
  std::iota(g.ranks.begin(), g.ranks.end(), 0);
  return g;
}

std::int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Element counts per (sender, receiver) of the uneven all-to-all, zeros included.
std::int64_t a2a_count(int from, int to) { return (from + 2 * to) % 4; }

}  // namespace

TEST_CASE("fp32 sums of the test inputs depend on the order", "[comm]") {
  // Guards the determinism tests below: were these inputs order-insensitive,
  // matching the ascending-order reference would prove nothing.
  std::vector<std::vector<float>> in;
  for (int r = 0; r < 3; ++r) in.push_back(contributions(r, 64));
  CHECK(bit_difference(fold(in, {0, 1, 2}, ReduceOp::sum), fold(in, {2, 1, 0}, ReduceOp::sum)) != "");
}

TEST_CASE("collectives match the ascending-order reference bit for bit", "[comm]") {
  std::printf("seed %llu\n", static_cast<unsigned long long>(meshtrain::testing::kSeed));
  for (int world : {1, 2, 3, 4, 8}) {
    // n below the group size leaves some reduction blocks empty; 5003 spans
    // several tiles with uneven blocks.
    for (std::size_t n : {std::size_t{2}, std::size_t{5003}}) {
      CAPTURE(world, n);
      const Group g = world_group(world);
      const auto W = static_cast<std::size_t>(world);
      std::vector<std::vector<float>> in(W), ar_sum(W), ar_max(W), rs_sum(W), rs_max(W), ag(W),
          bc(W), a2a(W);
      std::vector<std::vector<float>> rs_in(W), a2a_in(W);
      for (int r = 0; r < world; ++r) {
        in[static_cast<std::size_t>(r)] = contributions(r, n);
        rs_in[static_cast<std::size_t>(r)] = contributions(r, n * W, 1);
      }
      Status st = run_ranks(world, [&](int r, Communicator& c) -> Status {
        const auto R = static_cast<std::size_t>(r);
        ar_sum[R] = in[R];
        MT_TRY(c.all_reduce(ar_sum[R], g, ReduceOp::sum));
        ar_max[R] = in[R];
        MT_TRY(c.all_reduce(ar_max[R], g, ReduceOp::max));
        rs_sum[R].resize(n);
        MT_TRY(c.reduce_scatter(rs_in[R], rs_sum[R], g, ReduceOp::sum));
        rs_max[R].resize(n);
        MT_TRY(c.reduce_scatter(rs_in[R], rs_max[R], g, ReduceOp::max));
        ag[R].resize(n * W);
        MT_TRY(c.all_gather(in[R], ag[R], g));
        bc[R] = in[R];
        MT_TRY(c.broadcast(bc[R], g, world - 1));
        std::vector<std::int64_t> sc(W), rc(W);
        for (int k = 0; k < world; ++k) {
          sc[static_cast<std::size_t>(k)] = a2a_count(r, k);
          rc[static_cast<std::size_t>(k)] = a2a_count(k, r);
        }
        std::vector<float> send(static_cast<std::size_t>(std::accumulate(sc.begin(), sc.end(), 0ll)));
        for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
        a2a[R].resize(static_cast<std::size_t>(std::accumulate(rc.begin(), rc.end(), 0ll)));
        MT_TRY(c.all_to_all(send, sc, a2a[R], rc, g));
        return c.barrier(g);
      });
      REQUIRE(st.ok());

      std::vector<int> order(W);
      std::iota(order.begin(), order.end(), 0);
      const auto sum = fold(in, order, ReduceOp::sum), max = fold(in, order, ReduceOp::max);
      const auto rs_sum_ref = fold(rs_in, order, ReduceOp::sum);
      const auto rs_max_ref = fold(rs_in, order, ReduceOp::max);
      std::vector<float> gathered;
      for (auto& v : in) gathered.insert(gathered.end(), v.begin(), v.end());
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        const auto R = static_cast<std::size_t>(r);
        CHECK(bit_difference(ar_sum[R], sum) == "");
        CHECK(bit_difference(ar_max[R], max) == "");
        std::vector<float> block_sum(rs_sum_ref.begin() + static_cast<std::ptrdiff_t>(R * n),
                                     rs_sum_ref.begin() + static_cast<std::ptrdiff_t>((R + 1) * n));
        std::vector<float> block_max(rs_max_ref.begin() + static_cast<std::ptrdiff_t>(R * n),
                                     rs_max_ref.begin() + static_cast<std::ptrdiff_t>((R + 1) * n));
        CHECK(bit_difference(rs_sum[R], block_sum) == "");
        CHECK(bit_difference(rs_max[R], block_max) == "");
        CHECK(bit_difference(ag[R], gathered) == "");
        CHECK(bit_difference(bc[R], in[W - 1]) == "");
        // Block from sender k: its elements addressed to r, numbered from
        // k's offset for r.
        std::vector<float> expect;
        for (int k = 0; k < world; ++k) {
          std::int64_t offset = 0;
          for (int j = 0; j < r; ++j) offset += a2a_count(k, j);
          for (std::int64_t e = 0; e < a2a_count(k, r); ++e)
            expect.push_back(static_cast<float>(k * 1000 + static_cast<int>(offset + e)));
        }
        CHECK(bit_difference(a2a[R], expect) == "");
      }
    }
  }
}

TEST_CASE("sub-groups run concurrently and independently", "[comm]") {
  const Group odd{1, {1, 3}}, even{2, {0, 2}}, all = world_group(4);
  std::vector<std::vector<float>> in(4), out(4), total(4);
  for (int r = 0; r < 4; ++r) in[static_cast<std::size_t>(r)] = contributions(r, 300);
  Status st = run_ranks(4, [&](int r, Communicator& c) -> Status {
    const auto R = static_cast<std::size_t>(r);
    const Group& mine = r % 2 ? odd : even;
    out[R] = in[R];
    // Many rounds, so the two pairs interleave in the hub.
    for (int round = 0; round < 50; ++round) MT_TRY(c.all_reduce(out[R], mine, ReduceOp::max));
    total[R] = in[R];
    return c.all_reduce(total[R], all, ReduceOp::sum);
  });
  REQUIRE(st.ok());
  const auto odd_max = fold(in, {1, 3}, ReduceOp::max), even_max = fold(in, {0, 2}, ReduceOp::max);
  const auto sum = fold(in, {0, 1, 2, 3}, ReduceOp::sum);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(bit_difference(out[r], r % 2 ? odd_max : even_max) == "");
    CHECK(bit_difference(total[r], sum) == "");
  }
}

TEST_CASE("send and recv pair by source, destination and tag, in order", "[comm]") {
  std::vector<float> got(6, -1.f);
  Status st = run_ranks(3, [&](int r, Communicator& c) -> Status {
    // Every rank sends to its right neighbour before receiving from its left:
    // this completes only because sends are buffered.
    std::vector<float> ring{static_cast<float>(r)}, from_left(1);
    MT_TRY(c.send(ring, (r + 1) % 3, 9));
    MT_TRY(c.recv(from_left, (r + 2) % 3, 9));
    if (from_left[0] != static_cast<float>((r + 2) % 3)) return make_error("ring got {}", from_left[0]);
    if (r == 0) {
      MT_TRY(c.send(std::vector<float>{1.f}, 1, 5));
      MT_TRY(c.send(std::vector<float>{2.f, 2.5f}, 1, 5));
      MT_TRY(c.send(std::vector<float>{3.f}, 1, 7));
    } else if (r == 2) {
      MT_TRY(c.send(std::vector<float>{4.f}, 1, 5));
    } else if (r == 1) {
      // Tag 7 first although it was sent last; tag 5 from rank 2 before rank 0's.
      MT_TRY(c.recv(std::span<float>(got).subspan(0, 1), 0, 7));
      MT_TRY(c.recv(std::span<float>(got).subspan(1, 1), 2, 5));
      MT_TRY(c.recv(std::span<float>(got).subspan(2, 1), 0, 5));
      MT_TRY(c.recv(std::span<float>(got).subspan(3, 2), 0, 5));
    }
    return ok_status();
  });
  REQUIRE(st.ok());
  CHECK(got == std::vector<float>{3.f, 4.f, 1.f, 2.f, 2.5f, -1.f});
}

TEST_CASE("a recv of the wrong size fails on the receiver", "[comm]") {
  Status st = run_ranks(2, [&](int r, Communicator& c) -> Status {
    std::vector<float> buf(r == 0 ? 3 : 2);
    return r == 0 ? c.send(buf, 1, 0) : c.recv(buf, 0, 0);
  });
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.error().message(), Catch::Contains("rank 1: recv from rank 0 (tag 0): message has 3 elements but the buffer holds 2"));
}

TEST_CASE("a rank that skips a collective times out the others, naming it", "[comm]") {
  CommOptions opt;
  opt.timeout = std::chrono::milliseconds(200);
  std::vector<std::string> errors(3);
  std::vector<std::int64_t> elapsed(3, -1);
  const auto start = Clock::now();
  Status st = run_ranks(
      3,
      [&](int r, Communicator& c) -> Status {
        const auto R = static_cast<std::size_t>(r);
        std::vector<float> x(16, 1.f);
        Status s;
        if (r == 2) {
          // Stays alive past the others' timeout without joining, then finds
          // the communicator poisoned.
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          auto t = Clock::now();
          s = c.barrier(world_group(3));
          elapsed[R] = ms_since(t);
        } else {
          s = c.all_reduce(x, world_group(3), ReduceOp::sum);
          elapsed[R] = ms_since(start);
        }
        if (!s.ok()) errors[R] = s.error().message();
        return s;
      },
      opt);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.error().message(), Catch::Contains("all_reduce on group 0 (ranks [0, 1, 2])") &&
                                       Catch::Contains("timed out after 200 ms; still waiting for rank 2"));
  for (int r : {0, 1}) {
    CAPTURE(r, errors[static_cast<std::size_t>(r)]);
    CHECK_THAT(errors[static_cast<std::size_t>(r)], Catch::Contains("still waiting for rank 2"));
    // Not before the timeout; after it, load on the machine may delay the
    // thread, so the upper bound only rules out waiting on for rank 2 (20 s).
    CHECK(elapsed[static_cast<std::size_t>(r)] >= 190);
    CHECK(elapsed[static_cast<std::size_t>(r)] < 10000);
  }
  CHECK_THAT(errors[2], Catch::Contains("rank 2: barrier on group 0") && Catch::Contains("poisoned") &&
                            Catch::Contains("still waiting for rank 2"));
  CHECK(elapsed[2] < 10000);  // "poisoned": it failed on the others' timeout, not on a wait of its own
}

TEST_CASE("a rank that returns early fails its waiting peers at once", "[comm]") {
  CommOptions opt;
  opt.timeout = std::chrono::seconds(20);
  const auto start = Clock::now();
  Status st = run_ranks(
      3,
      [&](int r, Communicator& c) -> Status {
        std::vector<float> x(4, 1.f);
        if (r == 1) return ok_status();
        if (r == 2) return c.recv(x, 1, 3);
        return c.all_reduce(x, world_group(3), ReduceOp::sum);
      },
      opt);
  REQUIRE_FALSE(st.ok());
  CHECK(ms_since(start) < 5000);
  CHECK_THAT(st.error().message(), Catch::Contains("rank 1 returned without"));
}

TEST_CASE("a failing rank poisons the hub and wakes every waiting rank", "[comm]") {
  CommOptions opt;
  opt.timeout = std::chrono::seconds(20);
  std::vector<std::string> errors(4);
  const auto start = Clock::now();
  Status st = run_ranks(
      4,
      [&](int r, Communicator& c) -> Status {
        if (r == 3) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return make_error("rank 3: model diverged");
        }
        std::vector<float> x(4);
        Status s = r == 0 ? c.recv(x, 3, 1) : c.barrier(world_group(4));
        if (!s.ok()) errors[static_cast<std::size_t>(r)] = s.error().message();
        return s;
      },
      opt);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message() == "rank 3: model diverged");
  CHECK(ms_since(start) < 5000);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK_THAT(errors[static_cast<std::size_t>(r)],
               Catch::Contains("another rank failed: rank 3: model diverged"));
  }
}

TEST_CASE("members that disagree on a collective fail instead of corrupting data", "[comm]") {
  Status mixed = run_ranks(2, [&](int r, Communicator& c) -> Status {
    std::vector<float> x(8, 1.f);
    return r == 0 ? c.all_reduce(x, world_group(2), ReduceOp::sum) : c.broadcast(x, world_group(2), 0);
  });
  REQUIRE_FALSE(mixed.ok());
  CHECK_THAT(mixed.error().message(),
             Catch::Contains("members disagree: rank 0 called all_reduce but rank 1 called broadcast"));

  Status counts = run_ranks(2, [&](int r, Communicator& c) -> Status {
    std::vector<float> in(2), out(2);
    std::vector<std::int64_t> sc{1, 1}, rc = r == 0 ? std::vector<std::int64_t>{1, 1}
                                                     : std::vector<std::int64_t>{2, 0};
    return c.all_to_all(in, sc, out, rc, world_group(2));
  });
  REQUIRE_FALSE(counts.ok());
  CHECK_THAT(counts.error().message(),
             Catch::Contains("rank 0 sends 1 elements to rank 1, which expects 2"));

  Status outsider = run_ranks(3, [&](int r, Communicator& c) -> Status {
    return r == 0 ? c.barrier(Group{5, {1, 2}}) : ok_status();
  });
  REQUIRE_FALSE(outsider.ok());
  CHECK_THAT(outsider.error().message(),
             Catch::Contains("barrier on group 5 (ranks [1, 2]): called by rank 0, which is not a member"));

  Status reused = run_ranks(3, [&](int r, Communicator& c) -> Status {
    if (r == 2) return ok_status();
    MT_TRY(c.barrier(Group{4, {0, 1}}));
    return r == 0 ? c.barrier(Group{4, {0, 1, 2}}) : ok_status();
  });
  REQUIRE_FALSE(reused.ok());
  CHECK_THAT(reused.error().message(), Catch::Contains("group id 4 is already used for group 4 (ranks [0, 1])"));
}

TEST_CASE("all_reduce bandwidth, 4 ranks x 16 MB", "[.][bench]") {
  const std::size_t n = 4u << 20;  // 16 MB of fp32
  const int iters = 20;
  std::vector<std::vector<float>> data(4);
  for (int r = 0; r < 4; ++r) data[static_cast<std::size_t>(r)] = contributions(r, n);
  const auto expect = fold(data, {0, 1, 2, 3}, ReduceOp::max);
  double seconds = 0;
  Status st = run_ranks(4, [&](int r, Communicator& c) -> Status {
    auto& x = data[static_cast<std::size_t>(r)];
    MT_TRY(c.all_reduce(x, world_group(4), ReduceOp::max));  // warm-up; max is idempotent
    auto t = Clock::now();
    for (int i = 0; i < iters; ++i) MT_TRY(c.all_reduce(x, world_group(4), ReduceOp::max));
    if (r == 0) seconds = std::chrono::duration<double>(Clock::now() - t).count() / iters;
    return ok_status();
  });
  REQUIRE(st.ok());
  for (auto& x : data) REQUIRE(bit_difference(x, expect) == "");
  const double bytes = static_cast<double>(n * sizeof(float));
  std::printf("all_reduce 4 ranks x 16 MB: %.2f ms, algbw %.2f GB/s, busbw %.2f GB/s\n",
              seconds * 1e3, bytes / seconds / 1e9, bytes / seconds / 1e9 * 2 * 3 / 4);
}

TEST_CASE("each rank counts the bytes it sends, collective by collective", "[comm][bytes]") {
  // The counts of communicator.h, derived here from the direct algorithm: a 3-rank group, n = 10.
  constexpr int kRanks = 3;
  std::vector<std::vector<std::int64_t>> counts(kRanks);
  const Status s = run_ranks(kRanks, [&](int r, Communicator& c) -> Status {
    const Group g = world_group(kRanks);
    auto& mine = counts[static_cast<std::size_t>(r)];
    auto step = [&](Status st) -> Status {
      mine.push_back(c.bytes_sent() - std::accumulate(mine.begin(), mine.end(), std::int64_t{0}));
      return st;
    };
    std::vector<float> x(10, 1.f), in(30, 1.f), out(10), gathered(30);
    MT_TRY(step(c.all_reduce(x, g, ReduceOp::sum)));
    MT_TRY(step(c.reduce_scatter(in, out, g, ReduceOp::sum)));
    MT_TRY(step(c.all_gather(x, gathered, g)));
    MT_TRY(step(c.broadcast(x, g, 1)));
    const std::vector<std::int64_t> sc{1, 2, 3}, rc{r + 1, r + 1, r + 1};
    std::vector<float> send(6, 1.f), recv(static_cast<std::size_t>(3 * (r + 1)));
    MT_TRY(step(c.all_to_all(send, sc, recv, rc, g)));
    if (r == 0) MT_TRY(c.send(x, 2, 7));
    if (r == 2) MT_TRY(c.recv(x, 0, 7));
    MT_TRY(step(ok_status()));
    return ok_status();
  });
  REQUIRE(s.ok());
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    // all_reduce of 10 over 3: blocks 10·j/3 = [0, 3), [3, 6), [6, 10): the others' blocks, then its own twice.
    const std::int64_t own = r == 2 ? 4 : 3;
    const std::vector<std::int64_t> expected{4 * (10 - own + 2 * own), 4 * 2 * 10, 4 * 2 * 10, r == 1 ? 4 * 2 * 10 : 0,
                                             4 * (6 - (r + 1)), r == 0 ? 4 * 10 : 0};
    CHECK(counts[static_cast<std::size_t>(r)] == expected);
  }
}
