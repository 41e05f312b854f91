#include "engine/step/training_engine.h"

#include "engine/plan/mesh.h"
#include "engine/step/segmented_engine.h"

namespace meshtrain {

namespace {

// A uniform plan: the rank's StepEngine on the plan's mesh, fed its data-parallel replica's micro-batches.
class UniformEngine : public TrainingEngine {
 public:
  UniformEngine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options)
      : plan_(p), mesh_(p), coord_(mesh_.coord_of(b.rank())), engine_(b, m, p, mesh_, std::move(options)) {}

  DataShare data_share() const override { return {coord_.dp, plan_.dp, plan_.micro_batch, plan_.microbatches()}; }
  Result<StepResult> step(const std::vector<HostBatch>& mbs, float lr, std::int64_t step) override {
    return engine_.step(mbs, lr, step);
  }
  Result<Evaluation> evaluate_metrics(const std::vector<HostBatch>& batches) override {
    return engine_.evaluate_metrics(batches);
  }
  Result<std::map<std::string, std::vector<float>>> export_state() override { return engine_.export_state(); }
  Status import_state(const std::map<std::string, std::vector<float>>& state) override {
    return engine_.import_state(state);
  }
  Result<std::vector<float>> export_rank_state() override { return engine_.export_rank_state(); }
  Status import_rank_state(std::span<const float> state) override { return engine_.import_rank_state(state); }

 private:
  Plan plan_;
  Mesh mesh_;
  Coord coord_;
  StepEngine engine_;
};

}  // namespace

std::unique_ptr<TrainingEngine> make_engine(Backend& b, const ModelSpec& m, const Plan& p, StepOptions options) {
  if (!p.segments.empty()) return std::make_unique<SegmentedEngine>(b, m, p, std::move(options));
  return std::make_unique<UniformEngine>(b, m, p, std::move(options));
}

}  // namespace meshtrain
