// `meshtrain generate` end to end: a tiny model trained to memorise a short
// string reproduces it greedily; a seed fixes sampled text; top-k 1 is
// greedy; the context stops generation and says so; the tokenizer a model
// was trained with decodes its text; bad inputs are refused by name.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/data/image_dataset.h"
#include "tests/run_meshtrain.h"
#include "tests/train/train_files.h"
#include "tests/training/idx_files.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) { return meshtrain::testing::train_scratch("generate-test", name); }

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

const std::string kPhrase = "the quick brown fox jumps over the lazy dog. ";

// A byte-level `tiny` trained on the phrase over and over, once per test process.
const fs::path& memorised() {
  static const fs::path dir = [] {
    const fs::path root = scratch("memorise");
    std::string text;
    for (int i = 0; i < 300; ++i) text += kPhrase;
    write(root / "phrase.txt", text);
    const MeshtrainRun r = run_meshtrain("train --model tiny --data " + (root / "phrase.txt").string() +
                                         " --steps 150 --micro-batch 8 --seq-len 64 --lr 3e-3 --warmup 10 --quiet "
                                         "--checkpoint " + (root / "ckpt").string());
    INFO(r.out);
    REQUIRE(r.status == 0);
    return root / "ckpt";
  }();
  return dir;
}

nlohmann::json generate_json(const std::string& args) {
  const MeshtrainRun r = run_meshtrain("generate --checkpoint " + memorised().string() + " --json " + args);
  INFO(r.out);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

std::string refusal(const std::string& args) {
  const MeshtrainRun r = run_meshtrain("generate " + args);
  INFO(r.out);
  CHECK(r.status != 0);
  return r.out;
}

}  // namespace

TEST_CASE("generate from a memorised byte-level model", "[generate][cli]") {
  SECTION("greedy generation reproduces a memorised string") {
    const MeshtrainRun r = run_meshtrain("generate --checkpoint " + memorised().string() +
                                         " --prompt 'the quick' --temperature 0 --max-new-tokens 50");
    INFO(r.out);
    REQUIRE(r.status == 0);
    const std::string want = "the quick" + (kPhrase + kPhrase).substr(9, 50);
    CHECK_THAT(r.out, Catch::StartsWith(want + "\n"));
    CHECK_THAT(r.out, Catch::Contains("9 prompt tokens, 50 new") && Catch::Contains("--max-new-tokens 50"));
  }
  SECTION("sampling: a seed fixes the text, top-k 1 is greedy") {
    const std::string hot = "--prompt 'the lazy' --temperature 3 --max-new-tokens 30";
    const nlohmann::json a = generate_json(hot + " --seed 7"), b = generate_json(hot + " --seed 7");
    CHECK(a["tokens"] == b["tokens"]);
    CHECK(a["text"] == b["text"]);
    CHECK(a["new_tokens"] == 30);
    CHECK(a["stop"] == "max_new_tokens");
    // A temperature of 3 flattens the distribution: another seed draws another text.
    CHECK(generate_json(hot + " --seed 8")["tokens"] != a["tokens"]);
    const nlohmann::json greedy = generate_json("--prompt 'over the' --temperature 0 --max-new-tokens 20");
    const nlohmann::json top1 = generate_json("--prompt 'over the' --temperature 2 --top-k 1 --seed 3 --max-new-tokens 20");
    CHECK(top1["tokens"] == greedy["tokens"]);
    CHECK(greedy["text"] == (kPhrase + kPhrase).substr(kPhrase.find("over the") + 8, 20));
  }
  SECTION("generation stops at the model's context and says so") {
    // tiny's context is 64 tokens: a prompt of 10 leaves room for 54.
    const nlohmann::json j = generate_json("--prompt 'the quick ' --temperature 0 --max-new-tokens 1000");
    CHECK(j["prompt_tokens"] == 10);
    CHECK(j["new_tokens"] == 54);
    CHECK(j["stop"] == "context");
    const MeshtrainRun r = run_meshtrain("generate --checkpoint " + memorised().string() +
                                         " --prompt 'the quick ' --temperature 0 --max-new-tokens 1000");
    CHECK_THAT(r.out, Catch::Contains("stopped at the model's context of 64 tokens"));
  }
  SECTION("a prompt file is read whole") {
    const fs::path p = scratch("prompt") / "prompt.txt";
    write(p, "the quick brown\n");
    const nlohmann::json j = generate_json("--prompt-file " + p.string() + " --temperature 0 --max-new-tokens 5");
    CHECK(j["prompt_tokens"] == 16);
  }
  SECTION("bad inputs are refused with the problem named") {
    const std::string ckpt = " --checkpoint " + memorised().string();
    CHECK_THAT(refusal("--checkpoint /nonexistent/ckpt --prompt hi"), Catch::Contains("does not exist"));
    const fs::path empty = scratch("empty-dir");
    CHECK_THAT(refusal("--checkpoint " + empty.string() + " --prompt hi"), Catch::Contains("holds no checkpoint"));
    CHECK_THAT(refusal(ckpt + " --prompt ''"), Catch::Contains("the prompt is empty"));
    CHECK_THAT(refusal(ckpt), Catch::Contains("the prompt is empty"));
    CHECK_THAT(refusal(ckpt + " --prompt '" + std::string(64, 'a') + "'"),
               Catch::Contains("the prompt is 64 tokens and the model's context is 64") &&
                   Catch::Contains("at most 63"));
    CHECK_THAT(refusal(ckpt + " --prompt hi --top-p 0"), Catch::Contains("--top-p"));
    CHECK_THAT(refusal(ckpt + " --prompt hi --top-p 1.5"), Catch::Contains("--top-p"));
    CHECK_THAT(refusal(ckpt + " --prompt hi --temperature -1"), Catch::Contains("--temperature"));
    CHECK_THAT(refusal(ckpt + " --prompt hi --max-new-tokens 0"), Catch::Contains("--max-new-tokens"));
    CHECK_THAT(refusal(ckpt + " --prompt hi --backend tpu"), Catch::Contains("--backend") && Catch::Contains("cpu"));
    const fs::path p = scratch("both") / "p.txt";
    write(p, "x");
    CHECK_THAT(refusal(ckpt + " --prompt hi --prompt-file " + p.string()), Catch::Contains("not both"));
    CHECK_THAT(refusal(ckpt + " --prompt-file " + (p.parent_path() / "missing.txt").string()),
               Catch::Contains("prompt file"));
  }
  SECTION("cuda is asked for by name") {
    const MeshtrainRun r = run_meshtrain("generate --checkpoint " + memorised().string() +
                                         " --prompt 'the quick' --temperature 0 --max-new-tokens 10 --backend cuda");
    INFO(r.out);
    // Where no device (or no CUDA build) is there, the reason is given; where one is, it generates the same text.
    if (r.status == 0) CHECK_THAT(r.out, Catch::StartsWith("the quick" + kPhrase.substr(9, 10)));
    else CHECK_THAT(r.out, Catch::Contains("CUDA"));
  }
}

TEST_CASE("a vision checkpoint is refused: it is not a text decoder", "[generate][cli]") {
  const fs::path data = scratch("images");
  std::string pixels(16 * 64, '\x40'), labels;
  for (int i = 0; i < 16; ++i) labels.push_back(static_cast<char>(i % 10));
  using meshtrain::testing::idx_bytes;
  for (const char* prefix : {"train", "t10k"}) {
    write(data / (std::string(prefix) + "-images-idx3-ubyte"),
          idx_bytes(meshtrain::kIdxImagesMagic, {16, 8, 8}, pixels));
    write(data / (std::string(prefix) + "-labels-idx1-ubyte"), idx_bytes(meshtrain::kIdxLabelsMagic, {16}, labels));
  }
  const fs::path ckpt = scratch("vit-ckpt");
  fs::remove_all(ckpt);
  const MeshtrainRun trained = run_meshtrain("train --model vit-tiny --data " + data.string() +
                                             " --steps 1 --micro-batch 4 --lr 1e-3 --quiet --checkpoint " +
                                             ckpt.string());
  INFO(trained.out);
  REQUIRE(trained.status == 0);
  CHECK_THAT(refusal("--checkpoint " + ckpt.string() + " --prompt hi"),
             Catch::Contains("vit-tiny") && Catch::Contains("not a text decoder"));
}

TEST_CASE("a model trained with a tokenizer generates text decoded by it", "[generate][cli]") {
  const fs::path root = scratch("sentencepiece");
  std::string corpus;
  for (int i = 0; i < 200; ++i) corpus += "the quick brown fox jumps over the lazy dog.\n";
  write(root / "corpus.txt", corpus);
  const std::string prefix = (root / "fox").string();
  for (const std::string& args :
       {"tokenize train --input " + (root / "corpus.txt").string() + " --model-prefix " + prefix +
            " --vocab-size 40 --type bpe",
        "tokenize encode --model " + prefix + ".model --input " + (root / "corpus.txt").string() + " --out " +
            (root / "corpus.bin").string()}) {
    const MeshtrainRun r = run_meshtrain(args);
    INFO(r.out);
    REQUIRE(r.status == 0);
  }
  write(root / "model.json", R"({"layers": 2, "hidden": 64, "heads": 4, "vocab": 40, "seq_len": 48})");
  const MeshtrainRun trained = run_meshtrain(
      "train --model " + (root / "model.json").string() + " --data " + (root / "corpus.bin").string() +
      " --tokenizer " + prefix + ".model --steps 150 --micro-batch 8 --seq-len 48 --lr 3e-3 --quiet --checkpoint " +
      (root / "ckpt").string());
  INFO(trained.out);
  REQUIRE(trained.status == 0);
  const MeshtrainRun r = run_meshtrain("generate --checkpoint " + (root / "ckpt").string() +
                                       " --prompt 'the quick' --temperature 0 --max-new-tokens 30 --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  // The continuation keeps its first space ("▁brown"), and the text is words, not ids or bytes.
  CHECK_THAT(j["text"].get<std::string>(), Catch::StartsWith(" brown fox jumps over the lazy dog."));
  CHECK_THAT(j["tokenizer"].get<std::string>(), Catch::EndsWith(".model"));
  // Streamed piece by piece, the printed text is the same.
  const MeshtrainRun streamed = run_meshtrain("generate --checkpoint " + (root / "ckpt").string() +
                                              " --prompt 'the quick' --temperature 0 --max-new-tokens 30");
  INFO(streamed.out);
  REQUIRE(streamed.status == 0);
  CHECK_THAT(streamed.out, Catch::StartsWith("the quick" + j["text"].get<std::string>() + "\n"));
}
