// The optimizer settings as flags: AdamW's betas and epsilon, which
// parameters decay, and the schedule's shape reach the update, are recorded
// in the checkpoint manifest, and are kept (or refused when changed) on
// --resume. The update is checked against AdamW computed by hand from the
// checkpointed moments of two consecutive steps.
#include <cmath>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint.h"
#include "tests/run_meshtrain.h"

namespace fs = std::filesystem;
using namespace meshtrain;

namespace {

const std::string kTrain = std::string(" --model tiny --seq-len 32 --micro-batch 2 --data ") + MESHTRAIN_SOURCE_DIR +
                           "/README.md --quiet --steps 2";

Checkpoint load(const fs::path& dir) {
  Result<Checkpoint> c = load_checkpoint(dir.string());
  REQUIRE(c.ok());
  return std::move(c).value();
}

const std::vector<float>& values(const Checkpoint& c, const std::string& name) {
  const auto t = c.tensor(name);
  REQUIRE(t.ok());
  return (*t)->data;
}

// One element's AdamW step 2 from the step-1 and step-2 checkpoints: the
// gradient of each step follows from the first moments (m1 = (1-b1) g1,
// m2 = b1 m1 + (1-b1) g2), v2 must be b2 v1 + (1-b2) g2², and the parameter
// p2 = p1 (1 - lr wd) - lr m̂ / (sqrt(v̂) + eps) with the bias corrections of step 2.
void check_step(const Checkpoint& one, const Checkpoint& two, const std::string& name, std::size_t i, double b1,
                double b2, double eps, double lr, double wd) {
  INFO(name << "[" << i << "]");
  const double m1 = values(one, "adam_m/" + name)[i], v1 = values(one, "adam_v/" + name)[i];
  const double m2 = values(two, "adam_m/" + name)[i], v2 = values(two, "adam_v/" + name)[i];
  const double p1 = values(one, "params/" + name)[i], p2 = values(two, "params/" + name)[i];
  const double g1 = m1 / (1 - b1), g2 = (m2 - b1 * m1) / (1 - b1);
  REQUIRE(g1 != 0);
  CHECK(v1 == Approx((1 - b2) * g1 * g1).epsilon(1e-4));
  CHECK(v2 == Approx(b2 * v1 + (1 - b2) * g2 * g2).epsilon(1e-4));
  const double mhat = m2 / (1 - b1 * b1), vhat = v2 / (1 - b2 * b2);
  const double expected = p1 * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
  CHECK(p2 == Approx(expected).epsilon(1e-5).margin(1e-7));
  // The step moved the parameter by far more than the tolerance.
  CHECK(std::abs(p2 - p1) > 1e-5);
}

// Trains step 1 (stopping there), keeps that checkpoint, resumes to step 2.
std::pair<Checkpoint, Checkpoint> two_steps(const fs::path& dir, const std::string& flags) {
  fs::remove_all(dir);
  const std::string ckpt = " --checkpoint " + (dir / "ckpt").string();
  const MeshtrainRun first = run_meshtrain("train" + kTrain + flags + ckpt + " --stop-at 1");
  REQUIRE(first.status == 0);
  Checkpoint one = load(dir / "ckpt");
  const MeshtrainRun second = run_meshtrain("train" + kTrain + flags + ckpt + " --resume");
  INFO(second.out);
  REQUIRE(second.status == 0);
  return {std::move(one), load(dir / "ckpt")};
}

}  // namespace

TEST_CASE("non-default AdamW betas and epsilon give the hand-computed update", "[cli][optimizer]") {
  const fs::path dir = fs::temp_directory_path() / "meshtrain_cli_adamw";
  // A constant rate (no warm-up) of 0.01, an epsilon large enough to matter beside sqrt(v̂).
  const std::string flags =
      " --adam-beta1 0.8 --adam-beta2 0.9 --adam-eps 1e-3 --lr 0.01 --warmup 0 --lr-decay constant "
      "--weight-decay 0.5";
  auto [one, two] = two_steps(dir, flags);
  CHECK(one.meta.step == 1);
  CHECK(two.meta.step == 2);
  // A linear layer's weight decays; a norm's does not (--weight-decay-params linear, the default).
  check_step(one, two, "layers.0.attn.qkv.weight", 5, 0.8, 0.9, 1e-3, 0.01, 0.5);
  check_step(one, two, "layers.0.norm1.weight", 3, 0.8, 0.9, 1e-3, 0.01, 0.0);
  // The manifest records every setting.
  const nlohmann::json& run = two.meta.run;
  CHECK(run.at("adam_beta1").get<double>() == Approx(0.8));
  CHECK(run.at("adam_beta2").get<double>() == Approx(0.9));
  CHECK(run.at("adam_eps").get<double>() == Approx(1e-3));
  CHECK(run.at("weight_decay").get<double>() == Approx(0.5));
  CHECK(run.at("weight_decay_params") == "linear");
  CHECK(run.at("lr_decay") == "constant");
  CHECK(run.at("decay_steps") == 2);
  CHECK(run.at("warmup") == 0);
}

TEST_CASE("weight-decay-params all decays norms too, linear+embeddings the embeddings", "[cli][optimizer]") {
  const fs::path dir = fs::temp_directory_path() / "meshtrain_cli_decay_all";
  const std::string base = " --lr 0.01 --warmup 0 --lr-decay constant --weight-decay 0.5";
  {
    auto [one, two] = two_steps(dir, base + " --weight-decay-params all");
    check_step(one, two, "layers.0.norm1.weight", 3, 0.9, 0.95, 1e-8, 0.01, 0.5);
    check_step(one, two, "embed.tokens", 40, 0.9, 0.95, 1e-8, 0.01, 0.5);
    CHECK(two.meta.run.at("weight_decay_params") == "all");
  }
  {
    auto [one, two] = two_steps(dir, base + " --weight-decay-params linear+embeddings");
    check_step(one, two, "embed.tokens", 40, 0.9, 0.95, 1e-8, 0.01, 0.5);
    check_step(one, two, "layers.0.norm1.weight", 3, 0.9, 0.95, 1e-8, 0.01, 0.0);
  }
  {
    auto [one, two] = two_steps(dir, base);
    check_step(one, two, "embed.tokens", 40, 0.9, 0.95, 1e-8, 0.01, 0.0);
  }
}

TEST_CASE("resume keeps the checkpoint's AdamW settings and refuses other ones", "[cli][optimizer]") {
  const fs::path dir = fs::temp_directory_path() / "meshtrain_cli_resume_adamw";
  fs::remove_all(dir);
  const std::string ckpt = " --checkpoint " + (dir / "ckpt").string();
  REQUIRE(run_meshtrain("train" + kTrain + ckpt + " --stop-at 1 --adam-beta2 0.99 --weight-decay-params all").status ==
          0);
  const MeshtrainRun changed = run_meshtrain("train" + kTrain + ckpt + " --resume --adam-beta2 0.9");
  CHECK(changed.status != 0);
  CHECK_THAT(changed.out, Catch::Contains("was trained with --adam-beta2 0.99") &&
                              Catch::Contains("this run gives --adam-beta2 0.9") &&
                              Catch::Contains("resume without --adam-beta2"));
  // Without the flags, the run continues under the recorded values.
  const MeshtrainRun kept = run_meshtrain("train" + kTrain + ckpt + " --resume");
  INFO(kept.out);
  REQUIRE(kept.status == 0);
  const Checkpoint two = load(dir / "ckpt");
  CHECK(two.meta.step == 2);
  CHECK(two.meta.run.at("adam_beta2").get<double>() == Approx(0.99));
  CHECK(two.meta.run.at("weight_decay_params") == "all");
}

TEST_CASE("bad optimizer values are refused naming the flag", "[cli][optimizer]") {
  CHECK_THAT(run_meshtrain("train" + kTrain + " --adam-beta1 1").out, Catch::Contains("--adam-beta1"));
  CHECK_THAT(run_meshtrain("train" + kTrain + " --adam-eps 0").out, Catch::Contains("--adam-eps"));
  CHECK_THAT(run_meshtrain("train" + kTrain + " --weight-decay-params norms").out,
             Catch::Contains("unknown --weight-decay-params 'norms'") && Catch::Contains("linear+embeddings"));
  CHECK_THAT(run_meshtrain("train" + kTrain + " --lr-decay cosin").out, Catch::Contains("did you mean 'cosine'"));
  CHECK_THAT(run_meshtrain("train" + kTrain + " --warmup 0 --decay-steps 5").out,
             Catch::Contains("--decay-steps 5 must be between 0"));
}
