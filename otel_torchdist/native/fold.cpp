// The drain's fold of an unsampled record in C: the collective metrics' store (metrics.MetricStore's
// counterpart, the same snapshot) and fold(), which does for a record of an unsampled step what
// Pipeline.process does: its step's intervals, count and bytes, its series' histogram and counters, its
// group's last completed sequence number. With default sampling nearly every record is one of those, and
// Pipeline.process cost about 1.7 us a record in Python.
//
// fold() takes records from the left of the queue while they are ones it handles, and leaves the first
// other one at the front for Pipeline.process: a sampled step's record, one under a caller's span, one
// outside a step unless the sampler keeps no root (a rank trace_ranks leaves out, always_off), one of a
// group size whose bus factor is not known yet, anything unusual. It reads everything a record needs
// before taking it, so a record is either folded whole or left as it was.
//
// Contract with the Python side (Pipeline.use_native): fold_setup() once per load with the objects below;
// MetricStore(bounds, series) in place of metrics.MetricStore, which also keeps the steps' aggregates of the
// records folded (take_step at a step's close: drain/step_close.py); fold(store, queue, roots_unsampled,
// report, tap) per drain turn, report(exc) told of a record whose fold failed once taken (it is counted, and
// the fold goes on), and tap, None or tap(op, group label, seconds) for every record folded
// (Pipeline.meter.collective_value).
// Everything here runs holding the GIL, which is the store's lock (the exporters' snapshot() holds it too).
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"

namespace otel_fold {
namespace {

using otel_native::Raised;
using otel_native::Ref;
using namespace otel_native::record;

// Records folded per call before returning to the interpreter, whose eval loop is where a training thread
// waiting for the GIL gets it (a C loop over a whole drain would hold it for milliseconds).
constexpr Py_ssize_t kBatch = 256;
// Distinct (op, group) string objects remembered by identity; past this the memo starts again (the series
// themselves are never forgotten).
constexpr size_t kMemo = 4096;

struct Globals {
  PyObject* by_id = nullptr;  // groups.BY_ID: a record's group index -> GroupInfo
  PyObject* factors = nullptr;  // bandwidth.FACTORS: (kind, group size) -> bus factor
  PyObject* unfinished = nullptr;  // names.END_UNFINISHED
  PyObject* wait_end = nullptr;  // names.END_WAIT
  // drain/step_stats.py's Intervals.CAP, HEAD and KEEP; drain/pipeline.py's STEPS_OPEN and STEPS_OPEN_MAX
  Py_ssize_t cap = 0, head = 0, keep = 0, steps_open = 0, steps_open_max = 0;
  PyObject *s_size, *s_label, *s_last_completed, *s_head, *s_tail, *s_folded, *s_folded_end, *s_collectives,
      *s_nbytes, *s_popleft;
  bool ready = false;
};

Globals G;

// ------------------------------------------------------------------------------------------- the store

struct Series {
  std::vector<int64_t> buckets;
  int64_t count = 0, errors = 0;
  __int128 bytes = 0;  // message sizes add up past 2**63 only after years at line rate; exact anyway
  double bus = 0, sum = 0, min = 0, max = 0;
  std::map<Py_ssize_t, PyObject*> exemplars;  // bucket -> (seconds, time_ns, trace_id, span_id), owned
  PyObject* key = nullptr;  // (op, group), owned
};

struct PtrPairHash {
  size_t operator()(const std::pair<PyObject*, PyObject*>& p) const {
    return std::hash<void*>()(p.first) * 31u + std::hash<void*>()(p.second);
  }
};

using Interval = std::pair<int64_t, int64_t>;

// What the records folded here tell of one training step: drain/step_stats.py's StepStats for them (count,
// bytes and in-flight intervals, bounded as its Intervals are: the same CAP, HEAD, KEEP and merge), so that
// an unsampled step makes no Python object until its close takes these (take_step).
struct StepAgg {
  int64_t count = 0;
  __int128 nbytes = 0;
  uint64_t opened = 0;  // its place in the order steps were opened here
  std::vector<Interval> head, tail;
  int64_t folded = 0;
  bool has_end = false;  // folded_end is not None
  int64_t folded_end = 0;
};

struct Impl {
  std::vector<double> bounds;
  std::vector<Series> series;
  std::unordered_map<long long, StepAgg> steps;  // step serial -> its folded records
  std::map<uint64_t, long long> opened_order;  // opened -> serial, the oldest first
  uint64_t opened = 0, closed_opened = 0;  // Pipeline._opened and closed_opened, for these
  // (op, group) string objects -> series position; each key's two references held in `held`
  std::unordered_map<std::pair<PyObject*, PyObject*>, size_t, PtrPairHash> memo;
  std::vector<PyObject*> held;

  void forget_memo() {
    memo.clear();
    for (PyObject* o : held) Py_DECREF(o);
    held.clear();
  }
  ~Impl() {
    forget_memo();
    for (Series& s : series) {
      Py_XDECREF(s.key);
      for (auto& e : s.exemplars) Py_DECREF(e.second);
    }
  }
};

struct StoreObject {
  PyObject_HEAD
  Impl* impl;
  PyObject* bounds;  // as given, a tuple
  PyObject* factory;  // metrics.Series
  PyObject* index;  // (op, group) -> series position: equal strings, one series
};

PyTypeObject StoreType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// A Python int of up to 128 bits: 0, or -1 with an error set (OverflowError beyond).
int int128_from_py(PyObject* o, __int128* out) {
  int overflow = 0;
  long long small = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (small == -1 && PyErr_Occurred()) return -1;
  if (!overflow) {
    *out = small;
    return 0;
  }
  Ref shift(PyLong_FromLong(64)), mask(PyLong_FromUnsignedLongLong(~0ULL));
  if (shift.p == nullptr || mask.p == nullptr) return -1;
  Ref hi(PyNumber_Rshift(o, shift.p)), lo(hi.p ? PyNumber_And(o, mask.p) : nullptr);
  if (lo.p == nullptr) return -1;
  long long high = PyLong_AsLongLong(hi.p);
  if (high == -1 && PyErr_Occurred()) return -1;
  unsigned long long low = PyLong_AsUnsignedLongLong(lo.p);
  if (low == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return -1;
  *out = (static_cast<__int128>(high) << 64) | static_cast<__int128>(low);
  return 0;
}

PyObject* int128_to_py(__int128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return PyLong_FromLongLong(static_cast<long long>(v));
  Ref hi(PyLong_FromLongLong(static_cast<long long>(v >> 64)));
  Ref lo(PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(v)));
  Ref shift(PyLong_FromLong(64));
  if (hi.p == nullptr || lo.p == nullptr || shift.p == nullptr) return nullptr;
  Ref high(PyNumber_Lshift(hi.p, shift.p));
  return high.p == nullptr ? nullptr : PyNumber_Or(high.p, lo.p);
}

// The series of (op, group), created at `seconds` if new; nullptr with an error set on failure.
Series* series_of(StoreObject* self, PyObject* op, PyObject* group, double seconds) {
  Impl* impl = self->impl;
  auto it = impl->memo.find({op, group});
  if (it != impl->memo.end()) return &impl->series[it->second];
  // str subclasses as plain str: the key is then compared without running Python code (__eq__, __hash__)
  bool exact = PyUnicode_CheckExact(op) && PyUnicode_CheckExact(group);
  Ref op_s(PyUnicode_FromObject(op)), group_s(PyUnicode_FromObject(group));
  if (op_s.p == nullptr || group_s.p == nullptr) return nullptr;
  Ref key(PyTuple_Pack(2, op_s.p, group_s.p));
  if (key.p == nullptr) return nullptr;
  PyObject* found = PyDict_GetItemWithError(self->index, key.p);  // borrowed
  size_t pos;
  if (found != nullptr) {
    pos = PyLong_AsSize_t(found);
  } else {
    if (PyErr_Occurred()) return nullptr;
    pos = impl->series.size();
    Ref where(PyLong_FromSize_t(pos));
    if (where.p == nullptr || PyDict_SetItem(self->index, key.p, where.p) < 0) return nullptr;
    Series s;
    s.buckets.assign(impl->bounds.size() + 1, 0);
    s.min = s.max = seconds;
    s.key = key.release();
    impl->series.push_back(std::move(s));
  }
  if (exact) {
    if (impl->memo.size() >= kMemo) impl->forget_memo();
    impl->memo.emplace(std::make_pair(op, group), pos);
    impl->held.push_back(Py_NewRef(op));
    impl->held.push_back(Py_NewRef(group));
  }
  return &impl->series[pos];
}

// MetricStore.observe: 0 or -1 with an error set. exemplar: nullptr for none, else (time_ns, trace_id, span_id).
int observe(StoreObject* self, PyObject* op, PyObject* group, double seconds, __int128 nbytes, double bus, bool error,
            PyObject* exemplar) {
  const std::vector<double>& b = self->impl->bounds;
  Py_ssize_t i = std::lower_bound(b.begin(), b.end(), seconds) - b.begin();  // bisect_left
  PyObject* held = nullptr;
  if (exemplar != nullptr) {  // made first: a failure leaves the series as it was
    Ref t(PySequence_GetItem(exemplar, 0));
    Ref trace(t.p ? PySequence_GetItem(exemplar, 1) : nullptr);
    Ref span(trace.p ? PySequence_GetItem(exemplar, 2) : nullptr);
    if (span.p == nullptr) return -1;
    Ref sec(PyFloat_FromDouble(seconds));
    if (sec.p == nullptr || (held = PyTuple_Pack(4, sec.p, t.p, trace.p, span.p)) == nullptr) return -1;
  }
  Series* s = series_of(self, op, group, seconds);
  if (s == nullptr) {
    Py_XDECREF(held);
    return -1;
  }
  if (seconds < s->min) {
    s->min = seconds;
  } else if (seconds > s->max) {
    s->max = seconds;
  }
  s->count += 1;
  s->bytes += nbytes;
  s->bus += bus;
  s->sum += seconds;
  s->buckets[i] += 1;
  if (error) s->errors += 1;
  if (held != nullptr) {
    auto found = s->exemplars.find(i);
    if (found != s->exemplars.end()) {
      Py_DECREF(found->second);
      found->second = held;
    } else {
      s->exemplars.emplace(i, held);
    }
  }
  return 0;
}

// ----------------------------------------------------------------------------- steps' folded records

// drain/step_stats.py's _merge: sorted, overlapping or touching intervals joined.
std::vector<Interval> merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) {
      if (iv.second > out.back().second) out.back().second = iv.second;
    } else {
      out.push_back(iv);
    }
  }
  return out;
}

// Intervals._clipped_tail
std::vector<Interval> clipped_tail(const StepAgg& a) {
  if (!a.has_end) return a.tail;
  std::vector<Interval> out;
  for (const Interval& iv : a.tail) {
    if (iv.second > a.folded_end) out.push_back({std::max(iv.first, a.folded_end), iv.second});
  }
  return out;
}

// Intervals.compact
void compact(StepAgg& a) {
  std::vector<Interval> all = a.head;
  std::vector<Interval> tail = clipped_tail(a);
  all.insert(all.end(), tail.begin(), tail.end());
  std::vector<Interval> merged = merge(std::move(all));
  size_t h = std::min(merged.size(), static_cast<size_t>(G.head));
  a.head.assign(merged.begin(), merged.begin() + h);
  std::vector<Interval> rest(merged.begin() + h, merged.end());
  if (static_cast<Py_ssize_t>(rest.size()) <= G.cap / 2 || rest.size() <= static_cast<size_t>(G.keep)) {
    a.tail = std::move(rest);
    return;
  }
  size_t split = rest.size() - static_cast<size_t>(G.keep);
  for (size_t i = 0; i < split; ++i) a.folded += rest[i].second - rest[i].first;
  a.folded_end = rest[split - 1].second;
  a.has_end = true;
  a.tail.assign(rest.begin() + split, rest.end());
}

// step_stats.union_seconds, in nanoseconds (sorts `v`)
int64_t union_ns(std::vector<Interval>& v, int64_t lo, int64_t hi) {
  std::sort(v.begin(), v.end());
  int64_t total = 0, end = lo;
  for (Interval iv : v) {
    if (iv.first < end) iv.first = end;
    if (iv.second > hi) iv.second = hi;
    if (iv.second > iv.first) {
      total += iv.second - iv.first;
      end = iv.second;
    }
  }
  return total;
}

// Intervals.union_seconds, of a step taken (its tail is sorted in place)
double union_seconds(StepAgg& a, int64_t lo, int64_t hi) {
  if (!a.has_end && a.head.empty()) return static_cast<double>(union_ns(a.tail, lo, hi)) / 1e9;
  std::vector<Interval> all = a.head;
  std::vector<Interval> tail = clipped_tail(a);
  all.insert(all.end(), tail.begin(), tail.end());
  return static_cast<double>(union_ns(all, lo, hi)) / 1e9 + static_cast<double>(a.folded) / 1e9;
}

// Intervals.latest_end
int64_t latest_end(const StepAgg& a) {
  bool any = false;
  int64_t latest = 0;
  for (const std::vector<Interval>* v : {&a.tail, &a.head}) {
    for (const Interval& iv : *v) {
      if (!any || iv.second > latest) latest = iv.second;
      any = true;
    }
  }
  return any ? latest : (a.has_end ? a.folded_end : 0);
}

// The step's aggregate, opened as Pipeline.open_step_stats opens a StepStats (and forgets, by the same rule,
// a step never closed).
StepAgg& open_step(Impl* impl, long long serial) {
  auto found = impl->steps.find(serial);
  if (found != impl->steps.end()) return found->second;
  if (static_cast<Py_ssize_t>(impl->steps.size()) > G.steps_open) {
    auto oldest = impl->opened_order.begin();
    if (oldest->first < impl->closed_opened || static_cast<Py_ssize_t>(impl->steps.size()) > G.steps_open_max) {
      impl->steps.erase(oldest->second);
      impl->opened_order.erase(oldest);
    }
  }
  StepAgg& a = impl->steps[serial];
  a.opened = ++impl->opened;
  impl->opened_order.emplace(a.opened, serial);
  return a;
}

// A Python StepStats (the records Pipeline.process took of the step) into `a`: its intervals join the tail,
// its folded total and end join a's. 0, or -1 with an error set.
int add_stats(StepAgg& a, PyObject* stats) {
  Ref count(PyObject_GetAttr(stats, G.s_collectives));
  Ref nbytes(count.p ? PyObject_GetAttr(stats, G.s_nbytes) : nullptr);
  Ref folded(nbytes.p ? PyObject_GetAttr(stats, G.s_folded) : nullptr);
  Ref end(folded.p ? PyObject_GetAttr(stats, G.s_folded_end) : nullptr);
  if (end.p == nullptr) return -1;
  long long c = PyLong_AsLongLong(count.p), f = PyLong_AsLongLong(folded.p);
  __int128 n;
  if (PyErr_Occurred() || int128_from_py(nbytes.p, &n) < 0) return -1;
  std::vector<Interval> added;
  for (PyObject* name : {G.s_head, G.s_tail}) {
    Ref list(PyObject_GetAttr(stats, name));
    Ref seq(list.p ? PySequence_Fast(list.p, "StepStats intervals: a list") : nullptr);
    if (seq.p == nullptr) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq.p); ++i) {
      PyObject* pair = PySequence_Fast_GET_ITEM(seq.p, i);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "StepStats intervals: (start, end) pairs");
        return -1;
      }
      long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 0)), y = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
      if (PyErr_Occurred()) return -1;
      added.push_back({x, y});
    }
  }
  if (end.p != Py_None) {
    long long e = PyLong_AsLongLong(end.p);
    if (PyErr_Occurred()) return -1;
    a.folded_end = a.has_end ? std::max<int64_t>(a.folded_end, e) : e;
    a.has_end = true;
  }
  a.count += c;
  a.nbytes += n;
  a.folded += f;
  a.tail.insert(a.tail.end(), added.begin(), added.end());
  if (static_cast<Py_ssize_t>(a.tail.size()) >= G.cap) compact(a);
  return 0;
}

// take_step(serial, lo, hi, stretch, stats): the close of step `serial` (drain/step_close.py): its folded
// records' aggregate, forgotten here, with `stats` (the StepStats of the records Pipeline.process took, or
// None) added: (collectives, bytes, seconds in flight within [lo, hi], hi), hi moved to the latest end of
// its intervals when `stretch` and later, as StepStats.totals.
PyObject* store_take_step(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "take_step(serial, lo, hi, stretch, stats)");
    return nullptr;
  }
  Impl* impl = reinterpret_cast<StoreObject*>(o)->impl;
  long long serial = PyLong_AsLongLong(args[0]), lo = PyLong_AsLongLong(args[1]), hi = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) return nullptr;
  int stretch = PyObject_IsTrue(args[3]);
  if (stretch < 0) return nullptr;
  StepAgg a;
  auto found = impl->steps.find(serial);
  if (found != impl->steps.end()) {
    a = std::move(found->second);
    impl->steps.erase(found);
    impl->opened_order.erase(a.opened);
    impl->closed_opened = std::max(impl->closed_opened, a.opened);
  }
  if (args[4] != Py_None && add_stats(a, args[4]) < 0) return nullptr;
  if (stretch && a.count) hi = std::max<int64_t>(hi, latest_end(a));
  double wait = a.count ? union_seconds(a, lo, hi) : 0.0;
  Ref nbytes(int128_to_py(a.nbytes));
  if (nbytes.p == nullptr) return nullptr;
  return Py_BuildValue("(LOdL)", static_cast<long long>(a.count), nbytes.p, wait, hi);
}

// steps_snapshot(): {serial: (collectives, bytes, [(start, end), ...])} of the steps not closed yet (tests).
PyObject* store_steps_snapshot(PyObject* o, PyObject*) {
  Impl* impl = reinterpret_cast<StoreObject*>(o)->impl;
  std::vector<std::pair<long long, StepAgg>> copy(impl->steps.begin(), impl->steps.end());
  Ref out(PyDict_New());
  if (out.p == nullptr) return nullptr;
  for (const auto& [serial, a] : copy) {
    Ref list(PyList_New(0));
    Ref nbytes(int128_to_py(a.nbytes));
    if (list.p == nullptr || nbytes.p == nullptr) return nullptr;
    for (const std::vector<Interval>* v : {&a.head, &a.tail}) {
      for (const Interval& iv : *v) {
        Ref pair(Py_BuildValue("(LL)", static_cast<long long>(iv.first), static_cast<long long>(iv.second)));
        if (pair.p == nullptr || PyList_Append(list.p, pair.p) < 0) return nullptr;
      }
    }
    Ref key(PyLong_FromLongLong(serial));
    Ref value(Py_BuildValue("(LOO)", static_cast<long long>(a.count), nbytes.p, list.p));
    if (key.p == nullptr || value.p == nullptr || PyDict_SetItem(out.p, key.p, value.p) < 0) return nullptr;
  }
  return out.release();
}

PyObject* store_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *bounds, *factory;
  static const char* kw[] = {"bounds", "series", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:MetricStore", const_cast<char**>(kw), &bounds, &factory)) return nullptr;
  Ref tuple(PySequence_Tuple(bounds));
  if (tuple.p == nullptr) return nullptr;
  std::vector<double> values;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple.p); ++i) {
    double v = PyFloat_AsDouble(PyTuple_GET_ITEM(tuple.p, i));
    if (v == -1.0 && PyErr_Occurred()) return nullptr;
    values.push_back(v);
  }
  Ref index(PyDict_New());
  if (index.p == nullptr) return nullptr;
  StoreObject* self = reinterpret_cast<StoreObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->impl = new Impl();
  self->impl->bounds = std::move(values);
  self->bounds = tuple.release();
  self->factory = Py_NewRef(factory);
  self->index = index.release();
  return reinterpret_cast<PyObject*>(self);
}

void store_dealloc(PyObject* o) {
  StoreObject* self = reinterpret_cast<StoreObject*>(o);
  delete self->impl;
  Py_XDECREF(self->bounds);
  Py_XDECREF(self->factory);
  Py_XDECREF(self->index);
  Py_TYPE(o)->tp_free(o);
}

PyObject* store_observe(PyObject* o, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 && nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "observe(op, group, seconds, message_size, bus_bytes, error, exemplar=None)");
    return nullptr;
  }
  double seconds = PyFloat_AsDouble(args[2]);
  if (seconds == -1.0 && PyErr_Occurred()) return nullptr;
  __int128 nbytes;
  if (int128_from_py(args[3], &nbytes) < 0) return nullptr;
  double bus = PyFloat_AsDouble(args[4]);
  if (bus == -1.0 && PyErr_Occurred()) return nullptr;
  int error = PyObject_IsTrue(args[5]);
  if (error < 0) return nullptr;
  PyObject* exemplar = nargs == 7 && args[6] != Py_None ? args[6] : nullptr;
  if (observe(reinterpret_cast<StoreObject*>(o), args[0], args[1], seconds, nbytes, bus, error, exemplar) < 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* store_snapshot(PyObject* o, PyObject*) {
  // Copied first, in C++ alone: making Python objects may run the garbage collector, whose finalizers may
  // let the drain thread in to add a series (and move the vector under a loop over it).
  std::vector<Series> copy = reinterpret_cast<StoreObject*>(o)->impl->series;
  for (Series& s : copy) {  // the copies' references, owned until the end of this call
    Py_INCREF(s.key);
    for (auto& e : s.exemplars) Py_INCREF(e.second);
  }
  struct Release {
    std::vector<Series>& v;
    ~Release() {
      for (Series& s : v) {
        Py_DECREF(s.key);
        for (auto& e : s.exemplars) Py_DECREF(e.second);
      }
    }
  } release{copy};
  PyObject* factory = reinterpret_cast<StoreObject*>(o)->factory;
  Ref out(PyDict_New());
  if (out.p == nullptr) return nullptr;
  for (const Series& s : copy) {
    Ref buckets(PyList_New(Py_ssize_t(s.buckets.size())));
    Ref exemplars(PyDict_New());
    Ref nbytes(int128_to_py(s.bytes));
    if (buckets.p == nullptr || exemplars.p == nullptr || nbytes.p == nullptr) return nullptr;
    for (size_t i = 0; i < s.buckets.size(); ++i) {
      PyObject* v = PyLong_FromLongLong(s.buckets[i]);
      if (v == nullptr) return nullptr;
      PyList_SET_ITEM(buckets.p, Py_ssize_t(i), v);
    }
    for (const auto& e : s.exemplars) {
      Ref i(PyLong_FromSsize_t(e.first));
      if (i.p == nullptr || PyDict_SetItem(exemplars.p, i.p, e.second) < 0) return nullptr;
    }
    Ref series(PyObject_CallFunction(factory, "OLLOddddO", buckets.p, static_cast<long long>(s.count),
                                     static_cast<long long>(s.errors), nbytes.p, s.bus, s.sum, s.min, s.max, exemplars.p));
    if (series.p == nullptr || PyDict_SetItem(out.p, s.key, series.p) < 0) return nullptr;
  }
  return out.release();
}

PyObject* store_bounds(PyObject* o, void*) { return Py_NewRef(reinterpret_cast<StoreObject*>(o)->bounds); }

PyMethodDef kStoreMethods[] = {
    {"take_step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&store_take_step)), METH_FASTCALL,
     "take_step(serial, lo, hi, stretch, stats): (collectives, bytes, seconds in flight, hi) of a closing step."},
    {"steps_snapshot", &store_steps_snapshot, METH_NOARGS, "steps_snapshot(): {serial: (collectives, bytes, intervals)}."},
    {"observe", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&store_observe)), METH_FASTCALL,
     "observe(op, group, seconds, message_size, bus_bytes, error, exemplar=None): metrics.MetricStore.observe."},
    {"snapshot", &store_snapshot, METH_NOARGS, "snapshot(): {(op, group): metrics.Series}, copies."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef kStoreGetSet[] = {{"bounds", &store_bounds, nullptr, "The histogram's bucket bounds.", nullptr},
                              {nullptr, nullptr, nullptr, nullptr, nullptr}};

// -------------------------------------------------------------------------------------------- the fold

// What fold_one reads of a record before taking it.
struct Read {
  Ref gi, label;
  long long nbytes = 0, start = 0, end = 0, serial = 0;
  bool in_step = false;
  double seconds = 0, factor = 0;
};

// The bus factor of (kind, size), remembered across a call for the records of one group.
struct FactorMemo {
  Ref kind;
  long size = -1;
  double factor = 0;
};

// 1: `rec` read into `r`, one to fold; 0: one for Pipeline.process (nothing read is kept); -1: an error
// that is not the record's (a BaseException such as KeyboardInterrupt) to pass on.
int read(PyObject* rec, Read& r, bool roots_unsampled, FactorMemo& memo) {
  if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != kFields) return 0;
  PyObject* step = PyTuple_GET_ITEM(rec, kStepCtx);
  // An unsampled step's record, not under a caller's span nor a framework context's parent: Pipeline.process's
  // common case, whose span is not made and whose trace is not needed. Outside a step, the record is a
  // trace's root, unsampled when the sampler keeps no root.
  if (step == Py_None ? !roots_unsampled
                      : !PyTuple_CheckExact(step) || PyTuple_GET_SIZE(step) < 4 || PyTuple_GET_ITEM(step, 3) != Py_False)
    return 0;
  if (PyTuple_GET_ITEM(rec, kParent) != Py_None) return 0;
  // A call that failed, or one never seen to finish, is credited no bytes: Pipeline.process's rule.
  if (PyTuple_GET_ITEM(rec, kError) != Py_None) return 0;
  PyObject* end_source = PyTuple_GET_ITEM(rec, kEnd);
  if (end_source == G.unfinished || (PyUnicode_CheckExact(end_source) && PyUnicode_Compare(end_source, G.unfinished) == 0))
    return 0;
  // Timed to a wait() entered after its issue (the time wait() blocked in its extra): Pipeline.process gives
  // its step only that part as the rank's wait.
  if (PyTuple_GET_ITEM(rec, kExtra) != Py_None &&
      (end_source == G.wait_end || (PyUnicode_CheckExact(end_source) && PyUnicode_Compare(end_source, G.wait_end) == 0)))
    return 0;
  PyObject* fw = PyTuple_GET_ITEM(rec, kCtx);
  if (fw != Py_None && (!PyTuple_CheckExact(fw) || PyTuple_GET_SIZE(fw) < 4 || PyTuple_GET_ITEM(fw, 3) != Py_None)) return 0;
  PyObject *group = PyTuple_GET_ITEM(rec, kGroup), *t0 = PyTuple_GET_ITEM(rec, kTStart), *t1 = PyTuple_GET_ITEM(rec, kTEnd),
           *nbytes = PyTuple_GET_ITEM(rec, kNbytes), *gpu = PyTuple_GET_ITEM(rec, kGpuNs), *kind = PyTuple_GET_ITEM(rec, kKind);
  if (!PyLong_CheckExact(group) || !PyLong_CheckExact(t0) || !PyLong_CheckExact(t1) || !PyLong_CheckExact(nbytes) ||
      !(gpu == Py_None || PyLong_CheckExact(gpu) || PyFloat_CheckExact(gpu)) || !PyUnicode_CheckExact(kind) ||
      !PyUnicode_CheckExact(PyTuple_GET_ITEM(rec, kOp)))
    return 0;
  int overflow = 0;
  Py_ssize_t g = PyLong_AsSsize_t(group);
  long long start = PyLong_AsLongLongAndOverflow(t0, &overflow);
  long long end = overflow ? 0 : PyLong_AsLongLongAndOverflow(t1, &overflow);
  r.nbytes = overflow ? 0 : PyLong_AsLongLongAndOverflow(nbytes, &overflow);
  r.start = start;
  r.end = end;
  if (PyErr_Occurred() || overflow || g < 0 || g >= PyList_GET_SIZE(G.by_id)) goto other;
  if (gpu != Py_None) {
    double ns = PyFloat_AsDouble(gpu);  // as gpu_ns / 1e9 converts an int
    if (ns == -1.0 && PyErr_Occurred()) goto other;
    r.seconds = ns / 1e9;
  } else {
    long long elapsed;
    if (__builtin_sub_overflow(end, start, &elapsed)) goto other;
    r.seconds = elapsed > 0 ? static_cast<double>(elapsed) / 1e9 : 0.0;
  }
  r.gi.p = Py_NewRef(PyList_GET_ITEM(G.by_id, g));
  {
    Ref size(PyObject_GetAttr(r.gi.p, G.s_size));
    if (size.p == nullptr || !PyLong_CheckExact(size.p)) goto other;
    long n = PyLong_AsLongAndOverflow(size.p, &overflow);
    if (overflow || PyErr_Occurred()) goto other;
    if (memo.kind.p == kind && memo.size == n) {
      r.factor = memo.factor;
    } else {
      Ref key(PyTuple_Pack(2, kind, size.p));
      if (key.p == nullptr) goto other;
      PyObject* f = PyDict_GetItemWithError(G.factors, key.p);  // borrowed
      if (f == nullptr || !PyFloat_CheckExact(f)) goto other;  // not met yet: Pipeline.process fills it in
      r.factor = PyFloat_AS_DOUBLE(f);
      Py_XSETREF(memo.kind.p, Py_NewRef(kind));
      memo.size = n;
      memo.factor = r.factor;
    }
  }
  r.label.p = PyObject_GetAttr(r.gi.p, G.s_label);
  if (r.label.p == nullptr || !PyUnicode_CheckExact(r.label.p)) goto other;
  if (step != Py_None) {
    r.serial = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(step, 0), &overflow);
    if (overflow || PyErr_Occurred()) goto other;
    r.in_step = true;
  }
  return 1;
other:
  // Pipeline.process takes it from here and meets the same error, if any, where it reports errors; an
  // exception that is not an error (KeyboardInterrupt on a flush from the main thread) goes on.
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_Clear();
  }
  return 0;
}

// A step's intervals, count and bytes, with the record's.
void update_step(StoreObject* store, const Read& r) {
  StepAgg& a = open_step(store->impl, r.serial);
  a.tail.push_back({r.start, r.end});
  if (static_cast<Py_ssize_t>(a.tail.size()) >= G.cap) compact(a);
  a.count += 1;
  a.nbytes += r.nbytes;
}

// Folds `rec`, taken from the queue, as Pipeline.process would: 0, or -1 with an error set. `tap`, when not
// None, gets (op, group label, seconds) of every record folded (Pipeline.meter: a MeterProvider's histogram).
int fold_one(StoreObject* store, PyObject* rec, Read& r, PyObject* tap) {
  if (r.in_step) update_step(store, r);
  PyObject* error = PyTuple_GET_ITEM(rec, kError);
  if (observe(store, PyTuple_GET_ITEM(rec, kOp), r.label.p, r.seconds, r.nbytes, static_cast<double>(r.nbytes) * r.factor,
              error != Py_None, nullptr) < 0)
    return -1;
  if (tap != Py_None) {
    Ref seconds(PyFloat_FromDouble(r.seconds));
    if (seconds.p == nullptr) return -1;
    PyObject* targs[] = {PyTuple_GET_ITEM(rec, kOp), r.label.p, seconds.p};
    Ref tapped(PyObject_Vectorcall(tap, targs, 3, nullptr));
    if (tapped.p == nullptr) return -1;
  }
  PyObject* seq = PyTuple_GET_ITEM(rec, kSeq);
  if (seq == Py_None || error != Py_None) return 0;
  // A collective that failed did not complete: counting it would tell the hang report it completed later.
  Ref last(PyObject_GetAttr(r.gi.p, G.s_last_completed));
  if (last.p == nullptr) return -1;
  int later = PyObject_RichCompareBool(seq, last.p, Py_GT);
  if (later <= 0) return later;
  int finished = PyObject_RichCompareBool(PyTuple_GET_ITEM(rec, kEnd), G.unfinished, Py_NE);
  if (finished <= 0) return finished;
  return PyObject_SetAttr(r.gi.p, G.s_last_completed, seq);
}

PyObject* fold(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyObject_TypeCheck(args[0], &StoreType) || !PyCallable_Check(args[3]) ||
      (args[4] != Py_None && !PyCallable_Check(args[4]))) {
    PyErr_SetString(PyExc_TypeError, "fold(store: MetricStore, queue: deque, roots_unsampled: bool, report, tap)");
    return nullptr;
  }
  if (!G.ready) {
    PyErr_SetString(PyExc_RuntimeError, "fold_setup() was not called");
    return nullptr;
  }
  StoreObject* store = reinterpret_cast<StoreObject*>(args[0]);
  PyObject *queue = args[1], *report = args[3], *tap = args[4];
  int roots_unsampled = PyObject_IsTrue(args[2]);
  if (roots_unsampled < 0) return nullptr;
  Ref popleft(PyObject_GetAttr(queue, G.s_popleft));
  if (popleft.p == nullptr) return nullptr;
  FactorMemo memo;
  Py_ssize_t done = 0;
  while (done < kBatch) {
    Py_ssize_t left = PyObject_Length(queue);
    if (left <= 0) {
      if (left < 0) return nullptr;
      break;
    }
    Ref rec(PySequence_GetItem(queue, 0));
    if (rec.p == nullptr) return nullptr;
    Read r;
    int ours = read(rec.p, r, roots_unsampled, memo);
    if (ours < 0) return nullptr;
    if (ours == 0) break;
    Ref taken(PyObject_CallNoArgs(popleft.p));  // only this thread takes from the left (the drain's lock)
    if (taken.p == nullptr) return nullptr;
    if (taken.p != rec.p) {
      PyErr_SetString(PyExc_RuntimeError, "fold: the queue's first record changed while it was read");
      return nullptr;
    }
    ++done;
    if (fold_one(store, rec.p, r, tap) < 0) {  // reported as Pipeline._process_all reports process()'s failures
      if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
      Raised raised;
      Ref reported(PyObject_CallOneArg(report, raised.value));
      if (reported.p == nullptr) return nullptr;
    }
  }
  return PyLong_FromSsize_t(done);
}

PyObject* setup(PyObject*, PyObject* config) {
  if (!PyDict_Check(config)) {
    PyErr_SetString(PyExc_TypeError, "fold_setup(dict)");
    return nullptr;
  }
  PyObject* by_id = PyDict_GetItemString(config, "by_id");
  PyObject* factors = PyDict_GetItemString(config, "factors");
  PyObject* unfinished = PyDict_GetItemString(config, "end_unfinished");
  PyObject* wait_end = PyDict_GetItemString(config, "end_wait");
  if (by_id == nullptr || !PyList_CheckExact(by_id) || factors == nullptr || !PyDict_CheckExact(factors) ||
      unfinished == nullptr || wait_end == nullptr) {
    PyErr_SetString(PyExc_ValueError, "fold_setup: by_id (list), factors (dict), end_unfinished, end_wait needed");
    return nullptr;
  }
  struct Size {
    Py_ssize_t* slot;
    const char* key;
  } sizes[] = {{&G.cap, "intervals_cap"}, {&G.head, "intervals_head"}, {&G.keep, "intervals_keep"},
               {&G.steps_open, "steps_open"}, {&G.steps_open_max, "steps_open_max"}};
  Py_ssize_t values[5];
  for (size_t i = 0; i < 5; ++i) {
    PyObject* v = PyDict_GetItemString(config, sizes[i].key);
    if (v == nullptr || !PyLong_Check(v)) {
      PyErr_Format(PyExc_ValueError, "fold_setup: %s (int) needed", sizes[i].key);
      return nullptr;
    }
    if ((values[i] = PyLong_AsSsize_t(v)) == -1 && PyErr_Occurred()) return nullptr;
  }
  struct Name {
    PyObject** slot;
    const char* text;
  } names[] = {{&G.s_size, "size"},
               {&G.s_label, "series"},
               {&G.s_last_completed, "last_completed"},
               {&G.s_head, "head"},
               {&G.s_tail, "tail"},
               {&G.s_folded, "folded"},
               {&G.s_folded_end, "folded_end"},
               {&G.s_collectives, "collectives"},
               {&G.s_nbytes, "nbytes"},
               {&G.s_popleft, "popleft"}};
  for (auto& nm : names) {  // each kept once made: a setup that failed part-way is completed by the next
    if (*nm.slot == nullptr && (*nm.slot = PyUnicode_InternFromString(nm.text)) == nullptr) return nullptr;
  }
  Py_XSETREF(G.by_id, Py_NewRef(by_id));
  Py_XSETREF(G.factors, Py_NewRef(factors));
  Py_XSETREF(G.unfinished, Py_NewRef(unfinished));
  Py_XSETREF(G.wait_end, Py_NewRef(wait_end));
  for (size_t i = 0; i < 5; ++i) *sizes[i].slot = values[i];
  G.ready = true;
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"fold_setup", &setup, METH_O, "fold_setup(dict): the objects fold() reads (Pipeline.use_native)."},
    {"fold", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fold)), METH_FASTCALL,
     "fold(store, queue, roots_unsampled, report, tap): folds the unsampled records at the queue's front; how many."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_to(PyObject* module) {
  StoreType.tp_name = "otel_torchdist_native.MetricStore";
  StoreType.tp_basicsize = sizeof(StoreObject);
  StoreType.tp_flags = Py_TPFLAGS_DEFAULT;
  StoreType.tp_doc = "metrics.MetricStore in C: observe() and snapshot(), the same series.";
  StoreType.tp_new = store_new;
  StoreType.tp_dealloc = store_dealloc;
  StoreType.tp_methods = kStoreMethods;
  StoreType.tp_getset = kStoreGetSet;
  if (PyType_Ready(&StoreType) < 0) return -1;
  if (PyModule_AddObjectRef(module, "MetricStore", reinterpret_cast<PyObject*>(&StoreType)) < 0) return -1;
  return PyModule_AddFunctions(module, kMethods);
}

}  // namespace otel_fold
