// Interned names: a task or trace event stores a 32-bit id instead of a
// string, so millions of tasks cost no string copies. Ids are dense and
// assigned in first-seen order, so the same input gives the same ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshtrain::sim {

using NameId = uint32_t;

class NameTable {
 public:
  NameId intern(std::string_view name) {
    auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    const NameId id = static_cast<NameId>(names_.size());
    names_.emplace_back(name);
    ids_.emplace(names_.back(), id);
    return id;
  }
  const std::string& name(NameId id) const { return names_[id]; }
  size_t size() const { return names_.size(); }

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, NameId> ids_;
};

}  // namespace meshtrain::sim
