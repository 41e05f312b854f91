// Checkpoints: a directory holding one JSON manifest and one binary payload.
//
//   DIR/manifest.json            the current checkpoint; names its payload
//   DIR/payload-<step>-<n>.bin   float32 tensors back to back, little-endian
//
// Manifest fields: format ("meshtrain-checkpoint"), version, model (model_to_json),
// plan (plan_to_json, seq_len resolved against the model), step, data_loader
// (LoaderState), rng (free-form JSON the trainer owns), payload {file, bytes,
// crc32} and tensors [{name, dtype "f32", shape, offset, bytes}] in payload
// order, plus manifest_crc32: zlib crc32 of the compact dump of every other
// field, so an edited or damaged manifest is caught as surely as the payload.
//
// Tensor names carry the rank: "rank0/layers.0.attn.qkv.weight",
// "rank0/adam_m/layers.0.attn.qkv.weight", "rank0/adam_v/...". One writer holds
// every rank's tensors (ranks as threads hand theirs to it).
//
// Commit is crash-safe: the payload is written under a name no file in the
// directory has (as a .tmp, fsynced, renamed), then the manifest likewise
// (manifest.json.tmp, fsync, rename over manifest.json), then the directory is
// fsynced. Until that last rename the previous manifest and its payload are
// untouched; only after it are older payloads and leftover temporaries of an
// interrupted commit removed. Only files with these names are touched, so the
// directory may hold other things (a metrics file, logs).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/data_loader.h"
#include "engine/plan.h"
#include "models/model_spec.h"

namespace meshtrain {

inline constexpr int kCheckpointVersion = 1;

struct CheckpointTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;  // prod(shape) elements
};

struct CheckpointMeta {
  nlohmann::json model;  // model_to_json of the run that wrote it
  nlohmann::json plan;   // checkpoint_plan_json of that run
  std::int64_t step = 0;
  LoaderState data_loader;
  nlohmann::json rng;  // whatever the trainer stored, returned as written
};

struct Checkpoint {
  std::string dir;
  CheckpointMeta meta;
  std::map<std::string, CheckpointTensor> tensors;

  // The tensor named `name`, or an error naming it and the checkpoint.
  Result<const CheckpointTensor*> tensor(const std::string& name) const;
};

class CheckpointWriter {
 public:
  void set_model_and_plan(const ModelSpec& m, const Plan& p);
  void set_step(std::int64_t step) { meta_.step = step; }
  void set_data_loader(const LoaderState& s) { meta_.data_loader = s; }
  void set_rng(nlohmann::json rng) { meta_.rng = std::move(rng); }

  // Takes the host copy of one tensor. Errors on a duplicate name or when
  // data.size() != prod(shape).
  Status add_tensor(std::string name, std::vector<std::int64_t> shape, std::vector<float> data);

  // Writes the checkpoint into `dir` (created if missing) as described above.
  // Blocks until the data is on disk.
  Status commit(const std::string& dir) const;

 private:
  CheckpointMeta meta_;
  std::vector<std::pair<std::string, CheckpointTensor>> tensors_;  // in add order = payload order
};

// True when `dir` holds a committed checkpoint (its manifest.json exists).
bool has_checkpoint(const std::string& dir);

// Reads and verifies a checkpoint: the manifest's checksum and fields, the
// payload's size and checksum, and every tensor's extent. A truncated,
// corrupted or missing file is refused naming the file and expected vs actual.
Result<Checkpoint> load_checkpoint(const std::string& dir);

// The plan as a checkpoint records it: plan_to_json with seq_len resolved
// against the model, so "the model's seq_len" and the same number spelled out
// compare equal.
nlohmann::json checkpoint_plan_json(const ModelSpec& m, const Plan& p);

// Refuses a checkpoint written for another model or plan, naming every
// mismatched field with both values ("checkpoint was written for hidden 64,
// this run has hidden 128").
Status check_compatible(const Checkpoint& c, const ModelSpec& m, const Plan& p);

// Creates `dir` if needed and tests that a file can be written there, so an
// unusable --checkpoint fails before training starts rather than at the first save.
Status probe_checkpoint_dir(const std::string& dir);

}  // namespace meshtrain
