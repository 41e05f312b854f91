// Each picture is well-formed XML (parsed by python3's xml.dom.minidom where
// python3 exists, loudly not otherwise) and holds what it draws: a lane per
// rank and ops in it, a memory bar per rank, one chosen candidate, a loss
// curve with a point per metrics row; compare prints a row per plan.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/run_meshtrain.h"
#include "tests/training/temp_dir.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("meshtrain-pictures-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string contents(const fs::path& p) { return meshtrain::testing::read_file(p); }

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

void parses_as_xml(const fs::path& p) {
  if (std::system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") != 0) {
    WARN("SKIPPED the XML parse of " << p << ": no python3 here; the element checks still run");
    return;
  }
  const std::string cmd = "python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' " + p.string();
  CHECK(std::system(cmd.c_str()) == 0);
}

}  // namespace

TEST_CASE("simulate --svg: a lane per rank with its ops, a memory bar per rank", "[pictures]") {
  const fs::path svg = scratch("simulate.svg");
  const MeshtrainRun r = run_meshtrain("simulate --model gpt2-124m --gpus 8 --tp 2 --pp 2 --micro-batches 4 --svg " +
                                       svg.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  parses_as_xml(svg);
  const std::string text = contents(svg);
  CHECK(count(text, "class=\"lane\"") >= 2);  // the simulated representatives, one per stage at least
  CHECK(count(text, "class=\"op op-compute") > 0);
  CHECK(count(text, "class=\"mem mem-") > 0);
}

TEST_CASE("plan --svg marks one chosen candidate among the candidates", "[pictures]") {
  const fs::path svg = scratch("plan.svg");
  const MeshtrainRun r = run_meshtrain("plan --model gpt2-124m --gpus 8 --svg " + svg.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  parses_as_xml(svg);
  const std::string text = contents(svg);
  CHECK(count(text, "class=\"candidate chosen\"") == 1);
  CHECK(count(text, "class=\"candidate") > 1);
}

TEST_CASE("plot draws the loss curve with a point per row, and refuses a bad line by number", "[pictures]") {
  const fs::path metrics = scratch("metrics.jsonl"), svg = scratch("loss.svg");
  {
    std::ofstream out(metrics);
    for (int s = 1; s <= 25; ++s)
      out << nlohmann::json{{"step", s}, {"loss", 5.5 - 0.1 * s}, {"lr", 1e-3}}.dump() << "\n";
  }
  const MeshtrainRun r = run_meshtrain("plot " + metrics.string() + " --out " + svg.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  parses_as_xml(svg);
  const std::string text = contents(svg);
  const std::size_t at = text.find("class=\"curve curve-loss\"");
  REQUIRE(at != std::string::npos);
  const std::size_t from = text.find("points=\"", text.rfind('<', at)) + 8;
  const std::string points = text.substr(from, text.find('"', from) - from);
  CHECK(count(points, ",") == 25);  // x,y pairs
  std::ofstream(metrics, std::ios::app) << "not json\n";
  const MeshtrainRun bad = run_meshtrain("plot " + metrics.string() + " --out " + svg.string());
  CHECK(bad.status != 0);
  CHECK_THAT(bad.out, Catch::Contains("26"));
}

TEST_CASE("compare prints a row per plan file and names the fastest", "[pictures]") {
  const fs::path a = scratch("a.json"), b = scratch("b.json");
  std::ofstream(a) << R"({"tp": 2, "pp": 2, "dp": 2})";
  std::ofstream(b) << R"({"tp": 1, "pp": 1, "dp": 8})";
  const MeshtrainRun r = run_meshtrain("compare " + a.string() + " " + b.string() + " --model gpt2-124m --gpus 8 --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  CHECK(j.dump().find("a.json") != std::string::npos);
  CHECK(j.dump().find("b.json") != std::string::npos);
}
