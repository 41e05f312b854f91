// CpuBackend ranks as threads over the in-process communicator: collectives
// reach the peers, ids travel bitwise, a data-parallel gradient equals the
// single-rank one, and a missing peer becomes the sticky error. Catch2
// assertions are not thread-safe: rank threads only record what they saw.
#include <chrono>

#include "backends/cpu/comm/in_process.h"
#include "tests/cpu/cpu_test_util.h"

namespace meshtrain {
namespace {

using testing::Vec;

// Catch-free transfers for rank threads.
Tensor put(Backend& be, const Shape& shape, const Vec& v) {
  Tensor t = be.empty(shape);
  be.write(t, std::vector<float>(v.begin(), v.end()));
  return t;
}

Tensor put_ids(Backend& be, const std::vector<std::int32_t>& ids) {
  Tensor t = be.empty({static_cast<std::int64_t>(ids.size())}, DType::i32);
  be.write(t, ids);
  return t;
}

Result<Vec> get(Backend& be, const Tensor& t) {
  std::vector<float> host(static_cast<std::size_t>(t.numel()));
  MT_TRY(be.read(t, host));
  return Vec(host.begin(), host.end());
}

TEST_CASE("cpu ranks: collectives and int32 ids through the communicator", "[cpu][ranks]") {
  const std::int32_t snan_bits = 0x7f800001;  // an id whose bits are a signalling NaN
  Vec reduced[2], gathered[2], received;
  const Status s = run_ranks(2, [&](int rank, Communicator& comm) -> Status {
    CpuBackend be(comm);
    const Group world{0, {0, 1}};
    Tensor x = put(be, {2}, {1.0 + rank, 10.0 * (rank + 1)});
    be.all_reduce(x, world, ReduceOp::sum);
    Tensor ids = put_ids(be, {snan_bits + rank, 7});
    Tensor all = be.empty({4}, DType::i32);
    be.all_gather(ids, all, world);
    if (rank == 0) be.send(ids, 1, 3);
    Tensor got = be.empty({2}, DType::i32);
    if (rank == 1) be.recv(got, 0, 3);
    MT_TRY(be.synchronize());
    MT_ASSIGN(reduced[rank], get(be, x));
    MT_ASSIGN(gathered[rank], get(be, all));
    if (rank == 1) {
      MT_ASSIGN(received, get(be, got));
    }
    return ok_status();
  });
  REQUIRE(s.ok());
  const auto f = [](std::int32_t v) { return static_cast<double>(static_cast<float>(v)); };
  for (int r = 0; r < 2; ++r) {
    CHECK(reduced[r] == Vec{3, 30});
    CHECK(gathered[r] == Vec{f(snan_bits), 7, f(snan_bits + 1), 7});
  }
  CHECK(received == Vec{f(snan_bits), 7});
}

TEST_CASE("cpu ranks: bf16 and fp16 tensors travel bitwise by all-gather and all-to-all, odd blocks too",
          "[cpu][ranks][half]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    Vec gathered[2], exchanged[2], reduced[2], scattered[2];
    std::int64_t sent[2] = {0, 0};
    const Status s = run_ranks(2, [&](int rank, Communicator& comm) -> Status {
      CpuBackend be(comm);
      const Group world{0, {0, 1}};
      // Three elements each (odd): values exact in both formats.
      Tensor mine = be.empty({3}, dt);
      be.write(mine, std::vector<float>{1.5f + rank, -2.f, 0.25f * (rank + 1)});
      Tensor all = be.empty({6}, dt);
      const std::int64_t before = comm.bytes_sent();
      be.all_gather(mine, all, world);
      sent[rank] = comm.bytes_sent() - before;
      // Rank r sends 1 + r elements to member 0 and 2 to member 1.
      const std::vector<std::int64_t> sc{1 + rank, 2}, rc = rank == 0 ? std::vector<std::int64_t>{1, 2}
                                                                         : std::vector<std::int64_t>{2, 2};
      Tensor in = be.empty({3 + rank}, dt), out = be.empty({rc[0] + rc[1]}, dt);
      std::vector<float> values;
      for (int i = 0; i < 3 + rank; ++i) values.push_back(10.f * rank + i);
      be.write(in, values);
      be.all_to_all(in, sc, out, rc, world);
      // Reductions, summed in fp32 and rounded once: values exact in both formats.
      Tensor x = be.empty({3}, dt), part = be.empty({3}, dt), whole = be.empty({6}, dt);
      be.write(x, std::vector<float>{1.f, 0.5f, 0x1p-8f});
      be.all_reduce(x, world, ReduceOp::sum);
      be.write(whole, std::vector<float>{1.f + rank, 2.f, 3.f, 4.f, 5.f, 6.f * (rank + 1)});
      be.reduce_scatter(whole, part, world, ReduceOp::sum);
      MT_TRY(be.synchronize());
      MT_ASSIGN(reduced[rank], get(be, x));
      MT_ASSIGN(scattered[rank], get(be, part));
      MT_ASSIGN(gathered[rank], get(be, all));
      MT_ASSIGN(exchanged[rank], get(be, out));
      return ok_status();
    });
    REQUIRE(s.ok());
    for (int r = 0; r < 2; ++r) CHECK(gathered[r] == Vec{1.5, -2, 0.25, 2.5, -2, 0.5});
    CHECK(exchanged[0] == Vec{0, 10, 11});
    CHECK(exchanged[1] == Vec{1, 2, 12, 13});
    for (int r = 0; r < 2; ++r) CHECK(reduced[r] == Vec{2, 1, 0x1p-7});
    CHECK(scattered[0] == Vec{3, 4, 6});
    CHECK(scattered[1] == Vec{8, 10, 18});
    // Three 2-byte elements travel as two floats (one zero-padded half).
    CHECK(sent[0] == 8);
    CHECK(sent[1] == 8);
  }
}

TEST_CASE("cpu ranks: a data-parallel layernorm gradient equals the single-rank one",
          "[cpu][ranks]") {
  std::mt19937_64 rng(testing::seed_for("ranks layernorm"));
  const std::int64_t N = 64, C = 16;
  const Vec x = testing::random_vec(rng, N * C), dout = testing::random_vec(rng, N * C);
  const Vec w = testing::random_vec(rng, C), b = testing::random_vec(rng, C);
  auto grads = [&](Backend& be, std::int64_t begin, std::int64_t rows) {
    Tensor tx = put(be, {rows, C}, Vec(x.begin() + begin * C, x.begin() + (begin + rows) * C));
    Tensor td =
        put(be, {rows, C}, Vec(dout.begin() + begin * C, dout.begin() + (begin + rows) * C));
    Tensor tw = put(be, {C}, w), tb = put(be, {C}, b);
    Tensor out = be.empty({rows, C}), mean = be.empty({rows}), rstd = be.empty({rows});
    Tensor dx = be.empty({rows, C}), dw = be.empty({C}), db = be.empty({C});
    be.fill(dw, 0.f);
    be.fill(db, 0.f);
    be.layernorm_forward(tx, tw, tb, out, mean, rstd, 1e-5f);
    be.layernorm_backward(td, tx, tw, mean, rstd, dx, dw, db);
    return std::pair{dw, db};
  };
  CpuBackend single;
  const auto [dw1, db1] = grads(single, 0, N);
  const Vec want_w = testing::download(single, dw1), want_b = testing::download(single, db1);
  Vec got_w[2], got_b[2];
  const Status s = run_ranks(2, [&](int rank, Communicator& comm) -> Status {
    CpuBackend be(comm);
    auto [dw, db] = grads(be, rank * N / 2, N / 2);
    be.all_reduce(dw, Group{0, {0, 1}}, ReduceOp::sum);
    be.all_reduce(db, Group{0, {0, 1}}, ReduceOp::sum);
    MT_TRY(be.synchronize());
    MT_ASSIGN(got_w[rank], get(be, dw));
    MT_ASSIGN(got_b[rank], get(be, db));
    return ok_status();
  });
  REQUIRE(s.ok());
  for (int r = 0; r < 2; ++r) {
    CHECK(testing::rel_err(got_w[r], want_w) < 1e-6);
    CHECK(testing::rel_err(got_b[r], want_b) < 1e-6);
    CHECK(got_w[r] == got_w[0]);  // every rank holds the same bits
  }
}

TEST_CASE("cpu ranks: a peer that never arrives is the sticky error", "[cpu][ranks]") {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(200);
  std::string seen;
  const Status s = run_ranks(
      2,
      [&](int rank, Communicator& comm) -> Status {
        if (rank == 1) return ok_status();  // never joins the all-reduce
        CpuBackend be(comm);
        Tensor x = put(be, {1}, {1});
        be.all_reduce(x, Group{5, {0, 1}}, ReduceOp::sum);
        be.barrier(Group{5, {0, 1}});
        std::vector<float> host(1);
        const Status r = be.read(x, host);
        if (!r.ok()) seen = r.error().message();
        return be.synchronize();
      },
      options);
  CHECK_FALSE(s.ok());
  CHECK_THAT(seen, Catch::Contains("cpu rank 0: all_reduce on group 5"));
}

}  // namespace
}  // namespace meshtrain
