// `meshtrain export` and `train --init-from` as a user runs them: the files
// written, a run from exported weights that repeats the plain run bit for bit
// under tp and pp plans, and refusals that name the problem.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "core/input_file.h"
#include "models/model_chunk.h"
#include "tests/export/export_models.h"
#include "tests/run_meshtrain.h"
#include "tests/training/temp_dir.h"

using namespace meshtrain;
using testing::TempDir;

namespace {

std::string read(const std::string& path) { return testing::read_file(path); }

void write(const std::string& path, const std::string& bytes) { testing::write_file(path, bytes); }

// Bytes of text, the data every run here trains on.
std::string make_data(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox " + std::to_string(i * 7919 % 1000) + " jumps; ";
  write(dir / "data.txt", text);
  return dir / "data.txt";
}

// The losses of a --metrics file, in order.
std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::istringstream in(read(metrics));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// The parameters `train --seed seed` starts `m` from (ParameterStore::initialize).
ParamMap initial_params(const ModelSpec& m, std::uint64_t seed) {
  CpuBackend b;
  ModelChunk chunk(b, m, ChunkLayers{0, m.layers, true, true}, TensorParallel{Group{0, {0}}, 0, 1}, {});
  chunk.parameters().initialize(seed);
  ParamMap out;
  for (const ParamSlot& slot : chunk.parameters().slots()) {
    std::vector<float>& v = out[slot.info.name];
    v.resize(static_cast<std::size_t>(slot.numel));
    REQUIRE(b.read(slot.value, v).ok());
  }
  return out;
}

// A short run of `model` on `data`, with `extra` flags.
std::string train(const std::string& data, const std::string& extra, const std::string& model = "tiny", int steps = 3) {
  return "train --model " + model + " --steps " + std::to_string(steps) +
         " --micro-batch 2 --global-batch 4 --seq-len 32 --lr 3e-3 --seed 7 --quiet --data " + data + " " + extra;
}

}  // namespace

TEST_CASE("a run from exported initial weights repeats the plain run bit for bit, under tp and pp plans too",
          "[export][cli]") {
  TempDir dir;
  const std::string data = make_data(dir);
  const ModelSpec m = *model_preset("tiny");
  std::filesystem::create_directories(dir / "init");
  write(dir / "init/model.safetensors", *encode_hf_safetensors(m, initial_params(m, 7), SafeDType::f32));
  write(dir / "init/config.json", hf_config(m, HfArch::gpt2, SafeDType::f32).dump());
  for (const std::string plan : {"", "--tp 2", "--pp 2"}) {
    INFO("plan '" << plan << "'");
    const std::string base = train(data, plan);
    std::filesystem::remove(dir / "plain.jsonl");
    std::filesystem::remove(dir / "init.jsonl");
    const MeshtrainRun plain = run_meshtrain(base + " --metrics " + (dir / "plain.jsonl"));
    REQUIRE(plain.status == 0);
    const MeshtrainRun init = run_meshtrain(base + " --init-from " + (dir / "init/model.safetensors") + " --metrics " +
                                            (dir / "init.jsonl"));
    INFO(init.out);
    REQUIRE(init.status == 0);
    CHECK(losses(dir / "init.jsonl").size() == 3);
    CHECK(losses(dir / "init.jsonl") == losses(dir / "plain.jsonl"));
  }
}

TEST_CASE("export writes model.safetensors and config.json, fp32 or bf16, that train --init-from reads",
          "[export][cli]") {
  TempDir dir;
  const std::string data = make_data(dir);
  REQUIRE(run_meshtrain(train(data, "--checkpoint " + (dir / "ckpt"))).status == 0);
  const MeshtrainRun out =
      run_meshtrain("export --checkpoint " + (dir / "ckpt") + " --format safetensors --out " + (dir / "hf"));
  INFO(out.out);
  REQUIRE(out.status == 0);
  CHECK_THAT(out.out, Catch::Contains("model.safetensors") && Catch::Contains("config.json"));
  auto c = load_checkpoint_params(dir / "ckpt");
  REQUIRE(c.ok());
  CHECK(read(dir / "hf/model.safetensors") == *encode_hf_safetensors(c->model, c->params, SafeDType::f32));
  const auto config = nlohmann::json::parse(read(dir / "hf/config.json"));
  CHECK(config["model_type"] == "gpt2");
  CHECK(config["n_layer"] == 4);
  CHECK(config["torch_dtype"] == "float32");

  const std::string bf16 = "export --checkpoint " + (dir / "ckpt") + " --out " + (dir / "bf/w.safetensors");
  REQUIRE(run_meshtrain(bf16 + " --dtype bf16").status == 0);
  auto bf = decode_safetensors(read(dir / "bf/w.safetensors"), "w");
  REQUIRE(bf.ok());
  CHECK(bf->tensors[0].dtype == SafeDType::bf16);
  CHECK(nlohmann::json::parse(read(dir / "bf/config.json"))["torch_dtype"] == "bfloat16");

  // The export trains on, under another plan; its checkpoint exports again.
  const MeshtrainRun again = run_meshtrain(
      train(data, "--tp 2 --init-from " + (dir / "hf/model.safetensors") + " --checkpoint " + (dir / "ckpt2")));
  INFO(again.out);
  REQUIRE(again.status == 0);
  REQUIRE(run_meshtrain("export --checkpoint " + (dir / "ckpt2") + " --out " + (dir / "hf2")).status == 0);
  // A resumed checkpoint takes precedence over --init-from (whose file may be gone by then).
  const MeshtrainRun resumed = run_meshtrain(
      train(data, "--init-from " + (dir / "gone.safetensors") + " --checkpoint " + (dir / "ckpt") + " --resume",
            "tiny", 4));
  INFO(resumed.out);
  CHECK(resumed.status == 0);
}

TEST_CASE("export and --init-from refuse what does not fit, naming it", "[export][cli]") {
  TempDir dir;
  const std::string data = make_data(dir);
  REQUIRE(run_meshtrain(train(data, "--checkpoint " + (dir / "ckpt"))).status == 0);
  REQUIRE(run_meshtrain("export --checkpoint " + (dir / "ckpt") + " --out " + (dir / "hf")).status == 0);
  const std::string file = dir / "hf/model.safetensors";

  MeshtrainRun r = run_meshtrain("export --checkpoint " + (dir / "ckpt") + " --format onnx --out " + (dir / "x"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("--format") && Catch::Contains("onnx"));
  r = run_meshtrain("export --checkpoint " + (dir / "ckpt") + " --dtype fp16 --out " + (dir / "x"));
  CHECK_THAT(r.out, Catch::Contains("--dtype") && Catch::Contains("fp16"));
  r = run_meshtrain("export --checkpoint " + (dir / "ckpt") + " --out " + data);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("is a file; name a directory"));

  r = run_meshtrain(train(data, "--checkpoint " + (dir / "moe"), "tiny-moe"));
  REQUIRE(r.status == 0);
  r = run_meshtrain("export --checkpoint " + (dir / "moe") + " --out " + (dir / "x"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("8 experts but no Hugging Face layout") && Catch::Contains("layers are GPT-2's"));
  // Outputs pass the path guard: not into another run's checkpoint folder.
  r = run_meshtrain("export --checkpoint " + (dir / "ckpt") + " --out " + (dir / "moe/hf"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("--out") && Catch::Contains("lies inside the checkpoint folder"));

  // Another model than the file's: its config.json says so, key by key.
  r = run_meshtrain(train(data, "--init-from " + file, "gpt2-124m"));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("n_embd is 64, model 'gpt2-124m' has 768"));
  // Without config.json the tensors themselves are checked.
  std::filesystem::remove(dir / "hf/config.json");
  r = run_meshtrain(train(data, "--init-from " + file, "gpt2-124m"));
  CHECK_THAT(r.out, Catch::Contains("shapes differ: 'transformer.wte.weight' is [256, 64], expected [50257, 768]"));
  const std::string bytes = read(file);
  write(dir / "cut.safetensors", bytes.substr(0, bytes.size() - 100));
  r = run_meshtrain(train(data, "--init-from " + (dir / "cut.safetensors")));
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("--init-from") && Catch::Contains("tensor 'transformer.ln_f.bias'") &&
                        Catch::Contains("truncated"));
}
