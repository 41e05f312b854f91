// Pipeline schedules as data: builders against hand-derived Megatron
// schedules, the communication pass, the invariants, the dry run, the timing
// model against its closed forms, and the text form.
#include "engine/schedule/schedule.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/schedule/builders.h"
#include "engine/schedule/communication.h"
#include "engine/schedule/dry_run.h"
#include "engine/schedule/timing.h"
#include "engine/schedule/validate.h"
#include "tests/schedule/schedule_testing.h"

using namespace meshtrain;
using namespace meshtrain::schedule;

namespace {

// (kind letter, chunk, microbatch) of a rank's compute actions in order.
using Step = std::tuple<char, int, int>;
std::vector<Step> steps(const Schedule& s, int rank) {
  std::vector<Step> out;
  for (const Action& a : s.ranks[static_cast<size_t>(rank)])
    out.emplace_back(a.kind == Action::forward ? 'F' : 'B', a.chunk, a.microbatch);
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("GPipe p=4 m=8 matches the hand-drawn schedule") {
  // All forwards in order, then all backwards in order, on every rank.
  const std::string expected =
      "rank 0: F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7\n"
      "rank 1: F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7\n"
      "rank 2: F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7\n"
      "rank 3: F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7\n";
  CHECK(format_schedule(must(build_gpipe({4, 1, 8}))) == expected);
}

TEST_CASE("1F1B p=4 m=8 matches Megatron's non-interleaved schedule") {
  // Rank r warms up with p-r-1 = 3,2,1,0 forwards, alternates F/B for the
  // remaining 5,6,7,8 microbatches, then drains 3,2,1,0 backwards.
  const std::string expected =
      "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
      "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
      "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
      "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n";
  CHECK(format_schedule(must(build_1f1b({4, 1, 8}))) == expected);
}

TEST_CASE("communication pass on 1F1B p=2 m=2") {
  // Rank 0 (first stage) receives no activations and sends no gradients;
  // rank 1 (last stage) the converse. Receives sit right before their
  // compute, sends right after; columns pad to the widest cell.
  const std::string expected =
      "rank 0: F0  SA0 F1 SA1 RG0 B0 RG1 B1\n"
      "rank 1: RA0 F0  B0 SG0 RA1 F1 B1  SG1\n";
  Schedule s = must(insert_communication(must(build_1f1b({2, 1, 2}))));
  CHECK(format_schedule(s) == expected);
  require_ok(check_invariants(s));
  require_ok(dry_run(s));

  SECTION("rejects a schedule that already communicates") {
    auto again = insert_communication(s);
    REQUIRE_FALSE(again.ok());
    CHECK(contains(again.error().message(), "0SA0"));
  }
}

TEST_CASE("interleaved p=2 v=2 m=4 follows Megatron's chunk order") {
  // Forward k: chunk (k mod 4)/2, microbatch (k/4)·2 + k mod 2; backward k the
  // same microbatch on the other chunk first. Warm-up: rank 0 (2-0-1)·2 + 2 = 4,
  // rank 1 0 + 2 = 2; total forwards m·v = 8.
  Schedule s = must(build_interleaved_1f1b({2, 2, 4}));
  const std::vector<Step> rank0 = {
      {'F', 0, 0}, {'F', 0, 1}, {'F', 1, 0}, {'F', 1, 1},  // warm-up
      {'F', 0, 2}, {'B', 1, 0}, {'F', 0, 3}, {'B', 1, 1},  // steady
      {'F', 1, 2}, {'B', 0, 0}, {'F', 1, 3}, {'B', 0, 1},  //
      {'B', 1, 2}, {'B', 1, 3}, {'B', 0, 2}, {'B', 0, 3},  // cool-down
  };
  const std::vector<Step> rank1 = {
      {'F', 0, 0}, {'F', 0, 1},                            // warm-up
      {'F', 1, 0}, {'B', 1, 0}, {'F', 1, 1}, {'B', 1, 1},  // steady
      {'F', 0, 2}, {'B', 0, 0}, {'F', 0, 3}, {'B', 0, 1},  //
      {'F', 1, 2}, {'B', 1, 2}, {'F', 1, 3}, {'B', 1, 3},  //
      {'B', 0, 2}, {'B', 0, 3},                            // cool-down
  };
  CHECK(steps(s, 0) == rank0);
  CHECK(steps(s, 1) == rank1);
  // Rank 0 chunk 0 holds microbatches 0..3 before its first chunk-0 backward.
  InFlight in_flight = peak_in_flight(s);
  CHECK(in_flight.per_rank == std::vector<int>{5, 3});
  CHECK(in_flight.per_chunk[0] == std::vector<int>{4, 2});
  CHECK(format_schedule(s) ==
        "rank 0: F0 F1 F0.1 F1.1 F2   B0.1 F3 B1.1 F2.1 B0 F3.1 B1   B2.1 B3.1 B2 B3\n"
        "rank 1: F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0   F3   B1 F2.1 B2.1 F3.1 B3.1 B2 B3\n");
}

TEST_CASE("interleaved p=4 v=2 m=8 follows Megatron's chunk order") {
  // Groups of p = 4 microbatches per chunk: forwards k = 0..15 run chunk
  // 0,0,0,0,1,1,1,1 over microbatches 0-3 then 4-7; backwards run chunk 1
  // first. Warm-up (3-r)·2 + 4 = 10, 8, 6, 4.
  Schedule s = must(build_interleaved_1f1b({4, 2, 8}));
  const std::vector<Step> rank0 = {
      {'F', 0, 0}, {'F', 0, 1}, {'F', 0, 2}, {'F', 0, 3}, {'F', 1, 0},  // warm-up 10
      {'F', 1, 1}, {'F', 1, 2}, {'F', 1, 3}, {'F', 0, 4}, {'F', 0, 5},  //
      {'F', 0, 6}, {'B', 1, 0}, {'F', 0, 7}, {'B', 1, 1},               // steady 6
      {'F', 1, 4}, {'B', 1, 2}, {'F', 1, 5}, {'B', 1, 3},               //
      {'F', 1, 6}, {'B', 0, 0}, {'F', 1, 7}, {'B', 0, 1},               //
      {'B', 0, 2}, {'B', 0, 3}, {'B', 1, 4}, {'B', 1, 5}, {'B', 1, 6},  // cool-down 10
      {'B', 1, 7}, {'B', 0, 4}, {'B', 0, 5}, {'B', 0, 6}, {'B', 0, 7},  //
  };
  const std::vector<Step> rank3 = {
      {'F', 0, 0}, {'F', 0, 1}, {'F', 0, 2}, {'F', 0, 3},  // warm-up 4
      {'F', 1, 0}, {'B', 1, 0}, {'F', 1, 1}, {'B', 1, 1},  // steady 12
      {'F', 1, 2}, {'B', 1, 2}, {'F', 1, 3}, {'B', 1, 3},  //
      {'F', 0, 4}, {'B', 0, 0}, {'F', 0, 5}, {'B', 0, 1},  //
      {'F', 0, 6}, {'B', 0, 2}, {'F', 0, 7}, {'B', 0, 3},  //
      {'F', 1, 4}, {'B', 1, 4}, {'F', 1, 5}, {'B', 1, 5},  //
      {'F', 1, 6}, {'B', 1, 6}, {'F', 1, 7}, {'B', 1, 7},  //
      {'B', 0, 4}, {'B', 0, 5}, {'B', 0, 6}, {'B', 0, 7},  // cool-down 4
  };
  CHECK(steps(s, 0) == rank0);
  CHECK(steps(s, 3) == rank3);
  // Peak = warm-up + 1 (the steady state's forward comes before its backward).
  CHECK(peak_in_flight(s).per_rank == std::vector<int>{11, 9, 7, 5});
}

TEST_CASE("peak in-flight microbatches: p-rank for 1F1B, m for GPipe") {
  CHECK(peak_in_flight(must(build_1f1b({4, 1, 8}))).per_rank == std::vector<int>{4, 3, 2, 1});
  CHECK(peak_in_flight(must(build_gpipe({4, 1, 8}))).per_rank == std::vector<int>{8, 8, 8, 8});
  // Fewer microbatches than stages: 1F1B cannot hold more than m.
  CHECK(peak_in_flight(must(build_1f1b({4, 1, 2}))).per_rank == std::vector<int>{2, 2, 2, 1});
}

TEST_CASE("every layout runs without deadlock and keeps the in-flight bound") {
  for (int p = 1; p <= 8; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m : {1, 2, p, p + 1, 2 * p, 3 * p}) {
        std::vector<ScheduleKind> kinds;
        if (v == 1)
          kinds = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b};
        else if (m % p == 0)
          kinds = {ScheduleKind::interleaved};
        for (ScheduleKind kind : kinds) {
          INFO("schedule " << schedule_kind_name(kind) << " p=" << p << " v=" << v << " m=" << m);
          Schedule compute = must(build_schedule(kind, {p, v, m}));
          Schedule full = must(insert_communication(compute));
          require_ok(check_invariants(full));
          require_ok(dry_run(full));
          InFlight in_flight = peak_in_flight(full);
          for (int r = 0; r < p; ++r) {
            int bound = m;  // GPipe
            if (kind == ScheduleKind::one_f_one_b) bound = std::min(p - r, m);
            if (kind == ScheduleKind::interleaved)
              bound = m == p ? m * v : std::min((p - r - 1) * 2 + (v - 1) * p + 1, m * v);
            CHECK(in_flight.per_rank[static_cast<size_t>(r)] == bound);
          }
        }
      }
    }
  }
}

TEST_CASE("one rank with several chunks hands data over in memory") {
  Schedule s = must(build_interleaved_1f1b({1, 3, 2}));
  CHECK(must(insert_communication(s)) == s);
  require_ok(check_invariants(s));
  require_ok(dry_run(s));
  s.ranks[0].insert(s.ranks[0].begin() + 1, Action{Action::send_act, 0, 0, 0});
  Status st = check_invariants(s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message() ==
        "0SA0 on a single-rank pipeline: its chunks share the rank and exchange data in memory");
}

TEST_CASE("peers follow the virtual stage order across the ring of ranks") {
  const PipelineLayout layout{4, 2, 8};
  // Rank 3 chunk 0 is virtual stage 3; its activation goes to stage 4 = rank 0
  // chunk 1, and that stage's gradient comes back from rank 1 chunk 1.
  const Action send{Action::send_act, 3, 0, 5};
  CHECK(peer_rank(layout, send) == 0);
  CHECK(matching_action(layout, send) == Action{Action::recv_act, 0, 1, 5});
  const Action recv_grad{Action::recv_grad, 0, 1, 5};
  CHECK(peer_rank(layout, recv_grad) == 1);
  CHECK(matching_action(layout, recv_grad) == Action{Action::send_grad, 1, 1, 5});
  CHECK(matching_action(layout, Action{Action::send_grad, 0, 1, 2}) ==
        Action{Action::recv_grad, 3, 0, 2});
}

TEST_CASE("a swapped send and receive deadlocks and the error shows the grid") {
  // 1F1B p=2 m=1: rank 0 F0 SA0 RG0 B0, rank 1 RA0 F0 B0 SG0. Swapping SA0
  // and RG0 makes rank 0 wait for a gradient of a forward it never sent on.
  Schedule s = must(insert_communication(must(build_1f1b({2, 1, 1}))));
  auto& row = s.ranks[0];
  REQUIRE(format_cell(row[1]) == "SA0");
  REQUIRE(format_cell(row[2]) == "RG0");
  std::swap(row[1], row[2]);
  // The static invariants only see order within a row; the cycle needs the run.
  require_ok(check_invariants(s));
  Status st = dry_run(s);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message() ==
        "pipeline deadlock at step 1: rank 0 waits at RG0 for 1SG0, rank 1 waits at RA0 for "
        "0SA0\n"
        "step:   0  stuck\n"
        "rank 0: F0 [RG0]\n"
        "rank 1: .  [RA0]\n");
}

TEST_CASE("a deadlock in a larger schedule marks every stuck rank") {
  // 1F1B p=4 m=8 with rank 0's SA2 swapped with its RG0. Rank 1 needs
  // microbatch 2 before its first backward, so the gradient rank 0 waits for
  // never comes; ranks 2 and 3 run on until they too need microbatch 2.
  // Stepped by hand: a send is visible to its receiver from the next step.
  Schedule s = must(insert_communication(must(build_1f1b({4, 1, 8}))));
  auto& row = s.ranks[0];
  auto sa2 = std::find(row.begin(), row.end(), Action{Action::send_act, 0, 0, 2});
  auto rg0 = std::find(row.begin(), row.end(), Action{Action::recv_grad, 0, 0, 0});
  REQUIRE(sa2 != row.end());
  REQUIRE(rg0 != row.end());
  std::iter_swap(sa2, rg0);
  require_ok(check_invariants(s));
  Status st = dry_run(s);
  REQUIRE_FALSE(st.ok());
  const std::string& text = st.error().message();
  const std::string first_line =
      "pipeline deadlock at step 16: rank 0 waits at RG0 for 1SG0, rank 1 waits at RA2 for "
      "0SA2, rank 2 waits at RA2 for 1SA2, rank 3 waits at RA2 for 2SA2";
  REQUIRE(text.substr(0, text.find('\n')) == first_line);

  auto words = [](std::string line) {
    std::vector<std::string> out;
    size_t i = 0;
    while ((i = line.find_first_not_of(' ', i)) != std::string::npos) {
      size_t end = line.find(' ', i);
      out.push_back(line.substr(i, end - i));
      i = end;
    }
    return out;
  };
  std::vector<std::vector<std::string>> grid;
  size_t pos = text.find('\n') + 1;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    grid.push_back(words(text.substr(pos, end - pos)));
    pos = end + 1;
  }
  using W = std::vector<std::string>;
  const std::vector<W> expected = {
      {"step:", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14",
       "15", "stuck"},
      {"rank", "0:", "F0", "SA0", "F1", "SA1", "F2", ".", ".", ".", ".", ".", ".", ".", ".", ".",
       ".", ".", "[RG0]"},
      {"rank", "1:", ".", ".", "RA0", "F0", "SA0", "RA1", "F1", "SA1", ".", ".", ".", ".", ".", ".",
       ".", ".", "[RA2]"},
      {"rank", "2:", ".", ".", ".", ".", ".", "RA0", "F0", "SA0", "RA1", "F1", "SA1", ".", "RG0",
       "B0", "SG0", ".", "[RA2]"},
      {"rank", "3:", ".", ".", ".", ".", ".", ".", ".", ".", "RA0", "F0", "B0", "SG0", "RA1", "F1",
       "B1", "SG1", "[RA2]"},
  };
  CHECK(grid == expected);
}

TEST_CASE("dry run rejects compute that runs before its data") {
  SECTION("a forward with no receive") {
    Status st = dry_run(must(build_1f1b({2, 1, 2})));
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().message() ==
          "dry run step 0 rank 1: 1F0 runs before its input activation arrived");
  }
  SECTION("a send before its forward") {
    Schedule s = must(insert_communication(must(build_gpipe({2, 1, 1}))));
    std::swap(s.ranks[0][0], s.ranks[0][1]);  // SA0 F0
    Status st = dry_run(s);
    REQUIRE_FALSE(st.ok());
    CHECK(contains(st.error().message(), "0SA0 sends before 0F0 computed it"));
  }
  SECTION("a send issued twice") {
    Schedule s = must(insert_communication(must(build_gpipe({2, 1, 1}))));
    s.ranks[0].insert(s.ranks[0].begin() + 2, Action{Action::send_act, 0, 0, 0});
    Status st = dry_run(s);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().message() == "dry run step 2 rank 0: 0SA0 is sent twice");
  }
  SECTION("a send nobody receives") {
    Schedule s = must(parse_schedule({2, 1, 1}, "rank 0: F0 SA0\nrank 1:\n"));
    Status st = dry_run(s);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().message() == "dry run: 0SA0 was never received (no 1RA0)");
  }
}

TEST_CASE("invariant violations name the action") {
  Schedule good = must(insert_communication(must(build_1f1b({2, 1, 2}))));
  auto erase = [](Schedule s, int rank, Action a) {
    auto& row = s.ranks[static_cast<size_t>(rank)];
    row.erase(std::find(row.begin(), row.end(), a));
    return s;
  };
  auto message = [](const Schedule& s) {
    Status st = check_invariants(s);
    return st.ok() ? std::string("ok") : st.error().message();
  };
  CHECK(message(erase(good, 1, {Action::backward, 1, 0, 1})) == "1F1 has no backward 1B1");
  CHECK(message(erase(good, 1, {Action::recv_act, 1, 0, 0})) ==
        "1F0 needs 1RA0 before it (its input activation)");
  CHECK(message(erase(good, 0, {Action::send_act, 0, 0, 1})) ==
        "0F1 needs 0SA1 after it (the next stage's input)");
  CHECK(message(erase(good, 0, {Action::forward, 0, 0, 0})) == "0F0 never runs");
  Schedule twice = good;
  twice.ranks[1].push_back({Action::send_grad, 1, 0, 1});
  CHECK(message(twice) == "rank 1: 1SG1 appears twice");
  Schedule wrong_row = good;
  wrong_row.ranks[1].push_back({Action::forward, 0, 0, 0});
  CHECK(message(wrong_row) == "rank 1 holds 0F0, an action of rank 0");
  Schedule backward_first = must(build_gpipe({1, 1, 1}));
  std::swap(backward_first.ranks[0][0], backward_first.ranks[0][1]);
  CHECK(message(backward_first) == "0B0 comes before its forward 0F0");
}

TEST_CASE("bad layouts are errors that name the numbers and the fix") {
  auto message = [](Result<Schedule> r) {
    return r.ok() ? std::string("ok") : r.error().message();
  };
  CHECK(message(build_interleaved_1f1b({4, 2, 6})) ==
        "the interleaved schedule needs microbatches to be a multiple of stages, got "
        "microbatches=6 stages=4; use 4 or 8 microbatches");
  CHECK(message(build_interleaved_1f1b({4, 2, 3})) ==
        "the interleaved schedule needs microbatches to be a multiple of stages, got "
        "microbatches=3 stages=4; use 4 microbatches");
  CHECK(message(build_interleaved_1f1b({4, 1, 8})) ==
        "the interleaved schedule needs at least 2 model chunks per stage, got "
        "chunks_per_stage=1; set chunks_per_stage>=2 or use 1f1b");
  CHECK(message(build_1f1b({4, 2, 8})) ==
        "1F1B runs one model chunk per stage, got chunks_per_stage=2; use the interleaved "
        "schedule for virtual stages or set chunks_per_stage=1");
  CHECK(message(build_gpipe({0, 1, 8})) ==
        "pipeline layout needs positive sizes, got stages=0 chunks_per_stage=1 "
        "microbatches=8; set each to at least 1");
  CHECK(message(build_interleaved_1f1b({2, 2, -2})) ==
        "pipeline layout needs positive sizes, got stages=2 chunks_per_stage=2 "
        "microbatches=-2; set each to at least 1");
  CHECK(message(build_1f1b({2, 0, 2})).find("chunks_per_stage=0") != std::string::npos);
}

TEST_CASE("schedule kinds parse by their --schedule names") {
  for (ScheduleKind k :
       {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
    auto parsed = parse_schedule_kind(schedule_kind_name(k));
    REQUIRE(parsed.ok());
    CHECK(*parsed == k);
  }
  auto bad = parse_schedule_kind("gpip");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message() ==
        "unknown pipeline schedule 'gpip' (did you mean 'gpipe'? valid: gpipe, 1f1b, interleaved, zb-h1)");
}

TEST_CASE("actions print and parse back") {
  const std::vector<std::pair<Action, std::string>> cases = {
      {{Action::forward, 2, 0, 3}, "2F3"},        {{Action::backward, 1, 1, 3}, "1B3.1"},
      {{Action::send_act, 0, 1, 5}, "0SA5.1"},    {{Action::recv_act, 3, 0, 12}, "3RA12"},
      {{Action::send_grad, 10, 2, 0}, "10SG0.2"}, {{Action::recv_grad, 1, 0, 7}, "1RG7"},
  };
  for (const auto& [action, text] : cases) {
    CHECK(format_action(action) == text);
    auto parsed = parse_action(text);
    REQUIRE(parsed.ok());
    CHECK(*parsed == action);
  }
  auto error_of = [](const char* token) {
    auto r = parse_action(token);
    return r.ok() ? std::string("ok") : r.error().message();
  };
  CHECK(error_of("F3") == "action 'F3': expected a stage number first, as in '2F0'");
  CHECK(error_of("2X0") == "action '2X0': expected a kind F, B, W, SA, RA, SG or RG");
  CHECK(error_of("2S0") == "action '2S0': expected a kind F, B, W, SA, RA, SG or RG");
  CHECK(error_of("2F") == "action '2F': expected a microbatch number after the kind");
  CHECK(error_of("2F3.") == "action '2F3.': expected a chunk number after '.'");
  CHECK(error_of("2F3x") == "action '2F3x': unexpected 'x' at the end");
}

TEST_CASE("schedules print and parse back") {
  const std::vector<std::pair<ScheduleKind, PipelineLayout>> layouts = {
      {ScheduleKind::gpipe, {4, 1, 8}},
      {ScheduleKind::one_f_one_b, {3, 1, 5}},
      {ScheduleKind::interleaved, {4, 2, 8}},
      {ScheduleKind::interleaved, {2, 4, 12}},
  };
  for (const auto& [kind, layout] : layouts) {
    for (bool with_comm : {false, true}) {
      Schedule s = must(build_schedule(kind, layout));
      if (with_comm) s = must(insert_communication(s));
      auto back = parse_schedule(layout, format_schedule(s));
      REQUIRE(back.ok());
      CHECK(*back == s);
    }
  }
  // Ten or more ranks widen the label; the grid still reads back.
  Schedule wide = must(insert_communication(must(build_1f1b({11, 1, 11}))));
  auto back = parse_schedule(wide.layout, format_schedule(wide));
  REQUIRE(back.ok());
  CHECK(*back == wide);
}

TEST_CASE("schedule parse errors name the line and token") {
  auto error_of = [](PipelineLayout layout, const char* text) {
    auto r = parse_schedule(layout, text);
    return r.ok() ? std::string("ok") : r.error().message();
  };
  CHECK(error_of({2, 1, 2}, "rank 0: F0 B0\nrank 1: F0 Q0\n") ==
        "schedule line 2: action 'Q0': expected a kind F, B, W, SA, RA, SG or RG");
  CHECK(error_of({2, 1, 2}, "rank 0: F0 F2\nrank 1: F0\n") ==
        "schedule line 1: action 'F2': microbatch 2 is outside the 2 microbatches");
  CHECK(error_of({2, 1, 2}, "rank 0: F0.1\nrank 1: F0\n") ==
        "schedule line 1: action 'F0.1': chunk 1 is outside the 1 chunks per stage");
  CHECK(error_of({2, 1, 2}, "rank 0: F0\n") == "schedule text has no line for rank 1 of 2");
  CHECK(error_of({2, 1, 2}, "rank 0: F0\nrank 0: F1\n") == "schedule line 2: rank 0 appears twice");
  CHECK(error_of({2, 1, 2}, "rank 2: F0\n") == "schedule line 1: rank 2 is outside the 2 stages");
  CHECK(error_of({2, 1, 2}, "r0 F0\n") ==
        "schedule line 1: expected 'rank R:' at the start, got 'r0 F0'");
}

TEST_CASE("simulated makespan equals the closed-form bubble") {
  // T = (m·v+p-1)·(f+b), bubble = (p-1)/(m·v+p-1); see timing.h.
  SECTION("the pp=4, 8-microbatch case, b = 2f") {
    for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
      auto t = simulate_timing(must(build_schedule(kind, {4, 1, 8})), 1.0, 2.0);
      REQUIRE(t.ok());
      CHECK(t->makespan == 33.0);  // (8+3)·3
      CHECK(t->busy == std::vector<double>(4, 24.0));
      CHECK(t->bubble_fraction == Approx(3.0 / 11.0).epsilon(1e-12));
    }
    auto t = simulate_timing(must(build_interleaved_1f1b({4, 2, 8})), 0.5, 1.0);
    REQUIRE(t.ok());
    CHECK(t->makespan == 28.5);  // (16+3)·1.5: the bubble shrinks by v
    CHECK(t->bubble_fraction == Approx(3.0 / 19.0).epsilon(1e-12));
  }
  SECTION("across layouts and backward/forward ratios") {
    for (int p = 1; p <= 8; ++p)
      for (int v = 1; v <= 4; ++v)
        for (int m = 1; m <= 40; ++m)
          for (double b : {0.25, 1.0, 2.0, 3.0}) {
            ScheduleKind kinds[2] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b};
            int n = 2;
            if (v > 1) {
              if (m % p != 0) continue;
              kinds[0] = ScheduleKind::interleaved;
              n = 1;
            }
            for (int k = 0; k < n; ++k) {
              PipelineLayout layout{p, v, m};
              INFO(schedule_kind_name(kinds[k])
                   << " p=" << p << " v=" << v << " m=" << m << " b=" << b);
              auto t = simulate_timing(must(build_schedule(kinds[k], layout)), 1.0, b);
              REQUIRE(t.ok());
              CHECK(t->makespan == Approx((m * v + p - 1) * (1.0 + b)).epsilon(1e-12));
              CHECK(t->bubble_fraction ==
                    Approx(bubble_fraction_formula(layout)).epsilon(1e-9).margin(1e-12));
            }
          }
  }
}

TEST_CASE("timing rejects what it cannot time") {
  auto comm = simulate_timing(must(insert_communication(must(build_1f1b({2, 1, 2})))), 1, 2);
  REQUIRE_FALSE(comm.ok());
  CHECK(comm.error().message() == "timing takes the compute schedule, got 0SA0");

  // Rank 0 puts its backward before its forward; rank 1 then waits for an
  // activation that never comes.
  Schedule cycle = must(parse_schedule({2, 1, 1}, "rank 0: B0 F0\nrank 1: F0 B0\n"));
  auto stuck = simulate_timing(cycle, 1, 2);
  REQUIRE_FALSE(stuck.ok());
  CHECK(stuck.error().message() ==
        "timing: these actions wait on work that never finishes: 0B0 1F0");

  auto bad = simulate_timing(must(build_gpipe({2, 1, 2})), 0, 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message() == "timing needs positive forward and backward times, got 0 and 2");
}

TEST_CASE("ZB-H1 p=4 m=8: 1F1B's order with rank r's W after the B r micro-batches on") {
  const std::string expected =
      "rank 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7\n"
      "rank 1: F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7\n"
      "rank 2: F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7\n"
      "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7\n";
  CHECK(format_schedule(must(build_zb_h1({4, 1, 8}))) == expected);
  CHECK(must(parse_schedule({4, 1, 8}, expected)) == must(build_zb_h1({4, 1, 8})));
}

TEST_CASE("ZB-H1 runs every layout without deadlock within 1F1B's memory") {
  for (int p = 1; p <= 8; ++p)
    for (int m : {1, 2, p, p + 1, 2 * p, 3 * p}) {
      INFO("p=" << p << " m=" << m);
      const Schedule full = must(insert_communication(must(build_zb_h1({p, 1, m}))));
      require_ok(check_invariants(full));
      require_ok(dry_run(full));
      // Micro-batches between their F and their W: within 1F1B's peak (rank 0's, between F and B).
      for (int r = 0; r < p; ++r) {
        int now = 0, peak = 0;
        for (const Action& a : full.ranks[static_cast<size_t>(r)]) {
          if (a.kind == Action::forward) peak = std::max(peak, ++now);
          if (a.kind == Action::weight) --now;
        }
        CHECK(peak <= std::min(p, m));
      }
    }
  // A W before its B, or a missing W, is named.
  Schedule bad = must(build_zb_h1({2, 1, 2}));
  auto& row = bad.ranks[0];
  std::swap(row[2], row[3]);  // rank 0: F0 F1 B0 W0 -> F0 F1 W0 B0
  const Status early = check_invariants(must(insert_communication(bad)));
  REQUIRE_FALSE(early.ok());
  CHECK(contains(early.error().message(), "comes before its backward"));
}

TEST_CASE("ZB-H1 shrinks 1F1B's bubble when W leaves the critical path") {
  // f = 1, B = 1, W = 1 against 1F1B's backward of 2: the same work per rank.
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 4 * p}) {
      INFO("p=" << p << " m=" << m);
      auto one = simulate_timing(must(build_1f1b({p, 1, m})), 1.0, 2.0);
      auto zb = simulate_timing(must(build_zb_h1({p, 1, m})), 1.0, 1.0, 1.0);
      REQUIRE(one.ok());
      REQUIRE(zb.ok());
      CHECK(zb->busy == one->busy);
      CHECK(zb->makespan < one->makespan);
      INFO("1f1b " << one->makespan << " zb-h1 " << zb->makespan);
      // ZB-H1's bubble (Qi et al. 2024): (p-1)(F+B-W) = (p-1)·1 against 1F1B's (p-1)(F+B+W) = 3(p-1).
      CHECK(zb->makespan == Approx(m * 3.0 + (p - 1) * 1.0));
    }
}
