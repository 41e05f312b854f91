// Checkpoints: a directory holding one JSON manifest and one binary payload.
// Split by job: the manifest format (manifest.cc), writing (writer.cc), reading
// (reader.cc), a run's claim on its directory (claim.cc); the atomic I/O they
// share is core/durable_file.h.
//
//   DIR/manifest.json            the current checkpoint; names its payload
//   DIR/payload-<step>-<n>.bin   float32 tensors back to back, little-endian
//
// Manifest fields: format ("meshtrain-checkpoint"), version, model (model_to_json),
// plan (plan_to_json, seq_len resolved against the model), step, data_loader
// (LoaderState), rng (free-form JSON the trainer owns), payload {file, bytes,
// crc32} and tensors [{name, dtype "f32", shape, offset, bytes}] in payload
// order, optionally tokenizer {file, source, bytes, crc32, vocab} (below),
// plus manifest_crc32: zlib crc32 of the compact dump of every other field, so
// an edited or damaged manifest is caught as surely as the payload.
//
// Tensor names carry the rank: "rank0/layers.0.attn.qkv.weight",
// "rank0/adam_m/layers.0.attn.qkv.weight", "rank0/adam_v/...". One writer holds
// every rank's tensors (ranks as threads hand theirs to it).
//
// The writer's contract (CheckpointWriter::commit):
//  * Only a checkpoint that can be resumed is written: every tensor must be
//    finite. A NaN or an infinity is an Error naming the tensor, and nothing
//    is written, so the previous checkpoint stays the last one.
//  * Commit is crash-safe: the payload is written under a name no file in the
//    directory has (as a .tmp, fsynced, renamed), then the manifest likewise
//    (manifest.json.tmp, fsync, rename over manifest.json), then the directory
//    is fsynced. Until that last rename the previous manifest and its payload
//    are untouched; only after it are older payloads removed.
//  * A failed commit (a full disk, an I/O error) removes what it wrote before
//    returning its Error, and a commit first removes the temporaries that an
//    interrupted one (kill -9, power loss) left, so neither blocks the next
//    commit or fills the disk.
//  * Only files with these names (and meshtrain.lock) are touched, so the
//    directory may hold other things (a metrics file, logs) beside a checkpoint.
//
// A run trained on tokens of a SentencePiece model (`train --tokenizer`)
// keeps a copy of that model in the directory, DIR/tokenizer-<crc32>.model,
// and its manifest names it, so that whatever reads the checkpoint decodes
// with the tokenizer the model was trained with. The copy is written like a
// payload (temporary, fsync, rename) under a name given by its content, so a
// live manifest's tokenizer is never overwritten; a commit whose manifest
// names no tokenizer file (or another) removes the others once it is durable.
//
// A run claims its directory first (claim_checkpoint_dir): an exclusive lock
// (flock on DIR/meshtrain.lock, released when the process ends, kill -9
// included) so that two runs never write one checkpoint, and a look at what
// the directory holds, so that a run never replaces a checkpoint it was not
// asked to replace or writes into a directory that is not a checkpoint's.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/fd.h"
#include "core/status.h"
#include "engine/data/data_loader.h"
#include "engine/plan/plan.h"
#include "models/model_spec.h"

namespace meshtrain {

inline constexpr int kCheckpointVersion = 1;

struct CheckpointTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;  // prod(shape) elements
};

// The tokenizer a checkpoint's model was trained with.
struct CheckpointTokenizer {
  std::string file;    // its copy's name in the checkpoint directory
  std::string source;  // the path it was copied from (for messages)
  std::uint64_t bytes = 0;
  std::uint32_t crc32 = 0;  // checkpoint_crc32 of its bytes: the same file is the same tokenizer
  int vocab = 0;            // its pieces
};

struct CheckpointMeta {
  nlohmann::json model;  // model_to_json of the run that wrote it
  nlohmann::json plan;   // checkpoint_plan_json of that run
  std::int64_t step = 0;
  LoaderState data_loader;
  nlohmann::json rng;  // whatever the trainer stored, returned as written
  // What the run was (data file, learning-rate schedule, ...), free-form like
  // rng, for --resume's checks; null in checkpoints written before it existed.
  nlohmann::json run;
  std::optional<CheckpointTokenizer> tokenizer;  // absent: trained without --tokenizer
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
  void set_run(nlohmann::json run) { meta_.run = std::move(run); }
  // The tokenizer, already copied into the directory (install_checkpoint_tokenizer).
  void set_tokenizer(CheckpointTokenizer t) { meta_.tokenizer = std::move(t); }

  // Takes the host copy of one tensor. Errors on a duplicate name or when
  // data.size() != prod(shape).
  Status add_tensor(std::string name, std::vector<std::int64_t> shape, std::vector<float> data);

  // Writes the checkpoint into `dir` (created if missing) under the contract
  // above. Blocks until the data is on disk.
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

// Copies the tokenizer model `source` (of `vocab` pieces) into `dir` as
// tokenizer-<crc32>.model, durably, and returns the record a writer is given.
// A copy already there with that content is kept as it is.
Result<CheckpointTokenizer> install_checkpoint_tokenizer(const std::string& dir, const std::string& source, int vocab);

// A manifest's content, verified (checksum, format, version, every field's
// type and range, tensors tiling the payload) but without its payload.
struct CheckpointManifest {
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> shape;
    std::uint64_t offset = 0, bytes = 0;
  };
  CheckpointMeta meta;
  std::string payload;  // file name in the checkpoint directory
  std::uint64_t payload_bytes = 0;
  std::uint32_t payload_crc = 0;
  std::vector<Tensor> tensors;  // in payload order
};
// `path` names the manifest in errors. What load_checkpoint reads first; the
// fuzz target (tests/fuzz) feeds it arbitrary text.
Result<CheckpointManifest> parse_checkpoint_manifest(std::string_view text, const std::string& path);
// DIR/manifest.json, read and parsed (without loading the payload).
Result<CheckpointManifest> read_checkpoint_manifest(const std::string& dir);
// The manifest_crc32 a manifest (without that field) must carry: lets tests
// and the fuzz target write manifests that pass the checksum.
std::uint32_t checkpoint_manifest_crc(const nlohmann::json& manifest_without_crc);
// zlib's crc32 of `bytes` (the checksum of payloads, reused for data files).
std::uint32_t checkpoint_crc32(std::span<const std::uint8_t> bytes);

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

// How a run means to use its --checkpoint directory.
enum class CheckpointUse {
  fresh,      // start from step 1; the directory must hold no checkpoint
  resume,     // continue the checkpoint there, if there is one (--resume)
  overwrite,  // start from step 1, replacing the checkpoint there (--overwrite-checkpoint)
};

// The exclusive lock of one run on its checkpoint directory, held while the
// object lives (flock on DIR/meshtrain.lock, which records the holder).
class CheckpointLock {
 private:
  friend Result<CheckpointLock> claim_checkpoint_dir(const std::string& dir, CheckpointUse use,
                                                     const std::vector<std::string>& run_files);
  explicit CheckpointLock(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;  // of DIR/meshtrain.lock; closing it releases the flock
};

// Claims `dir` for a run: creates it if missing, takes the lock (refusing,
// with the holder's pid and host, while another run holds it), checks that
// it is writable, and refuses what `use` does not allow:
//   * a directory with files that are not a checkpoint's and no checkpoint
//     (it is not ours: we would delete or overwrite someone's files);
//   * `fresh` where a checkpoint exists (continue it with --resume or replace
//     it with --overwrite-checkpoint);
//   * `resume` where payloads lie without a manifest (a damaged checkpoint
//     must not silently restart from step 1).
// Leftover temporaries of an interrupted commit are removed. `run_files`
// are files the run itself writes (its --metrics), which may lie in `dir`.
Result<CheckpointLock> claim_checkpoint_dir(const std::string& dir, CheckpointUse use,
                                            const std::vector<std::string>& run_files = {});

}  // namespace meshtrain
