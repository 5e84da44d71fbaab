// The c10d wrapper's common case in C: a collective on one plain tensor, called with its group known,
// not nested in another captured call, on a backend whose blocking call returns complete. It writes the
// same record as capture/c10d.py's wrapper (record.py's fields, in the same order), calls the original,
// stamps the end and queues the record, without the interpreter's per-bytecode cost; anything else (a
// nested call, a tensor subclass, an unknown group, a coalescing block, an asynchronous call's completion)
// goes to the Python wrapper's body, which handles every case. The cheap exits (instrumented at all,
// torch.compile tracing) stay in Python, so Dynamo never meets this function.
//
// Contract with the Python side (capture/native_hot.py): setup() once per load with the objects below,
// make_op() once per wrapped function, call(op, args, kwargs) per collective.
#include <torch/extension.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

#include "common.h"

namespace otel_hot {
namespace {

using otel_native::now_ns;
using otel_native::Raised;
using otel_native::Ref;

using namespace otel_native::record;

// Strong references, set by setup() and kept for the process (a module is never unloaded).
struct Globals {
  PyObject* tls = nullptr;  // record.TLS
  PyObject* blocking = nullptr;  // record.BLOCKING: thread id -> the record of the call it is inside
  PyObject* queue = nullptr;  // record.QUEUE
  PyObject* queue_append = nullptr;
  PyObject* limit = nullptr;  // record._limit (a one-item list)
  PyObject* dropped = nullptr;  // record._dropped
  PyObject* step = nullptr;  // record.STEP
  PyObject* context = nullptr;  // opentelemetry.context.get_current
  PyObject* groups = nullptr;  // groups._groups: process group -> GroupInfo
  PyObject* world = nullptr;  // c10d._world
  PyObject* coalesce = nullptr;  // c10d._world._pg_coalesce_state
  PyObject* tensor_type = nullptr;  // torch.Tensor
  PyObject* source = nullptr;  // "c10d"
  PyObject* future = nullptr;  // groups.COMPLETION_FUTURE
  PyObject* end_return = nullptr;  // names.END_RETURN
  PyObject* finish = nullptr;  // c10d._finish(rec, result)
  PyObject* fail = nullptr;  // c10d._fail(rec, exc)
  PyObject* report = nullptr;  // c10d._finish_failed(name, exc): a telemetry failure after the call
  // attribute names, interned once
  PyObject *s_dict, *s_outer, *s_ctx, *s_default_pg, *s_gid, *s_size, *s_completion, *s_seq_supported, *s_pg, *s_seqno, *s_own_seq;
  bool ready = false;
};

Globals G;

// One wrapped function: where its parameters are and what its record says.
struct HotOp {
  PyObject* orig;
  PyObject* slow;  // the Python wrapper's body: slow(args, kwargs)
  PyObject* names;  // tuple of parameter names
  PyObject* defaults;  // tuple, REQUIRED where a parameter has none
  PyObject* op;
  PyObject* kind;
  Py_ssize_t count;
  int ig, ia, ir, ip, r0, r1, p0, p1;  // parameter positions, -1 for none
  bool has_root, has_peer, times_n, queued;
};

constexpr Py_ssize_t kMaxParams = 16;
constexpr const char* kCapsule = "otel_torchdist.hot_op";

PyObject* slow_path(HotOp* h, PyObject* args, PyObject* kwargs) {  // kwargs: the dict the wrapper got
  return PyObject_CallFunctionObjArgs(h->slow, args, kwargs, nullptr);
}

void replace(PyObject* list, Py_ssize_t i, PyObject* value) {  // steals value
  PyObject* old = PyList_GET_ITEM(list, i);
  PyList_SET_ITEM(list, i, value);
  Py_DECREF(old);
}

// The caller's current OpenTelemetry Context (opentelemetry.context.get_current()), or None when it is empty
// (capture/caller.py): a new reference, or nullptr with an error set on failure.
PyObject* parent_span() {
  PyObject* ctx = PyObject_CallNoArgs(G.context);
  if (ctx == nullptr) return nullptr;
  int truth = PyDict_Check(ctx) ? static_cast<int>(PyDict_GET_SIZE(ctx) != 0) : PyObject_IsTrue(ctx);
  if (truth > 0) return ctx;
  Py_DECREF(ctx);
  if (truth < 0) return nullptr;
  Py_RETURN_NONE;
}

// A telemetry failure after the collective returned: reported through Python (health.error) and swallowed,
// as the Python body catches Exception. False, the error left set, for what it would not catch either
// (KeyboardInterrupt, SystemExit).
bool report_failure(HotOp* h) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return false;
  Raised exc;
  PyObject* r = PyObject_CallFunctionObjArgs(G.report, h->op, exc.value ? exc.value : Py_None, nullptr);
  if (r == nullptr) PyErr_Clear();
  Py_XDECREF(r);
  return true;
}

// A failure before the call: the Python body takes the call from the start (and reports what fails),
// unless it is no Exception (KeyboardInterrupt...), which the Python body would not catch either.
PyObject* fall_back(HotOp* h, PyObject* args, PyObject* given) {
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;
    PyErr_Clear();
  }
  return slow_path(h, args, given);
}

// After the original returned `result`: the sequence number, the end, the queue (record.py's push), or
// the Python _finish for whatever is not a blocking call that returned complete. 0, or -1 with an error set.
int finish(HotOp* h, PyObject* rec, PyObject* gi, bool is_async, int64_t t_end, PyObject* result) {
  Ref completion(PyObject_GetAttr(gi, G.s_completion));
  if (completion.p == nullptr) return -1;
  if (completion.p != G.future || is_async) {
    Ref r(PyObject_CallFunctionObjArgs(G.finish, rec, result, nullptr));
    return r.p == nullptr ? -1 : 0;
  }
  Ref supported(PyObject_GetAttr(gi, G.s_seq_supported));
  if (supported.p == nullptr) return -1;
  Ref seq;
  if (supported.p == Py_True) {
    Ref pg(PyObject_GetAttr(gi, G.s_pg));
    if (pg.p == nullptr) return -1;
    seq.p = PyObject_CallMethodNoArgs(pg.p, G.s_seqno);
  } else {
    Ref counter(PyObject_GetAttr(gi, G.s_own_seq));
    if (counter.p == nullptr) return -1;
    seq.p = PyIter_Next(counter.p);
    if (seq.p == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "sequence counter exhausted");
  }
  if (seq.p == nullptr) return -1;
  PyObject* end = PyLong_FromLongLong(t_end);
  if (end == nullptr) return -1;
  replace(rec, kSeq, seq.release());
  replace(rec, kTEnd, end);
  replace(rec, kEnd, Py_NewRef(G.end_return));
  Py_ssize_t queued = PyObject_Length(G.queue);
  if (queued < 0) return -1;
  long long limit = PyLong_AsLongLong(PyList_GET_ITEM(G.limit, 0));
  if (limit == -1 && PyErr_Occurred()) return -1;
  if (queued < limit) {
    Ref frozen(PyList_AsTuple(rec));
    if (frozen.p == nullptr) return -1;
    // Untracked at once, as the collector would on its first look at a tuple of atoms: queued records then
    // cost the young-generation collections nothing (that first look was a fifth of this path's work).
    // Only without the caller's span: the other fields are atoms and tuples of atoms, which cannot
    // reference the record back, so it can be in no cycle the collector would have to find.
    if (PyList_GET_ITEM(rec, kParent) == Py_None) PyObject_GC_UnTrack(frozen.p);
    Ref r(PyObject_CallOneArg(G.queue_append, frozen.p));
    return r.p == nullptr ? -1 : 0;
  }
  Ref one(PyLong_FromLong(1));
  if (one.p == nullptr) return -1;
  PyObject* total = PyNumber_Add(PyList_GET_ITEM(G.dropped, 0), one.p);
  if (total == nullptr) return -1;
  return PyList_SetItem(G.dropped, 0, total);
}

// The record of a call the fast path takes, or nullptr: with an error set on a failure, without one when
// the call is not the common case (the Python body then takes it from the start). `gi_out`: its GroupInfo.
PyObject* describe(HotOp* h, PyObject* args, PyObject* kwargs, PyObject* local, PyObject** gi_out, bool* async_out) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (nargs > h->count) return nullptr;
  PyObject* v[kMaxParams];
  for (Py_ssize_t i = 0; i < h->count; ++i) {
    if (i < nargs) {
      v[i] = PyTuple_GET_ITEM(args, i);
      continue;
    }
    v[i] = PyTuple_GET_ITEM(h->defaults, i);
    if (kwargs != nullptr) {  // a non-empty dict (call())
      PyObject* given = PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(h->names, i));
      if (given != nullptr) {
        v[i] = given;
      } else if (PyErr_Occurred()) {
        return nullptr;
      }
    }
  }
  PyObject* x = v[h->ip];
  if (Py_TYPE(x) != reinterpret_cast<PyTypeObject*>(G.tensor_type)) return nullptr;  // a subclass, a list...
  if (h->queued && (!PyDict_Check(G.coalesce) || PyDict_GET_SIZE(G.coalesce) > 0)) return nullptr;
  PyObject* group = h->ig >= 0 ? v[h->ig] : Py_None;
  Ref default_pg;
  if (group == Py_None) {
    default_pg.p = PyObject_GetAttr(G.world, G.s_default_pg);
    if (default_pg.p == nullptr) return nullptr;
    group = default_pg.p;
  }
  PyObject* found = PyDict_GetItemWithError(G.groups, group);
  if (found == nullptr) return nullptr;
  Ref gi_ref(Py_NewRef(found));  // Python code may run below (another thread may forget the group)
  PyObject* gi = gi_ref.p;
  const at::Tensor& t = THPVariable_Unpack(x);
  if (t.layout() != at::kStrided || t.is_nested()) return nullptr;
  int64_t ndim = t.dim();
  int64_t nbytes = int64_t(t.nbytes());
  int64_t numel = t.numel();
  Ref shapes(PyTuple_New(ndim + 1));
  if (shapes.p == nullptr) return nullptr;
  PyObject* item = PyLong_FromLongLong(ndim);
  if (item == nullptr) return nullptr;
  PyTuple_SET_ITEM(shapes.p, 0, item);
  auto sizes = t.sizes();
  for (int64_t d = 0; d < ndim; ++d) {
    item = PyLong_FromLongLong(sizes[d]);
    if (item == nullptr) return nullptr;
    PyTuple_SET_ITEM(shapes.p, d + 1, item);
  }
  PyObject_GC_UnTrack(shapes.p);  // ints only
  if (h->times_n) {
    Ref size(PyObject_GetAttr(gi, G.s_size));
    if (size.p == nullptr) return nullptr;
    long long n = PyLong_AsLongLong(size.p);
    if (n == -1 && PyErr_Occurred()) return nullptr;
    nbytes *= n;
  }
  bool is_async = false;
  if (h->ia >= 0) {
    int truth = PyObject_IsTrue(v[h->ia]);
    if (truth < 0) return nullptr;
    is_async = truth != 0;
  }
  Ref root, peer;
  if (h->has_root) {
    root.p = PyTuple_Pack(2, h->r0 >= 0 ? v[h->r0] : Py_None, h->r1 >= 0 ? v[h->r1] : Py_None);
    if (root.p == nullptr) return nullptr;
  }
  if (h->has_peer) {
    // recv from any source: the peer is what the call returns (the Python body reads it)
    if ((h->p0 < 0 || v[h->p0] == Py_None) && (h->p1 < 0 || v[h->p1] == Py_None)) return nullptr;
    peer.p = PyTuple_Pack(2, h->p0 >= 0 ? v[h->p0] : Py_None, h->p1 >= 0 ? v[h->p1] : Py_None);
    if (peer.p == nullptr) return nullptr;
  }
  Ref gid(PyObject_GetAttr(gi, G.s_gid));
  if (gid.p == nullptr) return nullptr;
  Ref parent(parent_span());
  if (parent.p == nullptr) return nullptr;
  PyObject* ctx = PyDict_GetItemWithError(local, G.s_ctx);  // TLS.ctx; unset: the class's None
  if (ctx == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    ctx = Py_None;
  }
  Ref nbytes_obj(PyLong_FromLongLong(nbytes)), numel_obj(PyLong_FromLongLong(numel)), zero(PyLong_FromLong(0));
  Ref one(PyLong_FromLong(1));
  if (!nbytes_obj.p || !numel_obj.p || !zero.p || !one.p) return nullptr;
  bool bwd = torch::autograd::get_current_graph_task_id() != -1;
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));  // before the list: may throw
  PyObject* rec = PyList_New(kFields);
  if (rec == nullptr) return nullptr;
  PyObject* none = Py_None;
  PyObject* items[kFields] = {
      h->op, h->kind, G.source, gid.p, none, zero.p, zero.p, nbytes_obj.p,
      dtype, shapes.p, numel_obj.p, one.p,
      is_async ? Py_True : Py_False, root.p ? root.p : none, peer.p ? peer.p : none,
      h->ir >= 0 ? v[h->ir] : none, none, none, parent.p, none, none, Py_False, ctx, bwd ? Py_True : Py_False,
      PyList_GET_ITEM(G.step, 0)};
  for (Py_ssize_t i = 0; i < kFields; ++i) PyList_SET_ITEM(rec, i, Py_NewRef(items[i]));
  *gi_out = gi_ref.release();
  *async_out = is_async;
  return rec;
}

// After the call: the thread is no longer inside it (BLOCKING, TLS.outer). False if either could not be
// reset; no error is left set.
bool leave(PyObject* local, PyObject* thread) {
  bool reset = true;
  if (PyDict_DelItem(G.blocking, thread) < 0) {
    PyErr_Clear();
    reset = false;
  }
  if (PyDict_SetItem(local, G.s_outer, Py_None) < 0) {
    PyErr_Clear();
    reset = false;
  }
  return reset;
}

// call(op, args, kwargs): the collective's own result, or its own exception, unchanged.
PyObject* call(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3 || !PyTuple_Check(argv[1]) || !PyDict_Check(argv[2])) {
    PyErr_SetString(PyExc_TypeError, "call(op, args: tuple, kwargs: dict)");
    return nullptr;
  }
  auto* h = static_cast<HotOp*>(PyCapsule_GetPointer(argv[0], kCapsule));
  if (h == nullptr) return nullptr;
  PyObject* args = argv[1];
  PyObject* given = argv[2];  // the wrapper's kwargs dict, handed as it is to the Python body
  PyObject* kwargs = PyDict_GET_SIZE(given) > 0 ? given : nullptr;
  // TLS's attributes on this thread: threading.local's per-thread dict, read and written directly (what its
  // getattr and setattr do for these plain attributes, after a lookup of that dict each time).
  Ref local(PyObject_GetAttr(G.tls, G.s_dict));
  if (local.p == nullptr) return fall_back(h, args, given);
  if (!PyDict_Check(local.p)) return slow_path(h, args, given);
  {
    PyObject* outer = PyDict_GetItemWithError(local.p, G.s_outer);  // unset: the class's None
    if (outer == nullptr && PyErr_Occurred()) return fall_back(h, args, given);
    if (outer != nullptr && outer != Py_None) return slow_path(h, args, given);  // nested
  }
  PyObject* gi_raw = nullptr;
  bool is_async = false;
  PyObject* rec_raw = nullptr;
  try {
    rec_raw = describe(h, args, kwargs, local.p, &gi_raw, &is_async);
  } catch (...) {  // a c10::Error from the tensor (symbolic sizes...): the Python body takes it
    rec_raw = nullptr;
  }
  if (rec_raw == nullptr) return fall_back(h, args, given);  // it describes the call again
  Ref rec(rec_raw), gi(gi_raw);
  // The hang watchdog finds the Python body's record in its frame; this one, in BLOCKING by thread.
  Ref thread(PyLong_FromUnsignedLong(PyThread_get_thread_ident()));
  if (thread.p == nullptr || PyDict_SetItem(local.p, G.s_outer, rec.p) < 0) return fall_back(h, args, given);
  PyObject* start = PyLong_FromLongLong(now_ns());
  if (start == nullptr || PyDict_SetItem(G.blocking, thread.p, rec.p) < 0) {
    Py_XDECREF(start);
    Raised failure;  // kept across the reset below
    if (PyDict_SetItem(local.p, G.s_outer, Py_None) < 0) PyErr_Clear();
    failure.restore();
    return fall_back(h, args, given);
  }
  replace(rec.p, kTStart, start);
  PyObject* result = PyObject_Call(h->orig, args, kwargs);
  int64_t t_end = now_ns();
  if (result == nullptr) {
    Raised exc;
    leave(local.p, thread.p);
    PyObject* r = PyObject_CallFunctionObjArgs(G.fail, rec.p, exc.value ? exc.value : Py_None, nullptr);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
    exc.restore();
    return nullptr;
  }
  // The thread's state is put back whatever fails; then the record.
  if (!leave(local.p, thread.p)) {
    PyErr_SetString(PyExc_RuntimeError, "could not reset the thread's capture state");
    report_failure(h);
  }
  if (finish(h, rec.p, gi.p, is_async, t_end, result) < 0 && !report_failure(h)) {
    Py_DECREF(result);  // as the Python body: what it does not catch propagates
    return nullptr;
  }
  return result;
}

PyObject* get(PyObject* dict, const char* key) {  // a new reference to dict[key], or nullptr with KeyError
  PyObject* value = PyDict_GetItemString(dict, key);
  if (value == nullptr) {
    PyErr_Format(PyExc_KeyError, "setup() needs %s", key);
    return nullptr;
  }
  return Py_NewRef(value);
}

PyObject* setup(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 1 || !PyDict_Check(argv[0])) {
    PyErr_SetString(PyExc_TypeError, "setup(dict)");
    return nullptr;
  }
  PyObject* d = argv[0];
  struct {
    PyObject** slot;
    const char* key;
  } table[] = {{&G.tls, "tls"}, {&G.blocking, "blocking"}, {&G.queue, "queue"}, {&G.limit, "limit"},
               {&G.dropped, "dropped"}, {&G.step, "step"}, {&G.context, "context"},
               {&G.groups, "groups"}, {&G.world, "world"}, {&G.coalesce, "coalesce"},
               {&G.tensor_type, "tensor_type"}, {&G.source, "source"}, {&G.future, "future"},
               {&G.end_return, "end_return"}, {&G.finish, "finish"}, {&G.fail, "fail"}, {&G.report, "report"}};
  constexpr size_t n = sizeof(table) / sizeof(table[0]);
  // Everything read and checked first, then swapped in: a thread inside call() never sees half a setup.
  Ref values[n];
  for (size_t i = 0; i < n; ++i) {
    values[i].p = get(d, table[i].key);
    if (values[i].p == nullptr) return nullptr;
  }
  auto value = [&](PyObject** slot) -> PyObject* {
    for (size_t i = 0; i < n; ++i)
      if (table[i].slot == slot) return values[i].p;
    return nullptr;
  };
  PyObject *blocking = value(&G.blocking), *groups = value(&G.groups), *step = value(&G.step),
           *limit = value(&G.limit), *dropped = value(&G.dropped), *tensor_type = value(&G.tensor_type);
  if (!PyDict_Check(blocking) || !PyDict_Check(groups) || !PyList_Check(step) || !PyList_Check(limit) ||
      !PyList_Check(dropped) || PyList_GET_SIZE(step) < 1 || PyList_GET_SIZE(limit) < 1 ||
      PyList_GET_SIZE(dropped) < 1 || !PyType_Check(tensor_type)) {
    PyErr_SetString(PyExc_TypeError,
                    "setup(): blocking and groups must be dicts, step, limit and dropped one-item lists, "
                    "tensor_type a type");
    return nullptr;
  }
  Ref append(PyObject_GetAttrString(value(&G.queue), "append"));
  if (append.p == nullptr) return nullptr;
  if (!G.ready) {
    struct {
      PyObject** slot;
      const char* name;
    } names[] = {{&G.s_dict, "__dict__"}, {&G.s_outer, "outer"}, {&G.s_ctx, "ctx"}, {&G.s_default_pg, "_default_pg"}, {&G.s_gid, "gid"},
                 {&G.s_size, "size"}, {&G.s_completion, "completion"}, {&G.s_seq_supported, "seq_supported"},
                 {&G.s_pg, "pg"}, {&G.s_seqno, "_get_sequence_number_for_group"}, {&G.s_own_seq, "own_seq"}};
    for (auto& entry : names) {
      if (*entry.slot == nullptr) *entry.slot = PyUnicode_InternFromString(entry.name);
      if (*entry.slot == nullptr) return nullptr;
    }
    G.ready = true;
  }
  for (size_t i = 0; i < n; ++i) Py_XSETREF(*table[i].slot, values[i].release());
  Py_XSETREF(G.queue_append, append.release());
  Py_RETURN_NONE;
}

void free_op(PyObject* capsule) {
  auto* h = static_cast<HotOp*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (h == nullptr) {
    PyErr_Clear();
    return;
  }
  Py_XDECREF(h->orig);
  Py_XDECREF(h->slow);
  Py_XDECREF(h->names);
  Py_XDECREF(h->defaults);
  Py_XDECREF(h->op);
  Py_XDECREF(h->kind);
  delete h;
}

// make_op(orig, slow, names, defaults, op, kind, positions, flags): positions (ig, ia, ir, ip, r0, r1, p0,
// p1), -1 for none; flags (has_root, has_peer, times_n, queued).
PyObject* make_op(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 8 || !PyTuple_Check(argv[2]) || !PyTuple_Check(argv[3]) || !PyTuple_Check(argv[6]) ||
      !PyTuple_Check(argv[7]) || PyTuple_GET_SIZE(argv[6]) != 8 || PyTuple_GET_SIZE(argv[7]) != 4 ||
      PyTuple_GET_SIZE(argv[2]) != PyTuple_GET_SIZE(argv[3]) || PyTuple_GET_SIZE(argv[2]) > kMaxParams) {
    PyErr_SetString(PyExc_TypeError, "make_op(orig, slow, names, defaults, op, kind, positions[8], flags[4])");
    return nullptr;
  }
  if (!G.ready) {
    PyErr_SetString(PyExc_RuntimeError, "setup() first");
    return nullptr;
  }
  int pos[8];
  for (int i = 0; i < 8; ++i) {
    long value = PyLong_AsLong(PyTuple_GET_ITEM(argv[6], i));
    if (value == -1 && PyErr_Occurred()) return nullptr;
    if (value < -1 || value >= PyTuple_GET_SIZE(argv[2])) {
      PyErr_Format(PyExc_ValueError, "make_op: position %ld out of range", value);
      return nullptr;
    }
    pos[i] = int(value);
  }
  if (pos[3] < 0) {
    PyErr_SetString(PyExc_ValueError, "make_op: the tensor's position is needed");
    return nullptr;
  }
  bool flags[4];
  for (int i = 0; i < 4; ++i) {
    int truth = PyObject_IsTrue(PyTuple_GET_ITEM(argv[7], i));
    if (truth < 0) return nullptr;
    flags[i] = truth != 0;
  }
  auto* h = new HotOp{Py_NewRef(argv[0]), Py_NewRef(argv[1]), Py_NewRef(argv[2]), Py_NewRef(argv[3]),
                      Py_NewRef(argv[4]), Py_NewRef(argv[5]), PyTuple_GET_SIZE(argv[2]),
                      pos[0], pos[1], pos[2], pos[3], pos[4], pos[5], pos[6], pos[7],
                      flags[0], flags[1], flags[2], flags[3]};
  PyObject* capsule = PyCapsule_New(h, kCapsule, free_op);
  if (capsule == nullptr) {
    for (PyObject* o : {h->orig, h->slow, h->names, h->defaults, h->op, h->kind}) Py_DECREF(o);
    delete h;
    return nullptr;
  }
  return capsule;
}

PyMethodDef kMethods[] = {
    {"hot_setup", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&setup)), METH_FASTCALL,
     "hot_setup(dict): the Python objects the fast path reads (capture/native_hot.py)."},
    {"hot_op", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&make_op)), METH_FASTCALL,
     "hot_op(orig, slow, names, defaults, op, kind, positions, flags): one wrapped function, as a capsule."},
    {"hot_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call)), METH_FASTCALL,
     "hot_call(op, args, kwargs): the wrapped function called and recorded."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_to(PyObject* module) { return PyModule_AddFunctions(module, kMethods); }

}  // namespace otel_hot
