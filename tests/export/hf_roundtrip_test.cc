// Hugging Face names and layouts (engine/export/hf_layout.h, hf_export.h):
// every parameter element mapped once, the layouts HF expects, export ->
// import -> export bit for bit (also through tp = 2 and pp = 2 engines), and
// files that do not fit the model refused with the tensor named.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/cpu_backend.h"
#include "engine/export/hf_export.h"
#include "engine/step/training_engine.h"
#include "models/parameters.h"
#include "tests/export/export_models.h"

using namespace meshtrain;
using testing::random_params;
using testing::tiny_gpt2;
using testing::tiny_llama;
using testing::tiny_mixtral;

namespace {

SafetensorsFile decode(const std::string& bytes) {
  auto f = decode_safetensors(bytes, "x.safetensors");
  REQUIRE(f.ok());
  return std::move(f).value();
}

const SafeTensor& find(const SafetensorsFile& f, const std::string& name) {
  for (const SafeTensor& t : f.tensors)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  throw;
}

float at(const SafeTensor& t, std::int64_t row, std::int64_t col) {
  return to_float32(t)[static_cast<std::size_t>(row * t.shape[1] + col)];
}

// The parameters a `plan` engine holds after importing `params`, gathered back by export_state.
ParamMap through_engine(const ModelSpec& m, const Plan& p, const ParamMap& params) {
  ParamMap out;
  const Status s = run_ranks(p.world_size(), [&](int rank, Communicator& comm) -> Status {
    CpuBackend b(comm);
    const std::unique_ptr<TrainingEngine> engine = make_engine(b, m, p, StepOptions{});
    MT_TRY(engine->import_state(initial_training_state(params)));
    MT_ASSIGN(auto state, engine->export_state());
    if (rank != 0) return ok_status();
    for (auto& [name, values] : state) {
      if (name.rfind("params/", 0) == 0) out.emplace(name.substr(7), std::move(values));
      else if (std::any_of(values.begin(), values.end(), [](float v) { return v != 0.f; }))
        return make_error("AdamW state '{}' is not zero after --init-from", name);
    }
    return ok_status();
  });
  REQUIRE(s.ok());
  return out;
}

Plan plan_of(int tp, int pp) {
  Plan p;
  p.tp = tp, p.pp = pp;
  p.micro_batch = 1, p.global_batch = 2, p.seq_len = 16;
  p.precision = Precision::fp32;
  return p;
}

std::string import_error(const ModelSpec& m, const SafetensorsFile& f) {
  auto r = from_hf_tensors(m, f, "x.safetensors");
  REQUIRE_FALSE(r.ok());
  return r.error().message();
}

}  // namespace

TEST_CASE("every element of every parameter has exactly one Hugging Face place", "[export]") {
  for (const ModelSpec& m : {tiny_gpt2(), tiny_llama(), tiny_mixtral()}) {
    INFO(m.name);
    const HfArch arch = *hf_arch(m);
    std::map<std::string, std::vector<int>> hits;
    for (const ParamInfo& p : parameter_table(m)) hits[p.name].assign(static_cast<std::size_t>(p.numel()), 0);
    std::set<std::string> names;
    for (const HfTensorMap& t : hf_tensor_maps(m, arch)) {
      CHECK(names.insert(t.hf_name).second);
      std::int64_t n = 1;
      for (std::int64_t d : t.hf_shape) n *= d;
      REQUIRE(n == t.numel());
      for (std::int64_t k = 0; k < t.numel(); ++k) ++hits.at(t.param)[static_cast<std::size_t>(t.source(k))];
    }
    for (const auto& [name, h] : hits) CHECK(std::all_of(h.begin(), h.end(), [](int c) { return c == 1; }));
  }
}

TEST_CASE("GPT-2 tensors keep Conv1D's (in, out) layout and the tied head is the embedding", "[export]") {
  const ModelSpec m = tiny_gpt2();
  const ParamMap params = random_params(m, 1);
  const SafetensorsFile f = decode(*encode_hf_safetensors(m, params, SafeDType::f32));
  CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  const SafeTensor& qkv = find(f, "transformer.h.1.attn.c_attn.weight");
  CHECK(qkv.shape == std::vector<std::int64_t>{64, 192});
  CHECK(to_float32(qkv) == params.at("layers.1.attn.qkv.weight"));
  CHECK(find(f, "transformer.wpe.weight").shape == std::vector<std::int64_t>{16, 64});
  CHECK(find(f, "transformer.h.0.mlp.c_proj.weight").shape == std::vector<std::int64_t>{256, 64});
  CHECK(to_float32(find(f, "transformer.ln_f.bias")) == params.at("final_norm.bias"));
  for (const SafeTensor& t : f.tensors) CHECK(t.name != "lm_head.weight");
  CHECK(f.tensors.size() == 4 + 12 * 2);
}

TEST_CASE("Llama tensors are nn.Linear (out, in), split from the fused ones, q and k rows in rotate_half order",
          "[export]") {
  const ModelSpec m = tiny_llama();  // 4 heads, 2 kv heads, head dim 16, ffn 96
  const ParamMap params = random_params(m, 2);
  const SafetensorsFile f = decode(*encode_hf_safetensors(m, params, SafeDType::f32));
  const std::vector<float>& qkv = params.at("layers.0.attn.qkv.weight");  // (64, 64 + 32 + 32)
  auto w = [&](std::int64_t in, std::int64_t out) { return qkv[static_cast<std::size_t>(in * 128 + out)]; };
  const SafeTensor& q = find(f, "model.layers.0.self_attn.q_proj.weight");
  const SafeTensor& k = find(f, "model.layers.0.self_attn.k_proj.weight");
  const SafeTensor& v = find(f, "model.layers.0.self_attn.v_proj.weight");
  REQUIRE(q.shape == std::vector<std::int64_t>{64, 64});
  REQUIRE(k.shape == std::vector<std::int64_t>{32, 64});
  // HF row h·16 + half·8 + i is meshtrain column h·16 + 2i + half: head 2, i 3, second half -> column 39.
  CHECK(at(q, 2 * 16 + 8 + 3, 5) == w(5, 39));
  CHECK(at(q, 2 * 16 + 3, 5) == w(5, 38));
  CHECK(at(k, 16 + 8 + 7, 9) == w(9, 64 + 16 + 15));
  CHECK(at(v, 20, 9) == w(9, 96 + 20));  // v is not rotated
  const std::vector<float>& up = params.at("layers.1.mlp.up.weight");  // (64, [gate 96 | up 96])
  CHECK(at(find(f, "model.layers.1.mlp.gate_proj.weight"), 7, 3) == up[3 * 192 + 7]);
  CHECK(at(find(f, "model.layers.1.mlp.up_proj.weight"), 7, 3) == up[3 * 192 + 96 + 7]);
  CHECK(find(f, "model.layers.1.mlp.down_proj.weight").shape == std::vector<std::int64_t>{64, 96});
  CHECK(at(find(f, "lm_head.weight"), 200, 3) == params.at("head")[3 * 256 + 200]);
  CHECK(to_float32(find(f, "model.norm.weight")) == params.at("final_norm.weight"));
}

TEST_CASE("Mixtral experts are split per expert into w1 (gate), w3 (up) and w2, nn.Linear (out, in)", "[export]") {
  const ModelSpec m = tiny_mixtral();  // 4 experts of width 32 over hidden 64
  const ParamMap params = random_params(m, 6);
  const SafetensorsFile f = decode(*encode_hf_safetensors(m, params, SafeDType::f32));
  const std::vector<float>& up = params.at("layers.1.moe.up");      // (4, 64, [gate 32 | up 32])
  const std::vector<float>& down = params.at("layers.1.moe.down");  // (4, 32, 64)
  const std::string e2 = "model.layers.1.block_sparse_moe.experts.2.";
  CHECK(find(f, e2 + "w1.weight").shape == std::vector<std::int64_t>{32, 64});
  CHECK(at(find(f, e2 + "w1.weight"), 5, 7) == up[(2 * 64 + 7) * 64 + 5]);
  CHECK(at(find(f, e2 + "w3.weight"), 5, 7) == up[(2 * 64 + 7) * 64 + 32 + 5]);
  CHECK(at(find(f, e2 + "w2.weight"), 9, 4) == down[(2 * 32 + 4) * 64 + 9]);
  const SafeTensor& gate = find(f, "model.layers.1.block_sparse_moe.gate.weight");
  CHECK(gate.shape == std::vector<std::int64_t>{4, 64});
  CHECK(at(gate, 3, 10) == params.at("layers.1.moe.router")[10 * 4 + 3]);
  const nlohmann::json c = hf_config(m, HfArch::mixtral, SafeDType::f32);
  CHECK(c["model_type"] == "mixtral");
  CHECK(c["num_local_experts"] == 4);
  CHECK(c["num_experts_per_tok"] == 2);
  CHECK_FALSE(c.contains("mlp_bias"));
  CHECK(check_hf_config(c, m, "config.json").ok());
}

TEST_CASE("export -> import -> export is bit for bit, also through tp = 2 and pp = 2 engines", "[export]") {
  for (const ModelSpec& m : {tiny_gpt2(), tiny_llama(), tiny_mixtral()}) {
    for (SafeDType dtype : {SafeDType::f32, SafeDType::bf16}) {
      INFO(m.name << " " << safe_dtype_name(dtype));
      const ParamMap params = random_params(m, 3);
      const std::string bytes = *encode_hf_safetensors(m, params, dtype);
      auto back = from_hf_tensors(m, decode(bytes), "x");
      REQUIRE(back.ok());
      if (dtype == SafeDType::f32) CHECK(*back == params);
      CHECK(*encode_hf_safetensors(m, *back, dtype) == bytes);
    }
    const ParamMap params = random_params(m, 4);
    const std::string bytes = *encode_hf_safetensors(m, params, SafeDType::f32);
    const ParamMap imported = *from_hf_tensors(m, decode(bytes), "x");
    for (const Plan& p : {plan_of(2, 1), plan_of(1, 2)}) {
      INFO(m.name << " tp " << p.tp << " pp " << p.pp);
      const ParamMap gathered = through_engine(m, p, imported);
      CHECK(gathered == params);
      CHECK(*encode_hf_safetensors(m, gathered, SafeDType::f32) == bytes);
    }
  }
}

TEST_CASE("a file that does not fit the model is refused with the tensors named", "[export]") {
  const ModelSpec m = tiny_gpt2();
  const SafetensorsFile good = decode(*encode_hf_safetensors(m, random_params(m, 5), SafeDType::f32));
  REQUIRE(from_hf_tensors(m, good, "x").ok());

  SECTION("a missing tensor") {
    SafetensorsFile f = good;
    f.tensors.erase(f.tensors.begin() + 3);
    CHECK_THAT(import_error(m, f), Catch::Contains("missing tensors transformer.h.0.ln_1.bias"));
  }
  SECTION("a shape mismatch") {
    ModelSpec wider = m;
    wider.seq_len = 32;
    CHECK_THAT(import_error(wider, good),
               Catch::Contains("shapes differ: 'transformer.wpe.weight' is [16, 64], expected [32, 64]"));
  }
  SECTION("an unexpected tensor, and another architecture's file") {
    SafetensorsFile f = good;
    f.tensors.push_back({"transformer.h.2.ln_1.weight", SafeDType::f32, {64}, std::string(256, '\0')});
    CHECK_THAT(import_error(m, f), Catch::Contains("unexpected tensors transformer.h.2.ln_1.weight"));
    const std::string msg = import_error(tiny_llama(), good);
    CHECK_THAT(msg, Catch::Contains("missing tensors model.embed_tokens.weight"));
    CHECK_THAT(msg, Catch::Contains("unexpected tensors"));
  }
  SECTION("a non-finite weight") {
    SafetensorsFile f = good;
    SafeTensor& t = f.tensors[2];
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(t.bytes.data() + 4, &inf, 4);
    CHECK_THAT(import_error(m, f), Catch::Contains("tensor '" + t.name + "' holds inf at element 1"));
  }
  SECTION("a tied head that is not the embedding") {
    SafetensorsFile f = good;
    SafeTensor head = f.tensors[0];  // transformer.wte.weight
    head.name = "lm_head.weight";
    f.tensors.push_back(head);
    CHECK(from_hf_tensors(m, f, "x").ok());  // the same values: accepted, as transformers' own files
    f.tensors.back().bytes[0] ^= 1;
    CHECK_THAT(import_error(m, f), Catch::Contains("'lm_head.weight' differs from the token embedding"));
  }
  SECTION("the original GPT-2 file's names (no 'transformer.', mask buffers) are read") {
    SafetensorsFile f = good;
    for (SafeTensor& t : f.tensors) t.name = t.name.substr(std::strlen("transformer."));
    f.tensors.push_back({"h.0.attn.bias", SafeDType::f32, {1}, std::string(4, '\0')});
    CHECK(from_hf_tensors(m, f, "x").ok());
    f.tensors.push_back(good.tensors[0]);  // transformer.wte.weight, also there as wte.weight
    CHECK_THAT(import_error(m, f), Catch::Contains("holds tensor 'transformer.wte.weight' twice"));
  }
}

TEST_CASE("models without a Hugging Face layout are refused with the reason", "[export]") {
  auto why = [](const ModelSpec& m) {
    auto r = hf_arch(m);
    REQUIRE_FALSE(r.ok());
    return r.error().message();
  };
  CHECK_THAT(why(*model_preset("vit-tiny")), Catch::Contains("is a vit model"));
  CHECK_THAT(why(*model_preset("vqa-tiny")), Catch::Contains("is a vqa model"));
  CHECK_THAT(why(*model_preset("tiny-moe")), Catch::Contains("8 experts") && Catch::Contains("layers are GPT-2's"));
  ModelSpec shared = tiny_mixtral();
  shared.shared_experts = 1;
  CHECK_THAT(why(shared), Catch::Contains("1 shared experts"));
  CHECK(*hf_arch(*model_preset("mixtral-8x7b")) == HfArch::mixtral);
  ModelSpec mixed = tiny_gpt2();
  mixed.position = PositionKind::rope;
  CHECK_THAT(why(mixed), Catch::Contains("neither GPT-2") && Catch::Contains("positions rope"));
  ModelSpec gqa = tiny_gpt2();
  gqa.kv_heads = 2;
  CHECK_THAT(why(gqa), Catch::Contains("kv_heads 2"));
  CHECK(*hf_arch(*model_preset("gpt2-124m")) == HfArch::gpt2);
  CHECK(*hf_arch(*model_preset("llama3-8b")) == HfArch::llama);
}

TEST_CASE("config.json carries the HF keys, and one for another model is refused naming each key", "[export]") {
  const ModelSpec m = tiny_llama();
  const nlohmann::json c = hf_config(m, HfArch::llama, SafeDType::bf16);
  CHECK(c["architectures"] == nlohmann::json{"LlamaForCausalLM"});
  CHECK(c["num_key_value_heads"] == 2);
  CHECK(c["head_dim"] == 16);
  CHECK(c["rms_norm_eps"].get<double>() == 1e-5);
  CHECK(c["torch_dtype"] == "bfloat16");
  CHECK(check_hf_config(c, m, "config.json").ok());
  nlohmann::json other = c;
  other["num_hidden_layers"] = 3;
  other["rope_theta"] = 500000.0;
  other.erase("num_key_value_heads");  // transformers' default: as many as the heads (4)
  auto s = check_hf_config(other, m, "config.json");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("num_hidden_layers is 3, model 'tiny-llama' has 2"));
  CHECK_THAT(s.error().message(), Catch::Contains("rope_theta is 500000.0, model 'tiny-llama' has 10000.0"));
  CHECK_THAT(s.error().message(), Catch::Contains("num_key_value_heads is 4"));
  const ModelSpec g = *model_preset("gpt2-124m");
  const nlohmann::json gc = hf_config(g, HfArch::gpt2, SafeDType::f32);
  CHECK(gc["n_inner"].is_null());
  CHECK(gc["activation_function"] == "gelu_new");
  CHECK(gc["bos_token_id"] == 50256);
  CHECK(check_hf_config(gc, g, "config.json").ok());
  CHECK_FALSE(check_hf_config(gc, m, "config.json").ok());
}
