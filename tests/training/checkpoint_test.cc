#include "engine/checkpoint/checkpoint.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "temp_dir.h"

using namespace meshtrain;
using meshtrain::testing::read_file;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_file;
namespace fs = std::filesystem;

namespace {
ModelSpec tiny() { return *model_preset("tiny"); }

// Values whose bits a lossy path would change: -0, denormals, the extremes.
// (NaN and ±Inf are refused by the writer: see "non-finite values" below.)
std::vector<float> tricky_values(float base) {
  return {base,
          -0.0f,
          std::numeric_limits<float>::denorm_min(),
          -std::bit_cast<float>(0x00401234u),
          std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::min()};
}

CheckpointWriter make_writer(std::int64_t step, float base) {
  CheckpointWriter w;
  w.set_model_and_plan(tiny(), Plan{});
  w.set_step(step);
  w.set_data_loader({.seed = 42, .draws = static_cast<std::uint64_t>(step) * 8});
  w.set_rng({{"seed", 7}, {"dropout_counter", step * 100}});
  REQUIRE(w.add_tensor("rank0/wte", {2, 3}, tricky_values(base)).ok());
  REQUIRE(w.add_tensor("rank0/adam_m/wte", {6}, tricky_values(base + 1)).ok());
  REQUIRE(w.add_tensor("rank0/empty", {0, 4}, {}).ok());
  REQUIRE(w.add_tensor("rank1/adam_v/wte", {3, 2}, tricky_values(base + 2)).ok());
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::string> payload_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("payload-")) out.push_back(name);
  }
  return out;
}

std::string payload_path(const TempDir& dir) {
  const auto files = payload_files(dir.path());
  REQUIRE(files.size() == 1);
  return dir / files[0];
}

std::string load_error(const std::string& dir) {
  auto c = load_checkpoint(dir);
  REQUIRE_FALSE(c.ok());
  return c.error().message();
}

void replace_once(std::string& text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
}

constexpr const char* kFix = "delete the directory or point --checkpoint elsewhere";
}  // namespace

TEST_CASE("a checkpoint round-trips every bit of tensors and metadata", "[checkpoint]") {
  TempDir dir;
  REQUIRE(make_writer(7, 0.5f).commit(dir.path().string()).ok());
  CHECK(has_checkpoint(dir.path().string()));

  auto c = load_checkpoint(dir.path().string());
  REQUIRE(c.ok());
  CHECK(c->meta.step == 7);
  CHECK(c->meta.data_loader == LoaderState{42, 56});
  CHECK(c->meta.rng == nlohmann::json{{"seed", 7}, {"dropout_counter", 700}});
  CHECK(c->meta.model == model_to_json(tiny()));
  CHECK(c->meta.plan == checkpoint_plan_json(tiny(), Plan{}));
  REQUIRE(c->tensors.size() == 4);
  CHECK(c->tensors.at("rank0/wte").shape == std::vector<std::int64_t>{2, 3});
  CHECK(same_bits(c->tensors.at("rank0/wte").data, tricky_values(0.5f)));
  CHECK(same_bits(c->tensors.at("rank0/adam_m/wte").data, tricky_values(1.5f)));
  CHECK(same_bits(c->tensors.at("rank1/adam_v/wte").data, tricky_values(2.5f)));
  CHECK(c->tensors.at("rank0/empty").data.empty());
  CHECK(check_compatible(*c, tiny(), Plan{}).ok());

  auto missing = c->tensor("rank0/nope");
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.error().message(), Catch::Contains("has no tensor 'rank0/nope'"));
  REQUIRE(c->tensor("rank0/wte").ok());
}

TEST_CASE("a new commit replaces the old one and removes its payload", "[checkpoint]") {
  TempDir dir;
  write_file(dir / "metrics.jsonl", "{}\n");  // not ours: must survive
  REQUIRE(make_writer(1, 0.5f).commit(dir.path().string()).ok());
  REQUIRE(make_writer(2, 9.0f).commit(dir.path().string()).ok());
  auto c = load_checkpoint(dir.path().string());
  REQUIRE(c.ok());
  CHECK(c->meta.step == 2);
  CHECK(same_bits(c->tensors.at("rank0/wte").data, tricky_values(9.0f)));
  CHECK(payload_files(dir.path()).size() == 1);
  CHECK(fs::exists(dir / "metrics.jsonl"));
  // The same step committed again must not overwrite the live payload in place.
  REQUIRE(make_writer(2, 3.0f).commit(dir.path().string()).ok());
  CHECK(same_bits(load_checkpoint(dir.path().string())->tensors.at("rank0/wte").data,
                  tricky_values(3.0f)));
}

TEST_CASE("a crash mid-commit leaves the previous checkpoint loadable", "[checkpoint]") {
  TempDir dir;
  REQUIRE(make_writer(1, 0.5f).commit(dir.path().string()).ok());
  // What a commit of step 2 killed at each point leaves behind: a half-written
  // payload temporary, a complete payload not yet named by any manifest, and a
  // half-written manifest temporary.
  write_file(dir / "payload-2-0.bin.tmp", "half a payl");
  write_file(dir / "payload-2-0.bin", std::string(96, 'x'));
  write_file(dir / "manifest.json.tmp", "{\"format\": \"meshtrain-chec");

  auto c = load_checkpoint(dir.path().string());
  REQUIRE(c.ok());
  CHECK(c->meta.step == 1);
  CHECK(same_bits(c->tensors.at("rank0/wte").data, tricky_values(0.5f)));

  // The next commit clears the leftovers first (on a full disk they would hold
  // the space it needs), then writes its own payload.
  REQUIRE(make_writer(2, 4.0f).commit(dir.path().string()).ok());
  CHECK(payload_files(dir.path()) == std::vector<std::string>{"payload-2-0.bin"});
  CHECK_FALSE(fs::exists(dir / "manifest.json.tmp"));
  CHECK(load_checkpoint(dir.path().string())->meta.step == 2);
}

TEST_CASE("a damaged checkpoint is refused naming the file and what is wrong", "[checkpoint]") {
  TempDir dir;
  REQUIRE(make_writer(7, 0.5f).commit(dir.path().string()).ok());
  const std::string payload = payload_path(dir);
  const std::string manifest = dir / "manifest.json";
  const std::string good_payload = read_file(payload);
  const std::string good_manifest = read_file(manifest);
  const auto bytes = good_payload.size();
  REQUIRE(bytes == 18 * sizeof(float));

  SECTION("truncated payload") {
    fs::resize_file(payload, bytes - 5);
    CHECK_THAT(load_error(dir.path().string()),
               Catch::Contains("payload '" + payload + "' is " + std::to_string(bytes - 5) +
                               " bytes, the manifest expects " + std::to_string(bytes)) &&
                   Catch::Contains(kFix));
  }
  SECTION("one flipped bit in the payload") {
    // Byte 13 lies in the first tensor, before the empty one: the checksum
    // must run across tensors of every size.
    std::string damaged = good_payload;
    damaged[13] ^= 0x10;
    write_file(payload, damaged);
    CHECK_THAT(load_error(dir.path().string()),
               Catch::Contains("payload '" + payload + "' is corrupted: crc32 expected 0x") &&
                   Catch::Contains(kFix));
  }
  SECTION("missing payload") {
    fs::remove(payload);
    CHECK_THAT(load_error(dir.path().string()),
               Catch::Contains("payload '" + payload + "' cannot be opened"));
  }
  SECTION("an edited manifest value") {
    std::string edited = good_manifest;
    replace_once(edited, "\"step\": 7", "\"step\": 8");
    write_file(manifest, edited);
    CHECK_THAT(load_error(dir.path().string()),
               Catch::Contains("manifest '" + manifest + "' is corrupted: crc32 expected 0x") &&
                   Catch::Contains(kFix));
  }
  SECTION("truncated manifest") {
    write_file(manifest, good_manifest.substr(0, good_manifest.size() / 2));
    CHECK_THAT(
        load_error(dir.path().string()),
        Catch::Contains("manifest '" + manifest + "' is not valid JSON") && Catch::Contains(kFix));
  }
  SECTION("missing manifest") {
    fs::remove(manifest);
    CHECK_FALSE(has_checkpoint(dir.path().string()));
    CHECK_THAT(load_error(dir.path().string()),
               Catch::Contains("'" + manifest + "' is missing") && Catch::Contains(kFix));
  }
  SECTION("no directory") {
    CHECK_THAT(load_error(dir / "elsewhere"), Catch::Contains("does not exist"));
  }
}

TEST_CASE("a checkpoint of another model or plan is refused naming each mismatch", "[checkpoint]") {
  TempDir dir;
  REQUIRE(make_writer(3, 0.5f).commit(dir.path().string()).ok());
  auto c = load_checkpoint(dir.path().string());
  REQUIRE(c.ok());

  ModelSpec wider = tiny();
  wider.hidden = 128;
  wider.name = "wider";  // the name alone would not matter
  auto s = check_compatible(*c, wider, Plan{});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(),
             Catch::Contains("checkpoint was written for hidden 64, this run has hidden 128") &&
                 !Catch::Contains("name"));

  Plan other;
  other.tp = 2;
  other.schedule = ScheduleKind::gpipe;
  auto p = check_compatible(*c, tiny(), other);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.error().message(),
             Catch::Contains("checkpoint was written for plan tp 1, this run has plan tp 2") &&
                 Catch::Contains("plan schedule " + schedule_name(ScheduleKind::one_f_one_b) +
                                 ", this run has plan schedule gpipe"));

  ModelSpec renamed = tiny();
  renamed.name = "my-tiny";
  CHECK(check_compatible(*c, renamed, Plan{}).ok());
  // seq_len 0 means the model's: the same as spelling it out.
  Plan spelled;
  spelled.seq_len = tiny().seq_len;
  CHECK(check_compatible(*c, tiny(), spelled).ok());
}

TEST_CASE("tensors the writer cannot describe are rejected when added", "[checkpoint]") {
  CheckpointWriter w;
  REQUIRE(w.add_tensor("a", {2}, {1, 2}).ok());
  CHECK_THAT(w.add_tensor("a", {1}, {1}).error().message(), Catch::Contains("'a' added twice"));
  CHECK_THAT(w.add_tensor("b", {2, 2}, {1, 2, 3}).error().message(),
             Catch::Contains("shape of 4 elements but 3 values"));
  CHECK_FALSE(w.add_tensor("c", {-1}, {}).ok());
}

TEST_CASE("an unusable checkpoint directory is reported before training", "[checkpoint]") {
  TempDir tmp;
  const std::string file = tmp / "a-file";
  write_file(file, "x");
  auto under_file = probe_checkpoint_dir(file + "/ckpt");
  REQUIRE_FALSE(under_file.ok());
  CHECK_THAT(under_file.error().message(),
             Catch::Contains("cannot create checkpoint directory '" + file + "/ckpt'") &&
                 Catch::Contains("--checkpoint"));
  CHECK_FALSE(probe_checkpoint_dir(file).ok());
  CHECK_FALSE(make_writer(1, 0.f).commit(file + "/ckpt").ok());

  const std::string nested = tmp / "runs/a/ckpt";
  REQUIRE(probe_checkpoint_dir(nested).ok());
  CHECK(fs::is_directory(nested));
  CHECK(fs::is_empty(nested));  // the probe file is gone
}

TEST_CASE("non-finite values are never checkpointed, the previous checkpoint stays", "[checkpoint]") {
  TempDir dir;
  REQUIRE(make_writer(1, 0.5f).commit(dir.path().string()).ok());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    CheckpointWriter w = make_writer(2, 0.5f);
    std::vector<float> poisoned = tricky_values(1.f);
    poisoned[3] = bad;
    REQUIRE(w.add_tensor("rank0/poisoned", {6}, poisoned).ok());
    auto s = w.commit(dir.path().string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message(), Catch::Contains("checkpoint tensor 'rank0/poisoned' holds") &&
                                        Catch::Contains("at element 3 of 6") &&
                                        Catch::Contains("the previous one in '" + dir.path().string() + "' stays the last"));
    auto c = load_checkpoint(dir.path().string());
    REQUIRE(c.ok());
    CHECK(c->meta.step == 1);
    CHECK(payload_files(dir.path()).size() == 1);
  }
}
