#include "backends/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backends/counter_rng.h"

namespace meshtrain {

namespace {
[[noreturn]] void misuse(const std::string& what) {
  std::fprintf(stderr, "meshtrain: backend misuse: %s\n", what.c_str());
  std::abort();
}
}  // namespace

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
  }
  return "?";
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (auto d : dims_) n *= d;
  return n;
}

std::string Shape::str() const { return fmt::format("({})", fmt::join(dims_, ", ")); }

Tensor Tensor::view(Shape shape) const {
  if (shape.numel() != numel())
    misuse(fmt::format("view {} of a tensor {} changes the element count", shape.str(), shape_.str()));
  return Tensor(storage_, std::move(shape), dtype_, offset_);
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t count, Shape shape) const {
  if (begin < 0 || count < 0 || begin + count > numel())
    misuse(fmt::format("slice [{}, {}) of a tensor of {} elements", begin, begin + count, numel()));
  if (shape.rank() == 0) shape = Shape{count};
  if (shape.numel() != count)
    misuse(fmt::format("slice of {} elements viewed as {}", count, shape.str()));
  return Tensor(storage_, std::move(shape), dtype_, offset_ + begin);
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t count) const {
  if (shape_.rank() == 0) misuse("rows() of a tensor without dimensions");
  std::int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  std::vector<std::int64_t> dims = shape_.dims();
  dims[0] = count;
  return slice(begin * row, count * row, Shape(std::move(dims)));
}

int Group::index_of(int global_rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), global_rank);
  if (it == ranks.end() || *it != global_rank) return -1;
  return static_cast<int>(it - ranks.begin());
}

// ---- default implementations ---------------------------------------------------

Tensor Backend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  fill(t, 0.f);
  return t;
}

void Backend::init_normal(Tensor& x, const NormalInitOp& op) {
  std::vector<float> host(static_cast<std::size_t>(x.numel()), 0.f);
  const std::int64_t cols = std::max<std::int64_t>(op.cols, 1), rows = x.numel() / cols;
  for (std::int64_t r = 0; r < rows; ++r)
    for (const NormalInitOp::Run& run : op.runs)
      for (std::int64_t j = 0; j < run.width; ++j)
        host[static_cast<std::size_t>(r * cols + run.col + j)] = static_cast<float>(
            op.stddev * normal_at(op.key, run.counter + static_cast<std::uint64_t>(r) * op.row_stride +
                                              static_cast<std::uint64_t>(j)));
  write(x, host);
}

void Backend::grouped_gemm(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                           const GemmOp& op) {
  if (a.size() != b.size() || a.size() != c.size())
    misuse(fmt::format("grouped_gemm: {} a, {} b and {} c operands must be one per group", a.size(), b.size(),
                       c.size()));
  for (std::size_t g = 0; g < a.size(); ++g) gemm(a[g], b[g], c[g], op);
}

void Backend::attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) {
  const Shape& s = out.shape();
  if (s.rank() != 4 || part_out.shape() != s || lse.numel() != s[0] * s[2] * s[1] || part_lse.numel() != lse.numel())
    misuse(fmt::format("attention_merge: out {} and part_out {} must be one (B, Q, H, D), lse {} and part_lse {} "
                       "(B, H, Q)",
                       s.str(), part_out.shape().str(), lse.shape().str(), part_lse.shape().str()));
  const std::int64_t B = s[0], Q = s[1], H = s[2], D = s[3];
  std::vector<float> o(static_cast<std::size_t>(out.numel())), l(static_cast<std::size_t>(lse.numel()));
  std::vector<float> po(o.size()), pl(l.size());
  if (!read(out, o).ok() || !read(lse, l).ok() || !read(part_out, po).ok() || !read(part_lse, pl).ok()) return;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t q = 0; q < Q; ++q) {
        float& l1 = l[static_cast<std::size_t>((b * H + h) * Q + q)];
        const float l2 = pl[static_cast<std::size_t>((b * H + h) * Q + q)];
        // Relative to the larger of the two, so neither exponential overflows.
        const double m = std::max(l1, l2), w1 = std::exp(l1 - m), w2 = std::exp(l2 - m), z = w1 + w2;
        for (std::int64_t d = 0; d < D; ++d) {
          const auto i = static_cast<std::size_t>(((b * Q + q) * H + h) * D + d);
          o[i] = static_cast<float>((w1 * o[i] + w2 * po[i]) / z);
        }
        l1 = static_cast<float>(m + std::log(z));
      }
  write(out, o);
  write(lse, l);
}

void Backend::foreach_sum_squares(std::span<const Tensor> xs, Tensor& out) {
  for (const Tensor& x : xs) sum_squares(x, out, true);
}

void Backend::foreach_adamw(std::span<const AdamWTensors> params, const Tensor& coef,
                            const AdamWOp& op) {
  for (const AdamWTensors& t : params) {
    AdamWOp one = op;
    one.weight_decay = t.weight_decay;
    Tensor param = t.param, m = t.m, v = t.v;
    adamw(param, t.grad, m, v, coef, one);
  }
}

}  // namespace meshtrain
