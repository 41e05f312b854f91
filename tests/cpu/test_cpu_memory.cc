// Storage, accounting, views, dtype conversion, streams, collectives on a
// single rank, and the sticky error of a failed collective.
#include <bit>
#include <cstring>
#include <limits>

#include "backends/half.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using testing::download;

TEST_CASE("cpu memory_stats counts exactly the live storage bytes", "[cpu]") {
  CpuBackend b;
  REQUIRE(b.memory_stats().live_bytes == 0);
  {
    Tensor a = b.empty({3, 5});
    Tensor h = b.empty({7}, DType::bf16);
    Tensor ids = b.empty({9}, DType::i32);
    CHECK(b.memory_stats().live_bytes == 60 + 14 + 36);
    Tensor v = a.view({15});
    Tensor s = a.slice(2, 4);
    CHECK(b.memory_stats().live_bytes == 110);  // views add nothing
    a = Tensor();
    CHECK(b.memory_stats().live_bytes == 110);  // the views keep the storage
    v = Tensor();
    s = Tensor();
    CHECK(b.memory_stats().live_bytes == 50);
    CHECK(b.memory_stats().peak_bytes == 110);
  }
  CHECK(b.memory_stats().live_bytes == 0);
  CHECK(b.memory_stats().peak_bytes == 110);
  b.reset_peak();
  CHECK(b.memory_stats().peak_bytes == 0);
  Tensor z = b.empty({0, 4});
  CHECK(b.memory_stats().live_bytes == 0);
  CHECK(b.rank() == 0);
  CHECK(b.world_size() == 1);
}

TEST_CASE("cpu slices and views address the right elements", "[cpu]") {
  CpuBackend b;
  Tensor t = b.empty({4, 3});
  b.fill(t, 0.f);
  Tensor row2 = t.rows(2, 1);
  b.fill(row2, 7.f);
  Tensor mid = t.slice(4, 2, Shape{2, 1});
  b.write(mid, std::vector<float>{1.f, 2.f});
  CHECK(download(b, t) == testing::Vec{0, 0, 0, 0, 1, 2, 7, 7, 7, 0, 0, 0});
  Tensor v = t.view({2, 6}).rows(1, 1);
  CHECK(download(b, v) == testing::Vec{7, 7, 7, 0, 0, 0});
  Tensor c = b.empty({3});
  b.copy(t.slice(3, 3), c);
  CHECK(download(b, c) == testing::Vec{0, 1, 2});
}

TEST_CASE("cpu bf16 and f16 conversions round to nearest even", "[cpu]") {
  // Every 16-bit value survives a round trip through fp32 (NaNs stay NaN).
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    const float fb = bf16_to_float(h), fh = f16_to_float(h);
    if (std::isnan(fb))
      CHECK(std::isnan(bf16_to_float(float_to_bf16(fb))));
    else if (float_to_bf16(fb) != h)
      FAIL("bf16 round trip of " << u);
    if (std::isnan(fh))
      CHECK(std::isnan(f16_to_float(float_to_f16(fh))));
    else if (float_to_f16(fh) != h)
      FAIL("f16 round trip of " << u);
  }
  // Ties go to the even neighbour.
  CHECK(bf16_to_float(float_to_bf16(1.f + 0x1p-8f)) == 1.f);
  CHECK(bf16_to_float(float_to_bf16(1.f + 3 * 0x1p-8f)) == 1.f + 0x1p-6f);
  CHECK(f16_to_float(float_to_f16(1.f + 0x1p-11f)) == 1.f);
  CHECK(f16_to_float(float_to_f16(1.f + 3 * 0x1p-11f)) == 1.f + 0x1p-9f);
  CHECK(f16_to_float(float_to_f16(65519.f)) == 65504.f);
  CHECK(std::isinf(f16_to_float(float_to_f16(65520.f))));
  CHECK(f16_to_float(float_to_f16(0x1p-24f)) == 0x1p-24f);      // smallest subnormal
  CHECK(f16_to_float(float_to_f16(0x1p-25f)) == 0.f);           // tie to even zero
  CHECK(f16_to_float(float_to_f16(3 * 0x1p-25f)) == 0x1p-23f);  // tie to even 2
  CHECK(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
#if defined(__FLT16_MAX__)
  // Against the compiler's own conversion on random floats of every magnitude.
  std::mt19937_64 rng(testing::seed_for("f16 vs _Float16"));
  for (int i = 0; i < 200000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    if (float_to_f16(f) != want) FAIL("f16 of bits " << bits);
  }
#endif
}

TEST_CASE("cpu cast round trips through bf16 and f16", "[cpu]") {
  CpuBackend b;
  std::mt19937_64 rng(testing::seed_for("cast round trips"));
  const testing::Vec x = testing::random_vec(rng, 257, 3.0);
  Tensor f = testing::upload(b, {257}, x);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor h = b.empty({257}, t);
    Tensor back = b.empty({257});
    b.cast(f, h);
    b.cast(h, back);
    const testing::Vec got = download(b, back);
    const testing::Vec direct = download(b, h);  // read converts too
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float xf = static_cast<float>(x[i]);
      const float want = t == DType::bf16 ? bf16_to_float(float_to_bf16(xf))
                                          : f16_to_float(float_to_f16(xf));
      REQUIRE(got[i] == want);
      REQUIRE(direct[i] == want);
    }
    // 16-bit to 16-bit copies are bitwise, and writing floats converts.
    Tensor h2 = b.empty({257}, t);
    b.copy(h, h2);
    CHECK(download(b, h2) == got);
    b.write(h2, std::vector<float>(x.begin(), x.end()));
    CHECK(download(b, h2) == got);
    Tensor other = b.empty({257}, t == DType::bf16 ? DType::f16 : DType::bf16);
    b.cast(h, other);
    b.cast(other, h2);  // bf16 <-> f16 goes through fp32
    const testing::Vec twice = download(b, h2);
    CHECK(testing::rel_err(twice, x) < 1e-2);
  }
  b.fill(f, 0.1f);
  Tensor h = b.empty({257}, DType::bf16);
  b.fill(h, 0.1f);
  CHECK(download(b, h)[5] == bf16_to_float(float_to_bf16(0.1f)));
}

TEST_CASE("cpu int32 tensors hold ids exactly", "[cpu]") {
  CpuBackend b;
  const std::vector<std::int32_t> ids{0, -5, 255, 1 << 23, 16777215};
  Tensor t = testing::upload_ids(b, ids);
  const testing::Vec got = download(b, t);
  for (std::size_t i = 0; i < ids.size(); ++i) CHECK(got[i] == ids[i]);
}

TEST_CASE("cpu streams and events are checked bookkeeping", "[cpu]") {
  CpuBackend b;
  CHECK(b.current_stream() == Stream{0});
  const Stream comm = b.create_stream("comm");
  CHECK(comm.id != 0);
  {
    StreamScope scope(b, comm);
    CHECK(b.current_stream() == comm);
    Tensor x = b.empty({4});
    b.fill(x, 2.f);
    const Event e = b.record(comm);
    CHECK(e.valid());
    b.wait(Stream{0}, e);
  }
  CHECK(b.current_stream() == Stream{0});
  CHECK(b.synchronize().ok());
}

TEST_CASE("cpu collectives on a group of one are the identity", "[cpu]") {
  CpuBackend b;
  const Group g{7, {0}};
  Tensor x = testing::upload(b, {3}, {1, 2, 3});
  b.all_reduce(x, g, ReduceOp::sum);
  b.broadcast(x, g, 0);
  b.barrier(g);
  CHECK(download(b, x) == testing::Vec{1, 2, 3});
  Tensor y = b.empty({3});
  b.reduce_scatter(x, y, g, ReduceOp::max);
  CHECK(download(b, y) == testing::Vec{1, 2, 3});
  Tensor z = b.empty({3});
  b.all_gather(y, z, g);
  CHECK(download(b, z) == testing::Vec{1, 2, 3});
  Tensor ids = testing::upload_ids(b, {4, 5});
  Tensor got = b.empty({2}, DType::i32);
  const std::int64_t counts[] = {2};
  b.all_to_all(ids, counts, got, counts, g);
  CHECK(download(b, got) == testing::Vec{4, 5});
  CHECK(b.synchronize().ok());
}

// A two-rank communicator for this rank only: it loops data back (as if the
// peer sent the same) and fails on demand, so the backend's side of the
// contract can be tested without threads.
class LoopbackCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string_view kind() const override { return "test-loopback"; }
  Status all_reduce(std::span<float> data, const Group& g, ReduceOp) override {
    return call("all_reduce", g, [&] {
      for (float& v : data) v *= 2;
    });
  }
  Status reduce_scatter(std::span<const float> in, std::span<float> out, const Group& g,
                        ReduceOp) override {
    return call("reduce_scatter", g, [&] { std::memcpy(out.data(), in.data(), out.size_bytes()); });
  }
  Status all_gather(std::span<const float> in, std::span<float> out, const Group& g) override {
    return call("all_gather", g, [&] {
      for (int i = 0; i < g.size(); ++i)
        std::memcpy(out.data() + i * in.size(), in.data(), in.size_bytes());
    });
  }
  Status broadcast(std::span<float>, const Group& g, int) override {
    return call("broadcast", g, [] {});
  }
  Status all_to_all(std::span<const float> in, std::span<const std::int64_t>, std::span<float> out,
                    std::span<const std::int64_t>, const Group& g) override {
    return call("all_to_all", g, [&] { std::memcpy(out.data(), in.data(), out.size_bytes()); });
  }
  Status send(std::span<const float> data, int, int) override {
    return call("send", Group{}, [&] { sent_.assign(data.begin(), data.end()); });
  }
  Status recv(std::span<float> data, int, int) override {
    return call("recv", Group{},
                [&] { std::memcpy(data.data(), sent_.data(), data.size_bytes()); });
  }
  Status barrier(const Group& g) override {
    return call("barrier", g, [] {});
  }

  int calls = 0;
  int fail_at_call = -1;  // 0-based index of the call that times out

 private:
  template <class F>
  Status call(std::string_view op, const Group& g, F&& f) {
    if (calls++ == fail_at_call)
      return make_error("{} on group {} timed out waiting for rank 1", op, g.id);
    f();
    return ok_status();
  }
  std::vector<float> sent_;
};

TEST_CASE("cpu collectives go to the communicator, ids bitwise", "[cpu]") {
  LoopbackCommunicator comm;
  CpuBackend b(comm);
  CHECK(b.rank() == 0);
  CHECK(b.world_size() == 2);
  const Group g{1, {0, 1}};
  Tensor x = testing::upload(b, {2}, {1.5, -2});
  b.all_reduce(x, g, ReduceOp::sum);
  CHECK(download(b, x) == testing::Vec{3, -4});
  // An id whose bits are a signalling NaN must arrive unchanged.
  const std::int32_t snan_bits = 0x7f800001;
  Tensor ids = testing::upload_ids(b, {snan_bits, 3});
  Tensor gathered = b.empty({4}, DType::i32);
  b.all_gather(ids, gathered, g);
  b.send(ids, 1, 9);
  Tensor got = b.empty({2}, DType::i32);
  b.recv(got, 1, 9);
  const testing::Vec want{static_cast<double>(static_cast<float>(snan_bits)), 3};
  CHECK(download(b, got) == want);
  const testing::Vec all = download(b, gathered);
  CHECK(testing::Vec(all.begin() + 2, all.end()) == want);
  CHECK(comm.calls == 4);
}

TEST_CASE("cpu a failed collective is sticky", "[cpu]") {
  LoopbackCommunicator comm;
  comm.fail_at_call = 1;
  CpuBackend b(comm);
  const Group g{3, {0, 1}};
  Tensor x = testing::upload(b, {2}, {1, 2});
  b.all_reduce(x, g, ReduceOp::sum);  // call 0 succeeds
  b.all_reduce(x, g, ReduceOp::sum);  // call 1 fails
  b.all_reduce(x, g, ReduceOp::sum);  // skipped
  b.barrier(g);                       // skipped
  b.fill(x, 9.f);                     // skipped
  CHECK(comm.calls == 2);
  const Status s = b.synchronize();
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error().message(), Catch::Contains("all_reduce on group 3") &&
                                      Catch::Contains("timed out waiting for rank 1") &&
                                      Catch::Contains("cpu rank 0"));
  std::vector<float> host(2);
  const Status r = b.read(x, host);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message() == s.error().message());
}

}  // namespace
}  // namespace meshtrain
