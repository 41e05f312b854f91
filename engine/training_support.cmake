# Training support: the host-only pieces the trainer calls (byte and token datasets, data
# loader, image dataset and loader, LR schedule, checkpoints, metrics). No
# backend dependency. zlib: checkpoint crc32s and gzipped IDX image files.
find_package(ZLIB REQUIRED)

add_library(meshtrain_training_support STATIC
  data/byte_dataset.cc
  data/token_dataset.cc
  data/data_loader.cc
  data/image_dataset.cc
  data/image_loader.cc
  data/vqa_questions.cc
  data/vqa_loader.cc
  training/training_data.cc
  training/lr_schedule.cc
  checkpoint/files.cc
  checkpoint/manifest.cc
  checkpoint/writer.cc
  checkpoint/reader.cc
  checkpoint/claim.cc
  training/metrics.cc
  training/stop_request.cc
)
target_link_libraries(meshtrain_training_support
  PUBLIC meshtrain_engine nlohmann_json::nlohmann_json fmt::fmt
  PRIVATE ZLIB::ZLIB)
