# Training support: the host-only pieces the trainer calls (byte dataset, data
# loader, LR schedule, checkpoints, metrics). No backend dependency.
find_package(ZLIB REQUIRED)

add_library(meshtrain_training_support STATIC
  byte_dataset.cc
  data_loader.cc
  lr_schedule.cc
  checkpoint.cc
  metrics.cc
  stop_request.cc
)
target_link_libraries(meshtrain_training_support
  PUBLIC meshtrain_engine nlohmann_json::nlohmann_json fmt::fmt
  PRIVATE ZLIB::ZLIB)
