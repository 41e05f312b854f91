// Issue 29, class 3: every field of every input file is checked at every
// depth. Before: unknown keys inside a calibration's gemm and collectives
// entries were ignored, an A100 calibration with backend cpu was accepted for
// the local cpu cluster, a missing model field read "must be positive, got 0",
// and a ViT's 65536² patches wrapped to "1 tokens".
#include "tests/reliability/cli.h"

using namespace meshtrain::testing;

namespace {

std::string calibration(const std::string& name, const std::string& body) {
  return "simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --calibration " +
         write_text(name, body);
}

std::string model(const std::string& name, const std::string& body) { return "info --model " + write_text(name, body); }

}  // namespace

TEST_CASE("a calibration's entries refuse unknown fields at every depth", "[reliability][fields]") {
  expect_refusal(calibration("g.json", R"({"version": 1, "gemm": [{"m": 4, "n": 4, "k": 4, "time_us": 1, "bogus": 1}]})"),
                 "gemm[0]: field 'bogus'");
  expect_refusal(calibration("c.json", R"({"version": 1, "collectives": [{"kind": "all_reduce", "members": 2,
                                           "bytes": 1024, "busbw_GBps": 1, "trnasport": "mpi"}]})"),
                 "collectives[0]: field 'trnasport'");
  expect_refusal(calibration("a.json", R"({"version": 1, "attention": [{"batch_heads": 1, "seq": 16, "head_dim": 16,
                                           "time_us": 5, "extra": 0}]})"),
                 "attention[0]: field 'extra'");
  expect_refusal(calibration("l.json", R"({"version": 1, "links": [{"kind": "nic", "GBps": 1, "p10_us": 3}]})"),
                 "links[0]: field 'p10_us'");
  expect_refusal(calibration("n.json", R"({"version": 1, "memory": [{"bytes": 1024, "time_us": -3}]})"),
                 "memory[0]: field 'time_us' is negative (-3)");
  expect_refusal(calibration("b.json", R"({"version": 1, "machine": {"backend": "tpu"}})"),
                 "field 'machine.backend' must be \"cpu\" or \"cuda\"");
  // A file whose device is an A100 but whose backend is cpu describes no machine.
  expect_refusal(calibration("x.json", R"({"version": 1, "device": "A100-SXM4-80GB", "machine": {"backend": "cpu"}})"),
                 "the calibration's machine.backend is \"cpu\", but its device 'A100-SXM4-80GB' is an accelerator");
  // What the calibrate command writes still reads back.
  const std::string ok = std::string(MESHTRAIN_SOURCE_DIR) + "/experiments/calibration/cpu-local-cpu-2026-12-02.json";
  CHECK(run_meshtrain("simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --calibration " + ok).status == 0);
}

TEST_CASE("a missing model field is named as missing", "[reliability][fields]") {
  expect_refusal(model("nolayers.json", R"({"hidden": 64, "heads": 4, "vocab": 256, "seq_len": 64})"),
                 "model field 'layers' is missing; a decoder model needs layers, hidden, heads, vocab and seq_len");
  expect_refusal(model("novocab.json", R"({"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64})"),
                 "model field 'vocab' is missing");
  expect_refusal(model("nopatch.json", R"({"family": "vit", "layers": 2, "hidden": 64, "heads": 4, "image_size": 28,
                                            "channels": 1, "classes": 10})"),
                 "model field 'patch' is missing; a vit model needs");
}

TEST_CASE("derived sizes are computed in 64 bits and named by the fields set", "[reliability][fields]") {
  // 65536² patches were 2^32 tokens, stored in an int as 0: "1 tokens".
  expect_refusal(model("vit-huge.json", R"({"family": "vit", "layers": 2, "hidden": 64, "heads": 4,
                                             "image_size": 65536, "patch": 1, "channels": 1, "classes": 10})"),
                 "model fields image_size 65536 and patch 1 make a 65536x65536 grid of patches: 4294967297 tokens, "
                 "more than the 16777216 a model may have");
  // 46341² wrapped negative and was reported as a seq_len the user never set.
  const MeshtrainRun r = run_meshtrain("info --model " + write_text("vit-wrap.json",
      R"({"family": "vit", "layers": 2, "hidden": 64, "heads": 4, "image_size": 46341, "patch": 1, "channels": 3,
          "classes": 10})"));
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("2147488282 tokens"));
  CHECK_THAT(r.out, !Catch::Contains("seq_len"));
  expect_refusal(model("patch.json", R"({"family": "vit", "layers": 2, "hidden": 64, "heads": 4, "image_size": 28,
                                          "patch": 56, "channels": 1, "classes": 10})"),
                 "model field 'patch' 56 is larger than image_size 28");
}
