// TrainingData: what the training loop reads, whatever the model reads.
//
// Three sources, chosen by the model: a language model trains on tokens, an
// llm.c token file's or a Megatron indexed dataset's (engine/data/token_dataset.h)
// or any other file's bytes (engine/data/byte_dataset.h), through
// engine/data/data_loader.h with the last 10% held out,
// a vision model on an IDX image set (engine/data/image_dataset.h,
// engine/data/image_loader.h; "fashion-mnist" or a directory), evaluated on its
// test split, and a VQA model on questions about 2×2 grids of such a set's
// images (engine/data/vqa_loader.h), evaluated on questions about the test
// images. All keep their position in a LoaderState, which checkpoints save,
// and all give each data-parallel rank its share of the global batch (the
// rank batches concatenated in rank order are the dp = 1 batch).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/data/data_loader.h"
#include "engine/plan/plan.h"
#include "engine/step/step_engine.h"
#include "models/model_spec.h"

namespace meshtrain {

class TrainingData {
 public:
  virtual ~TrainingData() = default;
  // This rank's next `count` micro-batches of `micro_batch` samples.
  virtual Result<std::vector<HostBatch>> next(int micro_batch, int count) = 0;
  virtual LoaderState state() const = 0;
  virtual void restore(const LoaderState& s) = 0;
  // This rank's part of the fixed held-out set, as micro-batches of at most
  // `micro_batch` samples: at most `max_samples` sequences (text, every
  // replica evaluates the same ones), test images (0: all, split over the
  // data-parallel replicas) or test questions (0: one per four test images,
  // each image seen once; split over the replicas).
  virtual Result<std::vector<HostBatch>> held_out(int micro_batch, int max_samples) const = 0;
  // What one training sample is, for progress lines: "tok", "img" or "q".
  virtual const char* unit() const = 0;
  // Where the data came from and its bytes, which a checkpoint records so
  // that resuming on other data is refused (engine/training/train_guard.h).
  virtual const std::string& source() const = 0;
  virtual std::span<const std::uint8_t> content() const = 0;
};

// Checks the data against the model before anything runs: the file or image
// set exists and is well formed, and fits the model (vocabulary 256 for
// bytes, every id below the vocabulary for token files; image size, channels
// and classes for images).
Status check_training_data(const std::string& data, const ModelSpec& m, const Plan& p);

// The data source of data-parallel rank `dp_rank` of `dp`. Image sets are
// read once per process and shared by the rank threads.
Result<std::unique_ptr<TrainingData>> open_training_data(const std::string& data, const ModelSpec& m, const Plan& p,
                                                         std::uint64_t seed, int dp_rank, int dp);

}  // namespace meshtrain
