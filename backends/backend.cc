#include "backends/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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
