// StepEngine's state in and out: the full parameters and AdamW moments,
// gathered over every shard and stage for a checkpoint and loaded back under
// any plan, and the state of a rank alone (1bit error feedback). Apart from
// step_engine.cc because it reads the chunks but not the step.
#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "engine/step/step_chunk.h"
#include "models/parameters.h"

namespace meshtrain {

namespace {

const char* const kPrefixes[3] = {"params/", "adam_m/", "adam_v/"};

}  // namespace

Result<std::map<std::string, std::vector<float>>> StepEngine::export_state() {
  if (setup_error_) return *setup_error_;
  settle();
  std::map<std::string, std::vector<float>> out;
  const Group& tp = *mesh_.group_of(GroupKind::tensor, b_.rank());
  // Expert shards differ over the expert_model group: member q holds expert
  // tensor shard q % etp of the experts of EP rank q / etp.
  const Group& experts = *mesh_.group_of(GroupKind::expert_model, b_.rank());
  const int etp = plan_.expert_tp();
  for (auto& c : chunks_) {
    ParameterStore& params = c->model->parameters();
    std::vector<float> flat[3];
    MT_TRY(c->adam->gather_state(flat[0], flat[1], flat[2]));
    for (const ParamSlot& slot : params.slots()) {
      // The tied copy on the last stage equals the first stage's embedding.
      if (slot.info.name == "embed.tokens" && !c->model->layers().embedding) continue;
      const std::int64_t n = slot.numel;
      const Group& over = slot.info.expert ? experts : tp;
      const int G = over.size();
      for (int k = 0; k < 3; ++k) {
        // Every tp (or expert) rank's shard, then each element to its place in the full tensor.
        Tensor shard = b_.empty(Shape{n}), all = b_.empty(Shape{n * G});
        b_.write(shard, std::span<const float>(flat[k]).subspan(static_cast<std::size_t>(slot.offset),
                                                                 static_cast<std::size_t>(n)));
        b_.all_gather(shard, all, over);
        std::vector<float> host(static_cast<std::size_t>(n * G));
        MT_TRY(b_.read(all, host));
        std::vector<float> full(static_cast<std::size_t>(slot.info.numel()));
        for (int t = 0; t < G; ++t) {
          const ShardCoord sc = slot.info.expert ? ShardCoord{0, plan_.tp, t / etp, G / etp, t % etp, etp}
                                                 : ShardCoord{t, plan_.tp, 0, 1};
          for (std::int64_t i = 0; i < n; ++i) {
            const std::int64_t f = full_index(m_, slot.info, sc, i);
            if (f >= 0) full[static_cast<std::size_t>(f)] = host[static_cast<std::size_t>(t * n + i)];
          }
        }
        out.emplace(kPrefixes[k] + slot.info.name, std::move(full));
      }
    }
  }
  if (const std::vector<Fp8Scaling*> fp8 = fp8_chunks(); !fp8.empty())
    MT_TRY(export_fp8_state(b_, m_, plan_, mesh_, fp8, out));
  if (plan_.pp == 1) return out;
  // Pipeline stages: every parameter from the stage that owns it to every stage.
  const Group& pipe = *mesh_.group_of(GroupKind::pipeline, b_.rank());
  for (const ParamInfo& info : parameter_table(m_)) {
    if (!plan_.stage_split().holds(m_, info.layer)) continue;  // another segment's
    const int owner = place_layer(m_, info.layer, plan_.stage_split()).stage;
    const int root = mesh_.rank_of({coord_.tp, coord_.cp, coord_.dp, owner});
    for (const char* prefix : kPrefixes) {
      const std::string name = prefix + info.name;
      Tensor t = b_.empty(Shape{info.numel()});
      if (owner == coord_.pp) b_.write(t, out.at(name));
      b_.broadcast(t, pipe, root);
      std::vector<float> host(static_cast<std::size_t>(info.numel()));
      MT_TRY(b_.read(t, host));
      out[name] = std::move(host);
    }
  }
  return out;
}

Status StepEngine::import_state(const std::map<std::string, std::vector<float>>& state) {
  if (setup_error_) return *setup_error_;
  settle();
  for (auto& c : chunks_) {
    ParameterStore& params = c->model->parameters();
    std::vector<float> flat[3];
    for (auto& f : flat) f.assign(static_cast<std::size_t>(params.numel()), 0.f);
    for (const ParamSlot& slot : params.slots()) {
      const std::int64_t n = slot.numel;
      for (int k = 0; k < 3; ++k) {
        auto it = state.find(kPrefixes[k] + slot.info.name);
        if (it == state.end())
          return make_error("the checkpoint has no tensor '{}{}'", kPrefixes[k], slot.info.name);
        if (static_cast<std::int64_t>(it->second.size()) != slot.info.numel())
          return make_error("checkpoint tensor '{}{}' has {} elements, this model needs {}", kPrefixes[k],
                            slot.info.name, it->second.size(), slot.info.numel());
        std::vector<float> shard(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t f = full_index(m_, slot.info, params.coord(), i);
          shard[static_cast<std::size_t>(i)] = f < 0 ? 0.f : it->second[static_cast<std::size_t>(f)];
        }
        std::copy(shard.begin(), shard.end(), flat[k].begin() + slot.offset);
      }
    }
    c->adam->load_state(flat[0], flat[1], flat[2]);
  }
  MT_TRY(import_fp8_state(fp8_chunks(), state));
  return b_.synchronize();
}

std::int64_t StepEngine::rank_state_numel() const {
  std::int64_t n = 0;
  for (const auto& c : chunks_) n += c->buckets->error_numel();
  return n;
}

Result<std::vector<float>> StepEngine::export_rank_state() {
  if (setup_error_) return *setup_error_;
  std::vector<float> out;
  for (auto& c : chunks_) {
    MT_ASSIGN(std::vector<float> errors, c->buckets->export_errors());
    out.insert(out.end(), errors.begin(), errors.end());
  }
  return out;
}

Status StepEngine::import_rank_state(std::span<const float> state) {
  if (setup_error_) return *setup_error_;
  if (static_cast<std::int64_t>(state.size()) != rank_state_numel())
    return make_error("the checkpoint holds {} values of rank {}'s own state (1bit error feedback), this plan has {}",
                      state.size(), b_.rank(), rank_state_numel());
  std::size_t at = 0;
  for (auto& c : chunks_) {
    const auto n = static_cast<std::size_t>(c->buckets->error_numel());
    MT_TRY(c->buckets->import_errors(state.subspan(at, n)));
    at += n;
  }
  return b_.synchronize();
}

}  // namespace meshtrain
