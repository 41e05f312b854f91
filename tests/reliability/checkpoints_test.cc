// A checkpoint directory: nothing checkpointed is ever lost or replaced
// unasked. A run refuses to overwrite a checkpoint (or someone's files),
// holds a lock that names it to a second run, cleans up after a failed write,
// and says so when --resume cannot mean what it says.
#include <sys/wait.h>

#include <iterator>

#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

namespace {

std::int64_t manifest_step(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in).at("step").get<std::int64_t>();
}

MeshtrainRun train(const std::string& flags) {
  const MeshtrainRun r = run_meshtrain(tiny_train() + " " + flags);
  INFO(r.out);
  return r;
}

}  // namespace

TEST_CASE("a checkpoint is replaced only when asked, and other files never", "[reliability][checkpoints]") {
  const fs::path dir = scratch("ckpt-overwrite");
  REQUIRE(train("--steps 3 --checkpoint " + dir.string()).status == 0);
  REQUIRE(manifest_step(dir) == 3);
  // Without --resume or --overwrite-checkpoint the checkpoint stays.
  expect_refusal(tiny_train() + " --steps 2 --checkpoint " + dir.string(),
                 "already holds a checkpoint (step 3); continue it with --resume, or replace it with --overwrite-checkpoint");
  CHECK(manifest_step(dir) == 3);
  REQUIRE(train("--steps 2 --overwrite-checkpoint --checkpoint " + dir.string()).status == 0);
  CHECK(manifest_step(dir) == 2);

  // A directory of someone else's files is not ours to write into.
  const fs::path other = scratch("not-a-checkpoint");
  fs::create_directories(other);
  std::ofstream(other / "payload-1.bin") << "someone's data";
  std::ofstream(other / "notes.txt") << "keep me";
  for (const char* mode : {"", " --resume", " --overwrite-checkpoint"})
    expect_refusal(tiny_train() + " --steps 2 --checkpoint " + other.string() + mode,
                   "is not empty and holds no meshtrain checkpoint (it has 'notes.txt')");
  CHECK(fs::exists(other / "payload-1.bin"));
  // ... nor is a manifest.json that is not a checkpoint's.
  fs::remove(other / "notes.txt");
  fs::remove(other / "payload-1.bin");
  std::ofstream(other / "manifest.json") << R"({"name": "a web app"})";
  expect_refusal(tiny_train() + " --steps 2 --overwrite-checkpoint --checkpoint " + other.string(),
                 "manifest.json' is not a meshtrain checkpoint manifest");
  CHECK(fs::file_size(other / "manifest.json") == 21);
  // A refused directory keeps nothing of the run's, not even its lock file.
  CHECK_FALSE(fs::exists(other / "meshtrain.lock"));

  // The run's own metrics file may lie in its checkpoint directory.
  const fs::path with_metrics = scratch("ckpt-with-metrics");
  fs::create_directories(with_metrics);
  CHECK(train("--steps 2 --checkpoint " + with_metrics.string() + " --metrics " + (with_metrics / "m.jsonl").string())
            .status == 0);
  CHECK(manifest_step(with_metrics) == 2);
}

TEST_CASE("a second run on a checkpoint directory is refused naming the first", "[reliability][checkpoints]") {
  const fs::path dir = scratch("ckpt-locked");
  auto held = meshtrain::claim_checkpoint_dir(dir.string(), meshtrain::CheckpointUse::fresh);
  REQUIRE(held.ok());
  expect_refusal(tiny_train() + " --steps 2 --checkpoint " + dir.string(),
                 "is in use by another meshtrain run (pid " + std::to_string(::getpid()) + " on host");
  held = meshtrain::Error("released");  // closing the lock's descriptor releases it
  CHECK(train("--steps 2 --checkpoint " + dir.string()).status == 0);
}

TEST_CASE("a failed write leaves no temporaries and loses nothing", "[reliability][checkpoints]") {
  const fs::path dir = scratch("ckpt-full-disk");
  REQUIRE(train("--steps 2 --checkpoint " + dir.string()).status == 0);
  // A disk that fills up: no file may grow past 64 KiB (the payload is ~1 MiB).
  // SIGXFSZ ignored, so the write fails with EFBIG instead of killing the process.
  const MeshtrainRun full = run_shell("trap '' XFSZ; ulimit -f 64; " + std::string(MESHTRAIN_BIN) + " " + tiny_train() +
                                      " --steps 4 --resume --checkpoint " + dir.string());
  INFO(full.out);
  CHECK(full.status == 1);
  CHECK_THAT(full.out, Catch::Contains("cannot write '" + dir.string()) && Catch::Contains("File too large") &&
                           Catch::Contains("the last checkpoint in '" + dir.string() + "' is of step 2"));
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().extension() != ".tmp");
  CHECK(manifest_step(dir) == 2);
  // Stale temporaries of a killed commit do not block the next run either.
  std::ofstream(dir / "payload-3-0.bin.tmp") << std::string(1000, 'x');
  std::ofstream(dir / "manifest.json.tmp") << "{\"format\"";
  REQUIRE(train("--steps 4 --resume --checkpoint " + dir.string()).status == 0);
  CHECK(manifest_step(dir) == 4);
  CHECK_FALSE(fs::exists(dir / "payload-3-0.bin.tmp"));
  CHECK_FALSE(fs::exists(dir / "manifest.json.tmp"));
}

TEST_CASE("resuming says when it cannot continue, and warns when it continues differently", "[reliability][checkpoints]") {
  const fs::path dir = scratch("ckpt-resume");
  REQUIRE(train("--steps 4 --stop-at 2 --checkpoint " + dir.string()).status == 0);
  // Other data: the loader's position would be meaningless.
  const std::string other_data = write_text("other.txt", std::string(20000, 'z'));
  expect_refusal(tiny_train(other_data) + " --steps 4 --resume --checkpoint " + dir.string(),
                 "was trained on --data \"" + training_text() + "\" (");
  // The same bytes under another name are the same data.
  const std::string moved = write_text("moved.txt", [] {
    std::ifstream in(training_text());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }());
  CHECK(run_meshtrain(tiny_train(moved) + " --steps 4 --stop-at 3 --resume --checkpoint " + dir.string()).status == 0);
  // --steps below the checkpoint: nothing could be done.
  expect_refusal(tiny_train() + " --steps 1 --resume --checkpoint " + dir.string(),
                 "the checkpoint in '" + dir.string() + "' is at step 3, beyond --steps 1");
  // Another learning rate is legitimate, and said.
  const MeshtrainRun lr = train("--steps 5 --lr 5e-4 --resume --checkpoint " + dir.string());
  CHECK(lr.status == 0);
  CHECK_THAT(lr.out, Catch::Contains("warning: resuming '" + dir.string() + "' at step 3 with steps 5 (was 4), lr 0.0005 (was 0.001)"));
  // A finished run resumed has nothing to do, and says so.
  const MeshtrainRun done = train("--steps 5 --lr 5e-4 --resume --checkpoint " + dir.string());
  CHECK(done.status == 0);
  CHECK_THAT(done.out, Catch::Contains("the run is complete and there is nothing to do"));

  // A missing manifest beside payloads is a damaged checkpoint, not a fresh start.
  fs::remove(dir / "manifest.json");
  expect_refusal(tiny_train() + " --steps 4 --resume --checkpoint " + dir.string(),
                 "holds checkpoint payloads (") ;
  // An empty directory with --resume is the first launch of a job script: said, then trained.
  const fs::path empty = scratch("ckpt-empty");
  const MeshtrainRun first = train("--steps 2 --resume --checkpoint " + empty.string());
  CHECK(first.status == 0);
  CHECK_THAT(first.out, Catch::Contains("warning: --resume: no checkpoint in '" + empty.string() + "' yet; starting from step 1"));
  CHECK(manifest_step(empty) == 2);
}
