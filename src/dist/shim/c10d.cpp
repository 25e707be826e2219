// The C face of libtorch's c10d for src/dist: a TCPStore rendezvous, a Gloo
// process group, and the four collectives the trainer needs. Every entry
// point catches C++ exceptions and reports them as text, so nothing unwinds
// into Rust. Tensors arrive as tch's `torch::Tensor*` handles.
#define USE_C10D_GLOO 1

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout;
};

void report(char* err, size_t len, const char* what) {
  if (err == nullptr || len == 0) {
    return;
  }
  std::strncpy(err, what, len - 1);
  err[len - 1] = '\0';
}

template <typename F>
int guarded(char* err, size_t len, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    report(err, len, e.what());
  } catch (...) {
    report(err, len, "unknown C++ exception");
  }
  return 1;
}

std::vector<at::Tensor> tensors_of(torch::Tensor** ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(*ts[i]);
  }
  return out;
}

void finish(const c10::intrusive_ptr<c10d::Work>& work, const Group& g) {
  // Work::wait throws the collective's error (a peer that closed its
  // connection, or the timeout) instead of returning false.
  if (!work->wait(g.timeout)) {
    throw std::runtime_error("collective did not finish within the timeout");
  }
}

} // namespace

extern "C" {

// Rendezvous through a TCPStore at host:port and build a Gloo group.
// `store_server`: this process hosts the store (rank 0 when no launcher
// does). `prefix`: a key prefix when the store is shared with a launcher
// (torchrun's agent store), empty otherwise. `bind_host`: the address Gloo
// binds to, empty for the machine's hostname (loopback when it does not
// resolve).
void* falcon_c10d_new(
    const char* host,
    uint16_t port,
    int store_server,
    const char* prefix,
    int rank,
    int world,
    int64_t timeout_ms,
    const char* bind_host,
    char* err,
    size_t errlen) {
  Group* out = nullptr;
  guarded(err, errlen, [&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = store_server != 0;
    opts.numWorkers = static_cast<size_t>(world);
    // Every process registers (a client only increments the count; the
    // server waits for all of them), as PyTorch's own rendezvous does.
    opts.waitWorkers = true;
    opts.timeout = timeout;
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    if (prefix != nullptr && prefix[0] != '\0') {
      store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), store);
    }
    auto gopts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (bind_host != nullptr && bind_host[0] != '\0') {
      gopts->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(std::string(bind_host)));
    } else {
      gopts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gopts);
    out = new Group{store, pg, timeout};
  });
  return out;
}

void falcon_c10d_free(void* g) {
  delete static_cast<Group*>(g);
}

// One tensor per call: c10d's tensor list means one tensor replicated on
// several local devices, not a batch of different tensors.
// op: 0 sum, 1 max, 2 min (Gloo has no average; src/dist divides).
int falcon_c10d_allreduce(
    void* g, torch::Tensor* t, int op, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    auto& group = *static_cast<Group*>(g);
    std::vector<at::Tensor> tensors{*t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == 1 ? c10d::ReduceOp::MAX
        : op == 2           ? c10d::ReduceOp::MIN
                            : c10d::ReduceOp::SUM;
    opts.timeout = group.timeout;
    finish(group.pg->allreduce(tensors, opts), group);
  });
}

int falcon_c10d_broadcast(
    void* g, torch::Tensor* t, int root, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    auto& group = *static_cast<Group*>(g);
    std::vector<at::Tensor> tensors{*t};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = group.timeout;
    finish(group.pg->broadcast(tensors, opts), group);
  });
}

// `outputs` holds world-size tensors shaped like `input`.
int falcon_c10d_allgather(
    void* g,
    torch::Tensor* input,
    torch::Tensor** outputs,
    size_t n,
    char* err,
    size_t errlen) {
  return guarded(err, errlen, [&] {
    auto& group = *static_cast<Group*>(g);
    std::vector<at::Tensor> in{*input};
    std::vector<std::vector<at::Tensor>> out{tensors_of(outputs, n)};
    c10d::AllgatherOptions opts;
    opts.timeout = group.timeout;
    finish(group.pg->allgather(out, in, opts), group);
  });
}

int falcon_c10d_barrier(void* g, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    auto& group = *static_cast<Group*>(g);
    c10d::BarrierOptions opts;
    opts.timeout = group.timeout;
    finish(group.pg->barrier(opts), group);
  });
}

} // extern "C"
