#include "engine/step/segment_boundary.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace meshtrain {

namespace {

// Point-to-point tags of boundary messages start here, above the pipeline
// executor's (engine/parallel/pipeline_executor.cc), and wrap within 2^28.
constexpr std::int64_t kTagBase = std::int64_t{1} << 28;

SampleRange overlap(const SampleRange& a, const SampleRange& b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

}  // namespace

SampleLayout training_layout(const Plan& s) {
  const int m = s.microbatches();
  SampleLayout out(static_cast<std::size_t>(s.dp));
  for (int d = 0; d < s.dp; ++d)
    for (int j = 0; j < m; ++j) {
      const std::int64_t first = (static_cast<std::int64_t>(d) * m + j) * s.micro_batch;
      out[static_cast<std::size_t>(d)].push_back({first, first + s.micro_batch});
    }
  return out;
}

SampleLayout evaluation_layout(const Plan& s, const std::vector<std::int64_t>& sizes) {
  SampleLayout out(static_cast<std::size_t>(s.dp));
  std::int64_t first = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out[i % static_cast<std::size_t>(s.dp)].push_back({first, first + sizes[i]});
    first += sizes[i];
  }
  return out;
}

BoundaryExchange::BoundaryExchange(Backend& b, int index, const Plan& producer, const Plan& consumer,
                                   std::int64_t tokens, std::int64_t width, DType dtype)
    : b_(b),
      index_(index),
      producer_(producer),
      consumer_(consumer),
      producer_mesh_(producer),
      consumer_mesh_(consumer),
      same_ranks_(producer.first_rank == consumer.first_rank),
      tokens_(tokens),
      width_(width),
      dtype_(dtype),
      producer_side_(*this),
      consumer_side_(*this) {
  if (same_ranks_) {
    ranks_.id = consumer.group_id_base - 1;  // the producer's id space ends below the consumer's
    ranks_.ranks.resize(static_cast<std::size_t>(producer.world_size()));
    std::iota(ranks_.ranks.begin(), ranks_.ranks.end(), producer.first_rank);
  }
}

void BoundaryExchange::set_layouts(SampleLayout produced, SampleLayout consumed) {
  produced_ = std::move(produced);
  consumed_ = std::move(consumed);
  outbox_.clear();
  inbox_.clear();
}

std::vector<BoundaryExchange::Piece> BoundaryExchange::pieces(int j, bool gradient, bool sending) const {
  // The producer's end of this rank is its last stage; the consumer's its first.
  const bool at_producer = gradient != sending;
  const Coord c = (at_producer ? producer_mesh_ : consumer_mesh_).coord_of(b_.rank());
  const SampleLayout& mine = at_producer ? produced_ : consumed_;
  const SampleLayout& theirs = at_producer ? consumed_ : produced_;
  const SampleRange own = mine[static_cast<std::size_t>(c.dp)][static_cast<std::size_t>(j)];
  const int tp_p = producer_.tp, tp_c = consumer_.tp;
  std::vector<Piece> out;
  for (std::size_t d = 0; d < theirs.size(); ++d)
    for (const SampleRange& other : theirs[d]) {
      const SampleRange o = overlap(own, other);
      if (o.begin >= o.end) continue;
      const Piece piece{o, 0, (o.begin - own.begin) * tokens_};
      const int dp = static_cast<int>(d);
      if (at_producer) {
        // Activations go to every consumer t' with t' mod tp_P = t; gradients come from t mod tp_C.
        if (gradient) {
          out.push_back(piece);
          out.back().peer = consumer_mesh_.rank_of({c.tp % tp_c, 0, dp, 0});
          continue;
        }
        for (int t = c.tp; t < tp_c; t += tp_p) {
          out.push_back(piece);
          out.back().peer = consumer_mesh_.rank_of({t, 0, dp, 0});
        }
      } else {
        if (!gradient) {
          out.push_back(piece);
          out.back().peer = producer_mesh_.rank_of({c.tp % tp_p, 0, dp, producer_.pp - 1});
          continue;
        }
        for (int t = c.tp; t < tp_p; t += tp_c) {
          out.push_back(piece);
          out.back().peer = producer_mesh_.rank_of({t, 0, dp, producer_.pp - 1});
        }
      }
    }
  // Every pair of ranks meets its pieces in increasing sample order (see the header).
  std::stable_sort(out.begin(), out.end(),
                   [](const Piece& a, const Piece& b) { return a.samples.begin < b.samples.begin; });
  return out;
}

Tensor BoundaryExchange::whole(const Tensor& x, const Plan& p, const Mesh& mesh) {
  if (!p.sequence_parallel || p.tp == 1) return x;
  Tensor out = b_.empty(Shape{x.shape()[0] * p.tp, x.shape()[1]}, x.dtype());
  b_.all_gather(x, out, *mesh.group_of(GroupKind::tensor, b_.rank()));
  return out;
}

Tensor BoundaryExchange::own_rows(const Tensor& x, const Plan& p, const Mesh& mesh) {
  if (!p.sequence_parallel || p.tp == 1) return x;
  const std::int64_t n = x.shape()[0] / p.tp;
  return x.rows(mesh.coord_of(b_.rank()).tp * n, n);
}

int BoundaryExchange::tag(bool gradient, std::int64_t first_sample) const {
  const std::int64_t G = producer_.effective_global_batch();
  return static_cast<int>(kTagBase + ((index_ * 2 + (gradient ? 1 : 0)) * G + first_sample) % kTagBase);
}

std::string boundary_region(int index) { return fmt::format("boundary {}", index); }

void BoundaryExchange::send(int j, const Tensor& x, bool gradient) {
  const RegionScope region(b_, boundary_region(index_));
  const Tensor all = gradient ? whole(x, consumer_, consumer_mesh_) : whole(x, producer_, producer_mesh_);
  if (same_ranks_) {
    // The caller may reuse x's storage before the exchange: keep a copy.
    Tensor kept = b_.empty(all.shape(), all.dtype());
    b_.copy(all, kept);
    outbox_[{gradient, j}] = kept;
    return;
  }
  for (const Piece& p : pieces(j, gradient, true)) {
    b_.send(all.rows(p.row, rows(p.samples)), p.peer, tag(gradient, p.samples.begin));
  }
}

Tensor BoundaryExchange::receive(int j, bool gradient) {
  const RegionScope region(b_, boundary_region(index_));
  const Plan& p = gradient ? producer_ : consumer_;
  const Mesh& mesh = gradient ? producer_mesh_ : consumer_mesh_;
  if (same_ranks_) return own_rows(inbox_.at({gradient, j}), p, mesh);
  const Coord c = mesh.coord_of(b_.rank());
  const SampleRange own = (gradient ? produced_ : consumed_)[static_cast<std::size_t>(c.dp)][static_cast<std::size_t>(j)];
  Tensor all = b_.empty(Shape{rows(own), width_}, dtype_);
  for (const Piece& piece : pieces(j, gradient, false)) {
    Tensor part = all.rows(piece.row, rows(piece.samples));
    b_.recv(part, piece.peer, tag(gradient, piece.samples.begin));
  }
  return own_rows(all, p, mesh);
}

void BoundaryExchange::exchange(bool gradient) {
  const RegionScope region(b_, boundary_region(index_));
  const int members = ranks_.size();
  auto member = [&](int rank) { return static_cast<std::size_t>(rank - ranks_.ranks.front()); };
  // What this rank sends: the micro-batches it stored, in order; to each member in increasing sample order.
  std::vector<std::vector<std::pair<Tensor, Piece>>> out(static_cast<std::size_t>(members));
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(members), 0);
  for (const auto& [key, all] : outbox_) {
    if (key.first != gradient) continue;
    for (const Piece& p : pieces(key.second, gradient, true)) {
      out[member(p.peer)].push_back({all, p});
      send_counts[member(p.peer)] += rows(p.samples) * width_;
    }
  }
  // What it receives: every micro-batch of its end of the boundary.
  const bool at_producer = gradient;
  const Mesh& mesh = at_producer ? producer_mesh_ : consumer_mesh_;
  const Coord c = mesh.coord_of(b_.rank());
  const bool receives = at_producer ? c.pp == producer_.pp - 1 : c.pp == 0;
  std::vector<std::vector<std::pair<Tensor, Piece>>> in(static_cast<std::size_t>(members));
  std::vector<std::int64_t> recv_counts(static_cast<std::size_t>(members), 0);
  if (receives) {
    const auto& mine = (at_producer ? produced_ : consumed_)[static_cast<std::size_t>(c.dp)];
    for (int j = 0; j < static_cast<int>(mine.size()); ++j) {
      Tensor all = b_.empty(Shape{rows(mine[static_cast<std::size_t>(j)]), width_}, dtype_);
      inbox_[{gradient, j}] = all;
      for (const Piece& p : pieces(j, gradient, false)) {
        in[member(p.peer)].push_back({all, p});
        recv_counts[member(p.peer)] += rows(p.samples) * width_;
      }
    }
  }
  // Pieces to (from) one member are in increasing sample order on both sides: sort each list so.
  for (auto* lists : {&out, &in})
    for (auto& l : *lists)
      std::stable_sort(l.begin(), l.end(),
                       [](const auto& a, const auto& b) { return a.second.samples.begin < b.second.samples.begin; });
  const std::int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  const std::int64_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
  Tensor send_buf = b_.empty(Shape{sent}, dtype_);
  Tensor recv_buf = b_.empty(Shape{received}, dtype_);
  std::int64_t at = 0;
  for (const auto& l : out)
    for (const auto& [all, p] : l) {
      const std::int64_t n = rows(p.samples);
      Tensor dst = send_buf.slice(at, n * width_, Shape{n, width_});
      b_.copy(all.rows(p.row, n), dst);
      at += n * width_;
    }
  b_.all_to_all(send_buf, send_counts, recv_buf, recv_counts, ranks_);
  at = 0;
  for (const auto& l : in)
    for (const auto& [all, p] : l) {
      const std::int64_t n = rows(p.samples);
      Tensor dst = all.rows(p.row, n);
      b_.copy(recv_buf.slice(at, n * width_, Shape{n, width_}), dst);
      at += n * width_;
    }
}

}  // namespace meshtrain
