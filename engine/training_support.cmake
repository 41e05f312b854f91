# Training support: the host-only pieces the trainer calls (byte and token datasets, data
# loader, image dataset and loader, LR schedule, checkpoints, metrics). No
# backend dependency. zlib: checkpoint crc32s and gzipped IDX image files.
find_package(ZLIB REQUIRED)

add_library(meshtrain_training_support STATIC
  byte_dataset.cc
  token_dataset.cc
  data_loader.cc
  image_dataset.cc
  image_loader.cc
  vqa_questions.cc
  vqa_loader.cc
  training_data.cc
  lr_schedule.cc
  checkpoint/files.cc
  checkpoint/manifest.cc
  checkpoint/writer.cc
  checkpoint/reader.cc
  checkpoint/claim.cc
  metrics.cc
  stop_request.cc
)
target_link_libraries(meshtrain_training_support
  PUBLIC meshtrain_engine nlohmann_json::nlohmann_json fmt::fmt
  PRIVATE ZLIB::ZLIB)
