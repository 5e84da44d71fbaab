// What the native sources share (compiled into one module; a change here changes the build's digest too).
#pragma once
#include <Python.h>

#include <cstdint>

namespace otel_native {

namespace record {  // a record's fields (capture/record.py), in its order
enum : Py_ssize_t {
  kOp, kKind, kSource, kGroup, kSeq, kTStart, kTEnd, kNbytes, kDtype, kShapes, kNumel, kNtensors, kAsync, kRoot,
  kPeer, kRedop, kEnd, kError, kParent, kExtra, kGpuNs, kInner, kCtx, kBwd, kStepCtx, kFields
};
}  // namespace record

int64_t now_ns();  // timed_group.cpp: time.perf_counter_ns()'s clock

struct Ref {  // an owned reference
  PyObject* p;
  explicit Ref(PyObject* o = nullptr) : p(o) {}
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* release() {
    PyObject* o = p;
    p = nullptr;
    return o;
  }
};

// The exception being raised, normalized, as (type, value, traceback) owned by the caller.
struct Raised {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  Raised() {
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != nullptr && value != nullptr) PyException_SetTraceback(value, tb);
  }
  void restore() {  // hands the references back to the interpreter
    PyErr_Restore(type, value, tb);
    type = value = tb = nullptr;
  }
  ~Raised() {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
};

}  // namespace otel_native
