// otel-torchdist's native part: a process group for DDP's reducer that records every collective the
// reducer issues through it (gradient buckets, the unused-parameter map, bucket-rebuild broadcasts) without
// running any Python, so DDP keeps its hook-free path (gradients scaled while copied into the bucket).
//
// The reducer holds this group in place of the model's own; each call goes to the real group unchanged.
// The record is an Entry: issued (start time, sizes, the group's sequence number, the training step that
// the Python side last wrote into the step slot, the autograd graph task), then completed in a callback on
// the collective's future (end time, error). The reducer is handed a work whose future completes after that
// callback, so a backward pass that returns has every one of its entries in the done list: the Python
// drain sees a step's collectives before the step's close. Python takes entries with take() (done) and
// in_flight() (issued, not completed: what the hang watchdog reports).
#include <torch/extension.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"

namespace otel_native {
// time.perf_counter_ns() on Linux: CLOCK_MONOTONIC, so records from here, from hot_path.cpp and from Python
// share one clock.
int64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}
}  // namespace otel_native

namespace {

using otel_native::now_ns;

// Bumped whenever the entry tuple or the module's functions change: the Python side refuses a build of
// another version (a stale cache).
constexpr int kVersion = 12;

enum Op : int { kAllreduce = 0, kBroadcast = 1 };

struct Entry {
  int64_t gid = 0;  // the Python side's group id (groups.BY_ID)
  int64_t owner = 0;  // the Python side's number for the model whose reducer holds the group
  int op = 0;
  int64_t t0 = 0, t1 = 0;
  int64_t nbytes = 0, numel = 0, ntensors = 0;
  at::ScalarType dtype = at::ScalarType::Undefined;
  int64_t seq = -1;
  int64_t root = -1;  // group rank of a broadcast's root
  int redop = -1;
  int64_t step = 0;  // the step slot's value at issue: the training step's index, 0 outside steps
  int64_t graph_task = -1;  // autograd graph task issuing it, -1 outside a backward pass
  int64_t batch = 0;  // the batch slot's value at issue (DDP's Join hook numbers its shadow passes there)
  int64_t gpu_ns = -1;  // the GPU's duration, as the completion hook measured it (-1: not measured)
  bool hooked = false;  // ended by the completion hook's report (report()), not by its future
  bool failed = false;
  std::string error;
};

// Everything shared by the groups of a process, behind one lock: one take() drains them all.
struct Log {
  std::mutex mu;
  std::vector<Entry> done;
  std::unordered_map<uint64_t, Entry> flying;
  uint64_t next_key = 0;
  size_t capacity = 65536;  // done entries kept for the drain; beyond, counted in dropped
  int64_t dropped = 0;
  // Hooked entries in flight by (group id, sequence number), for report().
  std::map<std::pair<int64_t, int64_t>, uint64_t> by_seq;
  // Reports that came before their entry's sequence number was known (the hook thread can see a tiny
  // collective done before the issuing thread reads the number), or for a work no entry is for (Python's
  // records, works issued elsewhere): (gid, seq) -> (t1, gpu_ns), oldest first, at most kReportsKept.
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> reports;
  std::deque<std::pair<int64_t, int64_t>> report_order;
};

constexpr size_t kReportsKept = 256;

Log& log() {
  static Log* instance = new Log();  // never destroyed: callbacks may run on backend threads at exit
  return *instance;
}

// Written by Python, read here: [0] the current training step's index (0: none), [1] a batch number that
// Python bumps around calls that issue buckets outside a backward pass (DDP's Join hook).
alignas(16) int64_t slots[2] = {0, 0};

uint64_t begin_entry(const Entry& e) {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  uint64_t key = l.next_key++;
  l.flying.emplace(key, e);
  return key;
}

void finish(Log& l, Entry&& e) {
  if (l.done.size() < l.capacity) {
    l.done.push_back(std::move(e));
  } else {
    ++l.dropped;
  }
}

// Ends a hooked entry in flight with its report (the log's lock held).
void end_reported(Log& l, std::unordered_map<uint64_t, Entry>::iterator it, int64_t t1, int64_t gpu_ns) {
  Entry e = std::move(it->second);
  l.flying.erase(it);
  e.t1 = t1;
  e.gpu_ns = gpu_ns;
  finish(l, std::move(e));
}

void set_seq(uint64_t key, int64_t seq) {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  auto it = l.flying.find(key);
  if (it == l.flying.end()) return;
  Entry& e = it->second;
  e.seq = seq;
  if (!e.hooked) return;
  auto id = std::make_pair(e.gid, seq);
  auto early = l.reports.find(id);
  if (early == l.reports.end()) {
    l.by_seq[id] = key;
    return;
  }
  auto [t1, gpu_ns] = early->second;
  l.reports.erase(early);  // its report_order slot goes when it comes to the front
  end_reported(l, it, t1, gpu_ns);
}

// The completion hook's report of (gid, seq): ends the hooked entry in flight, else keeps the report for
// an entry about to be numbered. True when it ended an entry.
bool report(int64_t gid, int64_t seq, int64_t t1, int64_t gpu_ns) {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  auto id = std::make_pair(gid, seq);
  auto found = l.by_seq.find(id);
  if (found != l.by_seq.end()) {
    auto it = l.flying.find(found->second);
    l.by_seq.erase(found);
    if (it != l.flying.end()) {
      end_reported(l, it, t1, gpu_ns);
      return true;
    }
  }
  while (l.report_order.size() >= kReportsKept) {
    l.reports.erase(l.report_order.front());
    l.report_order.pop_front();
  }
  if (l.reports.emplace(id, std::make_pair(t1, gpu_ns)).second) l.report_order.push_back(id);
  return false;
}

// Hooked entries still waiting for their report (what the exit flush waits for).
int64_t waiting() {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  return int64_t(l.by_seq.size());
}

// ------------------------------------------------------------------ the NCCL completion hook, in C++
// ProcessGroupNCCL calls its completion hook from its hook thread for every collective. A Python hook makes
// that thread take the GIL (and a new Python thread state) each time, which the training thread pays for:
// about 45 us a collective on an H200's host (benchmarks/results/2026-11-27-gpu-collective-cost.md). This
// one runs no Python: it ends a DDP entry of this file (report()) or files the completion for nccl.py,
// which joins it with its Python record when the drain takes them (take_completions(); a COALESCED work,
// perhaps a point-to-point batch numbered on its own count, goes there with its start for nccl.py's check,
// never to a DDP entry: DDP's buckets are all_reduce works). torch takes one
// hook per group for the group's life: each hook reads its slot, the group id of the current
// instrumentation (-1: none, the completion is dropped), which Python sets (set_hook_group()).
struct Completions {
  std::mutex mu;
  std::vector<std::array<int64_t, 6>> items;  // (gid, seq, t1, gpu_ns, t0, coalesced), in the order reported
  int64_t dropped = 0;
  std::deque<std::atomic<int64_t>> slots;  // hook id -> group id; a deque keeps each slot where it is
};

constexpr size_t kCompletionsKept = 65536;

Completions& completions() {
  static Completions* instance = new Completions();  // never destroyed: the hook thread may run at exit
  return *instance;
}

// A WorkInfo time on the records' clock (CLOCK_MONOTONIC, which libstdc++'s steady_clock reads); a
// system_clock time (older torch) moved by the two clocks' difference now. -1: not stamped.
template <typename TimePoint>
int64_t on_records_clock(const TimePoint& t) {
  using Clock = typename TimePoint::clock;
  auto since = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  if (since <= 0) return -1;
  if constexpr (std::is_same_v<Clock, std::chrono::steady_clock>) {
    return int64_t(since);
  } else {
    auto ago = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
    return now_ns() - int64_t(ago);
  }
}

void on_completion(const std::atomic<int64_t>& slot, const c10d::WorkInfo& info) noexcept {
  int64_t gid = slot.load(std::memory_order_acquire);
  if (gid < 0) return;  // uninstrumented: the hook stays with the group
  auto op = info.opType;
  // A send/recv's number is its group's last collective's: never join those
  if (op == c10d::OpType::SEND || op == c10d::OpType::RECV || op == c10d::OpType::RECVANYSOURCE) return;
  try {
    int64_t seq = int64_t(info.seq);
    int64_t t1 = on_records_clock(info.timeFinished);
    if (t1 < 0) t1 = now_ns();
    int64_t t0 = on_records_clock(info.timeStarted);
    int64_t coalesced = op == c10d::OpType::COALESCED ? 1 : 0;
    double seconds = std::chrono::duration<double>(info.activeDuration).count();
    int64_t gpu_ns = seconds >= 0 ? int64_t(std::llround(seconds * 1e9)) : -1;  // a float's seconds: to the nearest ns
    if (!coalesced && report(gid, seq, t1, gpu_ns)) return;  // a DDP entry of this file, ended
    auto& c = completions();
    std::lock_guard<std::mutex> g(c.mu);
    if (c.items.size() < kCompletionsKept) {
      c.items.push_back({gid, seq, t1, gpu_ns, t0, coalesced});
    } else {
      ++c.dropped;
    }
  } catch (...) {
    // never into ProcessGroupNCCL's thread (an allocation that failed: this completion is not recorded)
  }
}

// Registers the hook on `pg` (raises for a backend without one: only NCCL has it), reporting as group `gid`.
// Returns the hook's id for set_hook_group().
int64_t hook_group(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t gid) {
  auto& c = completions();
  std::atomic<int64_t>* slot;
  int64_t id;
  {
    std::lock_guard<std::mutex> g(c.mu);
    slot = &c.slots.emplace_back(-1);
    id = int64_t(c.slots.size()) - 1;
  }
  pg->registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>(
      [slot](std::shared_ptr<c10d::WorkInfo> info) {
        if (info) on_completion(*slot, *info);
      }));
  slot->store(gid, std::memory_order_release);
  return id;
}

// Hook `id`'s slot (it stays where it is: the deque only grows).
std::atomic<int64_t>& hook_slot(int64_t id, const char* who) {
  auto& c = completions();
  std::lock_guard<std::mutex> g(c.mu);
  if (id < 0 || id >= int64_t(c.slots.size())) throw py::value_error(std::string(who) + ": no such hook");
  return c.slots[size_t(id)];
}

void set_hook_group(int64_t id, int64_t gid) { hook_slot(id, "set_hook_group").store(gid, std::memory_order_release); }

// Test seam: what the hook does with a completion of (gid, seq), started at t0 and done at t1
// (tests/test_native_nccl_hook.py; ProcessGroupNCCL cannot exist without a GPU).
void complete_as_hook(int64_t hook, int64_t seq, int64_t t1_ns, double gpu_seconds, int op, int64_t t0_ns) {
  const auto& slot = hook_slot(hook, "complete_as_hook");
  // WorkInfo's clock is steady_clock in this project's torch, system_clock in older ones: built either way
  using TimePoint = decltype(std::declval<c10d::WorkInfo>().timeFinished);
  TimePoint t1{std::chrono::duration_cast<typename TimePoint::duration>(std::chrono::nanoseconds(t1_ns))};
  TimePoint t0{std::chrono::duration_cast<typename TimePoint::duration>(std::chrono::nanoseconds(t0_ns))};
  c10d::WorkInfo info(static_cast<c10d::OpType>(op), uint64_t(seq), t0, t1,
                      std::chrono::duration_cast<decltype(std::declval<c10d::WorkInfo>().activeDuration)>(
                          std::chrono::duration<double>(gpu_seconds)));
  on_completion(slot, info);
}

// A hook slot for complete_as_hook(), reporting as group `gid` (no process group: the tests' stand-in).
int64_t test_hook(int64_t gid) {
  auto& c = completions();
  std::lock_guard<std::mutex> g(c.mu);
  c.slots.emplace_back(gid);
  return int64_t(c.slots.size()) - 1;
}

// The completions filed since the last call, [(gid, seq, t1, gpu_ns, t0, coalesced)] (gpu_ns -1: not
// measured; t0 -1: not stamped), and how many were dropped (the table was full: the drain had not taken
// them for 65 536 collectives).
py::tuple take_completions() {
  std::vector<std::array<int64_t, 6>> items;
  int64_t dropped;
  {
    auto& c = completions();
    std::lock_guard<std::mutex> g(c.mu);
    items.swap(c.items);
    dropped = c.dropped;
    c.dropped = 0;
  }
  py::list out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    out[i] = py::make_tuple(it[0], it[1], it[2], it[3], it[4], it[5]);
  }
  return py::make_tuple(out, dropped);
}

void drop_entry(uint64_t key) noexcept {
  try {
    auto& l = log();
    std::lock_guard<std::mutex> g(l.mu);
    l.flying.erase(key);
  } catch (...) {
  }
}

void end_entry(uint64_t key, int64_t t1, bool failed, std::string error, int64_t seq) {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  auto it = l.flying.find(key);
  if (it == l.flying.end()) return;
  Entry e = std::move(it->second);
  l.flying.erase(it);
  e.t1 = t1;
  e.failed = failed;
  e.error = std::move(error);
  if (seq >= 0) e.seq = seq;
  finish(l, std::move(e));
}

// The work the reducer gets: the real one, with a future that completes once the entry is ended.
class TimedWork : public c10d::Work {
 public:
  TimedWork(c10::intrusive_ptr<c10d::Work> inner, c10::intrusive_ptr<c10::ivalue::Future> fut)
      : inner_(std::move(inner)), fut_(std::move(fut)) {}

  bool isCompleted() override { return fut_->completed(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override {
    bool ok = inner_->wait(timeout);  // raises the collective's error, as the real work's wait does
    fut_->wait();
    return ok;
  }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

class TimedGroup : public c10d::ProcessGroup {
 public:
  TimedGroup(const c10::intrusive_ptr<c10d::ProcessGroup>& inner, int64_t gid, int64_t owner, bool hooked)
      : c10d::ProcessGroup(inner->getRank(), inner->getSize()), inner_(inner), gid_(gid), owner_(owner), hooked_(hooked) {
    auto bound = inner_->getBoundDeviceId();
    if (bound) setBoundDeviceId(bound);
    // Any call not recorded below reaches the real group's backends, registered here as well, each under
    // its own type ("cpu:gloo,cuda:nccl": under the default's one type both devices got the first one seen)
    for (const auto& device : inner_->getDeviceTypes()) {
      auto backend = inner_->getBackend(device.type());
      setBackend(device.type(), strToBackendType(backend->getBackendName()), backend);
    }
    setDefaultBackend(inner_->getBackendType());
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return issue(kAllreduce, tensors, -1, int(opts.reduceOp.op_), [&] { return inner_->allreduce(tensors, opts); });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    return issue(kBroadcast, tensors, opts.rootRank, -1, [&] { return inner_->broadcast(tensors, opts); });
  }

  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  const std::string getBackendName() const override { return inner_->getBackendName(); }

  c10::intrusive_ptr<c10d::ProcessGroup> inner() const { return inner_; }
  int64_t gid() const { return gid_; }

 private:
  // Records around the real call. A failure of the recording itself (an allocation) never reaches the
  // reducer: the call then goes out unrecorded, or its work is handed back as it is.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> issue(int op, std::vector<at::Tensor>& tensors, int64_t root, int redop, Call call) {
    uint64_t key = 0;
    try {
      Entry e;
      e.gid = gid_;
      e.owner = owner_;
      e.op = op;
      e.root = root;
      e.redop = redop;
      e.ntensors = int64_t(tensors.size());
      for (const auto& t : tensors) {
        // a sparse gradient's message is its values (nbytes() refuses sparse tensors)
        const at::Tensor& dense = t.is_sparse() ? t._values() : t;
        e.nbytes += dense.numel() * int64_t(dense.element_size());
        e.numel += dense.numel();
      }
      if (!tensors.empty()) e.dtype = tensors[0].scalar_type();
      e.step = __atomic_load_n(&slots[0], __ATOMIC_RELAXED);
      e.batch = __atomic_load_n(&slots[1], __ATOMIC_RELAXED);
      e.graph_task = torch::autograd::get_current_graph_task_id();
      e.hooked = hooked_;
      e.t0 = now_ns();
      key = begin_entry(e);
    } catch (...) {
      return call();
    }
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = call();
    } catch (const std::exception& exc) {
      try {
        end_entry(key, now_ns(), true, exc.what(), -1);
      } catch (...) {
      }
      throw;  // the collective's own exception, unchanged
    }
    try {
      int64_t seq = -1;
      if (hooked_) {
        // The work's own number is the one the completion hook reports, even when another thread issued
        // on the group meanwhile; the group's counter is read where the backend keeps none.
        try {
          seq = int64_t(work->getSequencenumber());
        } catch (...) {
        }
      }
      if (seq < 0) seq = int64_t(inner_->getSequenceNumberForGroup());
      set_seq(key, seq);  // before completion, for the hang watchdog's in_flight()
      // NCCL's future completes at enqueue: the entry waits for the completion hook's report instead, and
      // the reducer gets the real work, its future untouched.
      if (hooked_) return work;
      auto fut = work->getFuture();
      auto child = fut->then(
          [key, seq](c10::ivalue::Future& parent) -> c10::IValue {
            try {
              int64_t t1 = now_ns();
              if (parent.hasError()) {
                end_entry(key, t1, true, parent.tryRetrieveErrorMessage(), seq);
              } else {
                end_entry(key, t1, false, std::string(), seq);
              }
            } catch (...) {
            }
            return parent.value();  // rethrows a failure into the reducer's future
          },
          fut->elementType());
      return c10::make_intrusive<TimedWork>(work, std::move(child));
    } catch (...) {
      drop_entry(key);
      return work;
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> inner_;
  int64_t gid_;
  int64_t owner_;
  bool hooked_;  // a group whose completion hook reports each collective (NCCL with timing on)
};

// One tuple per entry, built with the C API: through pybind11's make_tuple and dtype caster, take() cost a
// third more per entry on the drain thread (375 ns against 275 ns, measured).
PyObject* entry_tuple(const Entry& e) {
  PyObject* t = PyTuple_New(18);
  if (t == nullptr) return nullptr;
  PyObject* dtype = e.dtype == at::ScalarType::Undefined ? Py_None : reinterpret_cast<PyObject*>(torch::getTHPDtype(e.dtype));
  Py_INCREF(dtype);
  PyObject* error;
  if (e.failed) {
    error = PyUnicode_DecodeUTF8(e.error.data(), Py_ssize_t(e.error.size()), "replace");
  } else {
    error = Py_None;
    Py_INCREF(error);
  }
  PyObject* items[18] = {
      PyLong_FromLongLong(e.gid), PyLong_FromLong(e.op), PyLong_FromLongLong(e.t0), PyLong_FromLongLong(e.t1),
      PyLong_FromLongLong(e.nbytes), PyLong_FromLongLong(e.numel), PyLong_FromLongLong(e.ntensors), dtype,
      PyLong_FromLongLong(e.seq), PyLong_FromLongLong(e.root), PyLong_FromLong(e.redop), PyLong_FromLongLong(e.step),
      PyLong_FromLongLong(e.graph_task), error, PyLong_FromLongLong(e.batch), PyLong_FromLongLong(e.owner),
      PyLong_FromLongLong(e.gpu_ns), PyBool_FromLong(e.hooked)};
  bool ok = true;
  for (int i = 0; i < 18; ++i) {
    if (items[i] == nullptr) ok = false;
    PyTuple_SET_ITEM(t, i, items[i]);  // a null slot is fine for the tuple's own deallocation
  }
  if (!ok) {
    Py_DECREF(t);
    return nullptr;
  }
  return t;
}

py::list as_list(const std::vector<Entry>& got) {
  py::list out(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    PyObject* t = entry_tuple(got[i]);
    if (t == nullptr) throw py::error_already_set();
    PyList_SET_ITEM(out.ptr(), Py_ssize_t(i), t);
  }
  return out;
}

// The completed entries, removed from the log.
std::vector<Entry> take_done() {
  std::vector<Entry> got;
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  got.swap(l.done);
  return got;
}

py::list take() { return as_list(take_done()); }

// The entries in flight; ``remove``: taken out too, so a completion after this finds no entry and records
// nothing (abandon, at close).
py::list flying(bool remove) {
  std::vector<Entry> got;
  {
    auto& l = log();
    std::lock_guard<std::mutex> g(l.mu);
    got.reserve(l.flying.size());
    for (auto& kv : l.flying) got.push_back(remove ? std::move(kv.second) : kv.second);
    if (remove) {
      l.flying.clear();
      l.by_seq.clear();
    }
  }
  return as_list(got);
}

// What take_split() needs from the Python side, set once per load by split_setup().
struct Split {
  PyObject* ring = nullptr;  // record.RECENT_STEPS: a step's context by serial & mask
  Py_ssize_t mask = 0;
  PyObject* models = nullptr;  // ddp_native._models: model number -> (forward context, backward context)
  PyObject* backward = nullptr;  // the backward context of a model not numbered (ddp_native._PHASES[1])
  PyObject* redops = nullptr;  // reduce op number -> torch's ReduceOp
  PyObject *op = nullptr, *kind = nullptr, *source = nullptr, *end_future = nullptr, *end_hooked = nullptr;
  bool ready = false;
};

Split S;

void split_setup(py::object ring, int64_t mask, py::dict models, py::object backward, py::dict redops, py::tuple names) {
  if (!PyList_CheckExact(ring.ptr()) || names.size() != 5) throw py::value_error("split_setup: a list and five names");
  auto keep = [](PyObject*& slot, PyObject* value) { Py_XSETREF(slot, Py_NewRef(value)); };
  keep(S.ring, ring.ptr());
  S.mask = Py_ssize_t(mask);
  keep(S.models, models.ptr());
  keep(S.backward, backward.ptr());
  keep(S.redops, redops.ptr());
  keep(S.op, names[0].ptr());
  keep(S.kind, names[1].ptr());
  keep(S.source, names[2].ptr());
  keep(S.end_future, names[3].ptr());
  keep(S.end_hooked, names[4].ptr());
  S.ready = true;
}

// The step context of an entry's step when that step is known and untraced, else nullptr (borrowed).
PyObject* untraced_step(const Entry& e) {
  if (e.step <= 0) return nullptr;
  int64_t serial = e.step - 1;  // the slot holds the serial + 1
  if (Py_ssize_t(serial & S.mask) >= PyList_GET_SIZE(S.ring)) return nullptr;
  PyObject* ctx = PyList_GET_ITEM(S.ring, serial & S.mask);
  if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) < 4 || PyTuple_GET_ITEM(ctx, 3) != Py_False) return nullptr;
  PyObject* got = PyTuple_GET_ITEM(ctx, 0);
  if (!PyLong_CheckExact(got)) return nullptr;
  int overflow = 0;
  long long have = PyLong_AsLongLongAndOverflow(got, &overflow);
  if (overflow || have != serial) {
    PyErr_Clear();
    return nullptr;
  }
  return ctx;
}

// A gradient bucket's record of an untraced step, as ddp_native.take's fast path writes it (record.py's
// fields), or nullptr with an error set.
PyObject* bucket_record(const Entry& e, PyObject* step) {
  using namespace otel_native::record;
  // Owned at once: an allocation below may run the garbage collector, and a finalizer another thread that
  // replaces the ring's slot or the models' entry.
  otel_native::Ref stepctx(Py_NewRef(step)), model, redop;
  {
    otel_native::Ref owner(PyLong_FromLongLong(e.owner));
    PyObject* pair = owner.p ? PyDict_GetItemWithError(S.models, owner.p) : nullptr;  // borrowed
    if (pair != nullptr && PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2) model.p = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    if (PyErr_Occurred()) PyErr_Clear();
  }
  {
    otel_native::Ref key(PyLong_FromLong(e.redop));
    PyObject* found = key.p ? PyDict_GetItemWithError(S.redops, key.p) : nullptr;  // borrowed
    if (found != nullptr) redop.p = Py_NewRef(found);
    if (PyErr_Occurred()) PyErr_Clear();
  }
  PyObject* rec = PyTuple_New(kFields);
  if (rec == nullptr) return nullptr;
  auto set = [rec](Py_ssize_t i, PyObject* v) { PyTuple_SET_ITEM(rec, i, v); return v != nullptr; };
  auto none = [] { return Py_NewRef(Py_None); };
  PyObject* dtype = e.dtype == at::ScalarType::Undefined ? Py_None : reinterpret_cast<PyObject*>(torch::getTHPDtype(e.dtype));
  // Stops at the first failed allocation; the slots left empty are fine for the tuple's deallocation.
  bool ok = set(kOp, Py_NewRef(S.op)) && set(kKind, Py_NewRef(S.kind)) && set(kSource, Py_NewRef(S.source)) &&
            set(kGroup, PyLong_FromLongLong(e.gid)) && set(kSeq, e.seq >= 0 ? PyLong_FromLongLong(e.seq) : none()) &&
            set(kTStart, PyLong_FromLongLong(e.t0)) && set(kTEnd, PyLong_FromLongLong(e.t1)) &&
            set(kNbytes, PyLong_FromLongLong(e.nbytes)) && set(kDtype, Py_NewRef(dtype)) &&
            set(kShapes, e.ntensors == 1 ? Py_BuildValue("(iL)", 1, (long long)e.numel) : PyTuple_New(0)) &&
            set(kNumel, PyLong_FromLongLong(e.numel)) && set(kNtensors, PyLong_FromLongLong(e.ntensors)) &&
            set(kAsync, Py_NewRef(Py_True)) && set(kRoot, none()) && set(kPeer, none()) &&
            set(kRedop, Py_NewRef(redop.p ? redop.p : Py_None)) &&
            set(kEnd, Py_NewRef(e.hooked ? S.end_hooked : S.end_future)) && set(kError, none()) && set(kParent, none()) &&
            set(kExtra, none()) && set(kGpuNs, e.gpu_ns >= 0 ? PyLong_FromLongLong(e.gpu_ns) : none()) &&
            set(kInner, Py_NewRef(Py_False)) && set(kCtx, Py_NewRef(model.p ? model.p : S.backward)) &&
            set(kBwd, PyBool_FromLong(e.graph_task != -1)) && set(kStepCtx, stepctx.release());
  if (!ok) {
    Py_DECREF(rec);
    if (!PyErr_Occurred()) PyErr_NoMemory();
    return nullptr;
  }
  return rec;
}

// take() split in two: the records of untraced steps' gradient buckets, made here (no place in their
// backward pass is waited for: only the metrics see them), and the other entries as take() gives them.
py::tuple take_split() {
  if (!S.ready) throw py::value_error("take_split: split_setup() first");
  py::list fast, rest;
  for (const Entry& e : take_done()) {
    PyObject* step = (e.op == kAllreduce && !e.failed && at::isFloatingType(e.dtype)) ? untraced_step(e) : nullptr;
    PyObject* item = step != nullptr ? bucket_record(e, step) : entry_tuple(e);
    if (item == nullptr) throw py::error_already_set();
    if (PyList_Append(step != nullptr ? fast.ptr() : rest.ptr(), item) < 0) {
      Py_DECREF(item);
      throw py::error_already_set();
    }
    Py_DECREF(item);
  }
  return py::make_tuple(fast, rest);
}

int64_t take_dropped() {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  int64_t n = l.dropped;
  l.dropped = 0;
  return n;
}

void set_capacity(int64_t n) {
  auto& l = log();
  std::lock_guard<std::mutex> g(l.mu);
  l.capacity = n > 0 ? size_t(n) : 0;
}

}  // namespace

namespace otel_hot {
int add_to(PyObject* module);  // hot_path.cpp: the c10d wrapper's common case
}
namespace otel_encode {
int add_to(PyObject* module);  // encode.cpp: a span's OTLP encodings
}
namespace otel_fold {
int add_to(PyObject* module);  // fold.cpp: the metric store and the fold of unsampled records
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module::import("torch.distributed");  // registers the ProcessGroup type this one derives from
  py::class_<TimedGroup, c10d::ProcessGroup, c10::intrusive_ptr<TimedGroup>>(m, "TimedGroup")
      .def(py::init<const c10::intrusive_ptr<c10d::ProcessGroup>&, int64_t, int64_t, bool>(), py::arg("inner"),
           py::arg("gid"), py::arg("owner") = 0, py::arg("hooked") = false)
      .def_property_readonly("inner", &TimedGroup::inner)
      .def_property_readonly("gid", &TimedGroup::gid);
  m.def("take", &take, "Entries of completed collectives, oldest first, removed from the log.");
  m.def("split_setup", &split_setup, "What take_split() reads: the recent steps, the models' contexts, reduce ops, names.");
  m.def("take_split", &take_split, "take(), with untraced steps' gradient buckets made into records: (records, entries).");
  m.def("in_flight", [] { return flying(false); }, "Entries of collectives issued and not completed.");
  m.def("abandon", [] { return flying(true); }, "Entries of collectives in flight, removed: reported unfinished, never completed.");
  m.def("report", &report, py::arg("gid"), py::arg("seq"), py::arg("t1"), py::arg("gpu_ns"),
        "The completion hook's report of a collective: ends its hooked entry (True), else is kept for it.");
  m.def("waiting", &waiting, "Hooked entries in flight that wait for their report.");
  m.def("hook_group", &hook_group, py::arg("pg"), py::arg("gid"),
        "Registers the C++ completion hook on an NCCL group (timing on first), reporting as gid: its id.");
  m.def("set_hook_group", &set_hook_group, py::arg("hook"), py::arg("gid"),
        "The group id a hook reports as from now on (-1: none, completions dropped).");
  m.def("take_completions", &take_completions,
        "([(gid, seq, t1, gpu_ns, t0, coalesced)] the C++ hook filed, dropped).");
  m.def("complete_as_hook", &complete_as_hook, py::arg("hook"), py::arg("seq"), py::arg("t1_ns"),
        py::arg("gpu_seconds"), py::arg("op") = 1, py::arg("t0_ns") = 0,
        "Tests: what the hook does with a completion (t0_ns 0: not stamped).");
  m.def("test_hook", &test_hook, py::arg("gid"), "Tests: a hook slot without a process group.");
  m.def("take_dropped", &take_dropped, "Entries dropped since the last call (the done list was full).");
  m.def("set_capacity", &set_capacity, "How many completed entries wait for take() before new ones are dropped.");
  m.def("now_ns", &now_ns, "The clock entries are stamped with (time.perf_counter_ns's).");
  m.def("slots", [] { return py::memoryview::from_memory(slots, sizeof(slots), false); },
        "The two int64 the Python side writes: the current step's index, the batch number.");
  if (otel_hot::add_to(m.ptr()) < 0 || otel_encode::add_to(m.ptr()) < 0 ||
      otel_fold::add_to(m.ptr()) < 0) throw py::error_already_set();
  m.attr("VERSION") = kVersion;
}
