// Scratch files for the fault-injection tests (threads and MPI): a
// per-process directory, a small deterministic training text, and the
// metrics lines a run wrote.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::testing {

inline std::filesystem::path fault_scratch(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("meshtrain-fault-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  fs::remove_all(p);
  return p;
}

inline std::string fault_text() {
  static const std::string path = [] {
    auto p = fault_scratch("data.txt");
    std::ofstream out(p, std::ios::binary);
    for (int i = 0; i < 2000; ++i) out << "line " << i << ": the quick brown fox jumps over the lazy dog\n";
    return p.string();
  }();
  return path;
}

inline std::vector<nlohmann::json> metrics_lines(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace meshtrain::testing
